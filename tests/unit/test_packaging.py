"""The operator is the product, the sandbox is not.

``pip install ipam-bridge`` brings the operator's dependencies only; the in-memory Kubernetes
API and the IPAM mocks (``mock_kubernetes``, ``mock_phpipam``, ``mock_infoblox``) and what
they need come with the ``demo`` extra, which the ``test`` extra includes; ``bridge`` imports
none of them, but for the ``demo`` command, which says what to install when they are missing;
the image installs ``bridge`` and ``backends`` only.
"""

from __future__ import annotations

import ast
import io
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from bridge import cli, demo

REPO = Path(__file__).resolve().parents[2]
SANDBOX_PACKAGES = ("mock_kubernetes", "mock_phpipam", "mock_infoblox")
#: Distributions only the sandbox needs (kmock: what mock_kubernetes must not come back to).
DEMO_ONLY = ("aiohttp", "jsonpatch", "jsonpointer", "kmock", "attrs")
#: The one place of `bridge` that imports the sandbox: the demo command, when it runs.
DEMO_ENTRY = ("bridge/demo.py", "run_demo")

IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "out", "*.egg-info", "__pycache__", ".*_cache", "tests"
)


def _requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0].strip()
    for separator in "[<>=!~ ":
        name = name.split(separator)[0]
    return name.lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel_requirements(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``Requires-Dist`` of the wheel built offline from a copy of the source tree."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, work / "src", ignore=IGNORED, symlinks=True)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--quiet", "--wheel-dir", str(work / "dist"), str(work / "src")),
        ],
        cwd=work,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (built,) = (work / "dist").glob("ipam_bridge-*.whl")
    archive = zipfile.ZipFile(built)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    return [
        line.removeprefix("Requires-Dist: ")
        for line in archive.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]


def test_a_plain_install_requires_none_of_the_demo_only_packages(
    wheel_requirements: list[str],
) -> None:
    plain = {_requirement_name(r) for r in wheel_requirements if "extra ==" not in r}
    assert plain == {
        "kopf",
        "kubernetes",
        "requests",
        "tenacity",
        "pydantic",
        "pydantic-settings",
        "pyyaml",
        "prometheus-client",
    }
    assert not plain & set(DEMO_ONLY)
    demo_extra = {_requirement_name(r) for r in wheel_requirements if r.endswith('extra == "demo"')}
    assert {"aiohttp", "jsonpatch", "jsonpointer"} <= demo_extra
    assert "kmock" not in demo_extra
    test_extra = [r for r in wheel_requirements if r.endswith('extra == "test"')]
    assert any(r.startswith("ipam-bridge[demo]") for r in test_extra), test_extra


def _sandbox_imports(path: Path) -> list[tuple[str, str]]:
    """Return ``(enclosing function or "<module>", module)`` of every sandbox import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                if name.partition(".")[0] in (*SANDBOX_PACKAGES, "kmock"):
                    found.append((where, name))
            inner = (
                child.name
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and where == "<module>"
                else where
            )
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_bridge_imports_nothing_of_the_sandbox_but_in_the_demo_command() -> None:
    modules = sorted((REPO / "bridge").rglob("*.py"))
    assert len(modules) > 20
    imports = {
        (module.relative_to(REPO).as_posix(), where, name)
        for module in modules
        for where, name in _sandbox_imports(module)
    }
    assert imports == {(*DEMO_ENTRY, "mock_kubernetes.demo")}


_BLOCK_SANDBOX = textwrap.dedent(
    """
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        # As if the demo extra were not installed: its packages cannot be imported.
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    """
)


def _run_without(blocked: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    script = _BLOCK_SANDBOX.format(blocked=set(blocked)) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_bridge_module_imports_without_the_demo_extra() -> None:
    # aiohttp, jsonpatch and jsonpointer are kopf's dependencies too: they stay.
    result = _run_without(
        (*SANDBOX_PACKAGES, "kmock"),
        """
        import importlib, pkgutil, bridge
        names = [m.name for m in pkgutil.walk_packages(bridge.__path__, "bridge.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 20


def test_demo_without_the_sandbox_exits_2_and_says_what_to_install() -> None:
    # As in the image, which installs bridge and backends only.
    result = _run_without(
        SANDBOX_PACKAGES,
        """
        from bridge.cli import main
        sys.exit(main(["demo", "--claims", "1"]))
        """,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'ipam-bridge[demo]'" in result.stderr
    assert "mock_kubernetes is not installed" in result.stderr
    assert result.stdout == ""


def test_demo_command_exits_2_when_the_sandbox_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "mock_kubernetes.demo", None)
    assert cli.main(["demo", "--claims", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (
        "ipam-bridge demo: mock_kubernetes.demo is not installed; the demo needs the demo "
        "extra: pip install 'ipam-bridge[demo]'"
    )


def test_demo_command_does_not_hide_other_import_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    # A module of the operator that fails to import is a broken install, not a missing extra.
    monkeypatch.setitem(sys.modules, "mock_kubernetes.demo", None)
    monkeypatch.setattr(demo, "SANDBOX_MODULES", frozenset({"something-else"}))
    err = io.StringIO()
    with pytest.raises(ImportError):
        demo.run_demo(claims=1, err=err)
    assert err.getvalue() == ""


def test_the_demo_extra_is_what_make_demo_installs() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    install = next(line for line in makefile.splitlines() if "pip install" in line and "-e" in line)
    assert "demo" in install.split("-e", 1)[1]
    assert "\ndemo: $(STAMP)" in makefile
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert "ipam-bridge[demo]" in extras["test"]


def _dockerfile_copies(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    sources: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not words[1].startswith("--from"):
            sources.extend(word.rstrip("*") for word in words[1:-1])
    return sources


def test_the_image_installs_bridge_and_backends_only() -> None:
    sources = _dockerfile_copies(REPO / "Dockerfile")
    packages = [s for s in sources if (REPO / s).is_dir() and (REPO / s / "__init__.py").exists()]
    assert sorted(packages) == ["backends", "bridge"]
    assert not [s for s in sources if s.startswith(SANDBOX_PACKAGES)]
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert "rm -f /opt/venv/bin/mock-phpipam" in dockerfile
