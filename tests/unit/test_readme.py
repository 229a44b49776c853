"""The README is the user's manual: it must start with the two commands and list every setting."""

import re
from pathlib import Path

from bridge.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_readme_starts_with_make_demo_and_make_test() -> None:
    head = "\n".join(README.splitlines()[:12])
    assert "make demo" in head and "make test" in head


def test_readme_documents_every_setting_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(IPAM_BRIDGE_[A-Z_]+)` \| `([^`]*)` \|", README, re.MULTILINE))
    expected = {
        f"IPAM_BRIDGE_{name.upper()}": field.default
        for name, field in Settings.model_fields.items()
    }
    assert set(rows) == set(expected)
    for variable, default in expected.items():
        shown = rows[variable].strip('"')
        assert shown.lower() == str(default).lower(), variable
