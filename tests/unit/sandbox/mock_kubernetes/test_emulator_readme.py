"""mock_kubernetes/README.md names the tests that show each semantic: they must exist."""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = (HERE.parents[3] / "sandbox" / "mock_kubernetes" / "README.md").read_text(encoding="utf-8")


def test_every_test_file_and_test_named_in_the_readme_exists() -> None:
    # Files of this folder (`tests/unit/test_crds.py` and the like are named with a path).
    files = set(re.findall(r"(?<![/\w])(test_\w+\.py)", README))
    assert files, "the README names no test file"
    for name in files:
        assert (HERE / name).is_file(), name
    sources = "\n".join((HERE / name).read_text(encoding="utf-8") for name in files)
    defined = set(re.findall(r"^def (test_\w+)", sources, re.MULTILINE))
    named = re.findall(r"::(test_\w+)(\*?)", README)
    assert named
    for name, wildcard in named:
        if wildcard:
            assert any(d.startswith(name) for d in defined), name
        else:
            assert name in defined, name


def test_every_emulator_test_file_is_in_the_readme() -> None:
    for path in HERE.glob("test_emulator_*.py"):
        if path.name != Path(__file__).name:
            assert path.name in README, path.name
