"""The README is the front door: short, the two commands first, every link into the book alive.

What it used to carry (the settings table among it) is in the book: the settings reference,
generated from `bridge.settings.Settings`, must list every setting with its default.
"""

import re
from pathlib import Path

from bridge.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETTINGS_PAGE = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")


def test_readme_is_short_and_starts_with_make_demo_and_make_test() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    head = "\n".join(lines[:60])
    assert "make demo" in head and "make test" in head


def test_readme_links_into_the_book_resolve() -> None:
    targets = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)(?:#[^)]*)?\)", README)
    assert len(targets) > 20, targets
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, missing


def test_readme_names_each_install_way_and_the_owner_rule() -> None:
    for command in (
        "kubectl apply -k deploy/",
        "clusterctl init --ipam bridge",
        "helm install ipam-bridge deploy/helm/ipam-bridge",
        "HostnameTaken",
        "hostnameSuffix",
    ):
        assert command in README, command


def _shown(value: str) -> str:
    """The default as the settings page shows it, as a comparable string."""
    value = value.strip('"')
    try:
        return repr(float(value))
    except ValueError:
        return value.lower()


def test_the_settings_reference_documents_every_setting_with_its_default() -> None:
    rows = dict(
        re.findall(r"^\| `(IPAM_BRIDGE_[A-Z_]+)` \| [^|]+ \| `([^`]*)`", SETTINGS_PAGE, re.M)
    )
    expected = {
        f"IPAM_BRIDGE_{name.upper()}": field.default
        for name, field in Settings.model_fields.items()
    }
    assert set(rows) == set(expected)
    for variable, default in expected.items():
        assert _shown(rows[variable]) == _shown(str(default)), variable
