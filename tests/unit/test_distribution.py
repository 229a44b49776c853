"""The operator is the product, the sandbox is not.

``pip install ipam-bridge`` brings ``bridge``, ``backends`` and the operator's dependencies
only; the in-memory Kubernetes API and the IPAM mocks (``mock_kubernetes``, ``mock_phpipam``,
``mock_infoblox``) are a distribution of their own, ``ipam-bridge-sandbox`` (``sandbox/``, the
same version), which brings what they need and which the ``demo`` extra requires (the ``test``
extra includes it); ``bridge`` imports none of them, but for the ``demo`` command, which says
what to install when they are missing; the image installs ``bridge`` and ``backends`` only.
"""

from __future__ import annotations

import ast
import configparser
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
SANDBOX = REPO / "sandbox"
SANDBOX_PACKAGES = ("mock_kubernetes", "mock_phpipam", "mock_infoblox")
#: The operator's runtime requirements (names).
OPERATOR_REQUIREMENTS = {
    "kopf",
    "kubernetes",
    "urllib3",
    "requests",
    "tenacity",
    "pydantic",
    "pydantic-settings",
    "pyyaml",
    "prometheus-client",
}
#: Distributions only the demo needs: the sandbox and its own (kmock: what mock_kubernetes must
#: not come back to).
DEMO_ONLY = ("ipam-bridge-sandbox", "aiohttp", "jsonpatch", "jsonpointer", "kmock", "attrs")
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


def _version(pyproject: Path) -> str:
    return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    """Both wheels, ``ipam-bridge`` and ``ipam-bridge-sandbox``, built offline from a copy."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, work / "src", ignore=IGNORED, symlinks=True)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--quiet", "--wheel-dir", str(work / "dist")),
            *(str(work / "src"), str(work / "src" / "sandbox")),
        ],
        cwd=work,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (operator,) = (work / "dist").glob("ipam_bridge-*.whl")
    (sandbox,) = (work / "dist").glob("ipam_bridge_sandbox-*.whl")
    return {
        "ipam-bridge": zipfile.ZipFile(operator),
        "ipam-bridge-sandbox": zipfile.ZipFile(sandbox),
    }


def _dist_info(archive: zipfile.ZipFile, name: str) -> str:
    (found,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
    return archive.read(found).decode()


def _requires(archive: zipfile.ZipFile) -> list[str]:
    return [
        line.removeprefix("Requires-Dist: ")
        for line in _dist_info(archive, "METADATA").splitlines()
        if line.startswith("Requires-Dist: ")
    ]


def _console_scripts(archive: zipfile.ZipFile) -> dict[str, str]:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(archive, "entry_points.txt"))
    return dict(entry_points["console_scripts"])


@pytest.fixture(scope="module")
def wheel_requirements(wheels: dict[str, zipfile.ZipFile]) -> list[str]:
    """``Requires-Dist`` of the ``ipam-bridge`` wheel."""
    return _requires(wheels["ipam-bridge"])


def test_a_plain_install_requires_none_of_the_demo_only_packages(
    wheel_requirements: list[str], wheels: dict[str, zipfile.ZipFile]
) -> None:
    plain = {_requirement_name(r) for r in wheel_requirements if "extra ==" not in r}
    assert plain == OPERATOR_REQUIREMENTS
    assert not plain & set(DEMO_ONLY)
    # The demo extra is the sandbox distribution of the same version; its requirements are
    # the mocks' (aiohttp, jsonpatch, jsonpointer), never kmock.
    version = _version(REPO / "pyproject.toml")
    demo_extra = [r.split(";")[0].strip() for r in wheel_requirements if r.endswith('"demo"')]
    assert demo_extra == [f"ipam-bridge-sandbox=={version}"]
    sandbox = {_requirement_name(r) for r in _requires(wheels["ipam-bridge-sandbox"])}
    assert {"aiohttp", "jsonpatch", "jsonpointer"} <= sandbox
    assert "kmock" not in sandbox
    test_extra = [r for r in wheel_requirements if r.endswith('extra == "test"')]
    assert any(r.startswith("ipam-bridge[demo]") for r in test_extra), test_extra


def test_the_operator_wheel_carries_bridge_and_backends_only(
    wheels: dict[str, zipfile.ZipFile],
) -> None:
    archive = wheels["ipam-bridge"]
    version = _version(REPO / "pyproject.toml")
    top = {name.split("/")[0] for name in archive.namelist()}
    assert top == {"bridge", "backends", f"ipam_bridge-{version}.dist-info"}
    assert not [n for n in archive.namelist() if "mock_" in n or n.startswith("sandbox/")]
    assert _console_scripts(archive) == {"ipam-bridge": "bridge.cli:main"}


def test_the_sandbox_wheel_carries_the_mocks_with_their_requirements(
    wheels: dict[str, zipfile.ZipFile],
) -> None:
    archive = wheels["ipam-bridge-sandbox"]
    version = _version(SANDBOX / "pyproject.toml")
    assert version == _version(REPO / "pyproject.toml")
    names = set(archive.namelist())
    assert {n.split("/")[0] for n in names} == {
        *SANDBOX_PACKAGES,
        f"ipam_bridge_sandbox-{version}.dist-info",
    }
    for package in SANDBOX_PACKAGES:
        for path in (SANDBOX / package).rglob("*"):
            relative = path.relative_to(SANDBOX).as_posix()
            if path.suffix in (".py", ".json") or path.name in ("py.typed", "seed.example.yaml"):
                assert relative in names, f"{relative} is not in the sandbox wheel"
    requires = {r.split(";")[0].strip() for r in _requires(archive)}
    assert requires == {
        f"ipam-bridge=={version}",
        "aiohttp<4,>=3.10",
        "jsonpatch>=1.33",
        "jsonpointer>=2.4",
        "pydantic<3,>=2.10",
        "pyyaml>=6",
    }
    assert _console_scripts(archive) == {"mock-phpipam": "mock_phpipam.__main__:main"}


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
    # The sandbox is not on PyPI: `make install` installs it from the checkout in the same
    # resolver run as the operator with its demo extra, the operator first (pip 23.2.1, which
    # Python 3.11 ships, fails the other order: "No matching distribution found for
    # ipam-bridge==0.1.0 (from ipam-bridge-sandbox)").
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    install = next(line for line in makefile.splitlines() if "pip install" in line and "-e" in line)
    editables = install.split("-e")[1:]
    assert "demo" in editables[0], install
    assert editables[1].strip() == "./sandbox", install
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
    assert not [s for s in sources if s.startswith((*SANDBOX_PACKAGES, "sandbox"))]
    # The build fails when a sandbox package can be imported or its console script exists.
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    check = next(line for line in dockerfile.splitlines() if "find_spec" in line)
    assert all(package in check for package in SANDBOX_PACKAGES)
    assert "shutil.which('mock-phpipam') is not None" in check


@pytest.mark.parametrize("doc", ["README.md", "sandbox/README.md"])
def test_the_documented_checkout_install_puts_the_operator_first(doc: str) -> None:
    # What a newcomer copies: the form that the pip Python 3.11 ships (23.2.1) resolves.
    text = " ".join((REPO / doc).read_text(encoding="utf-8").split())
    assert "-e ./sandbox -e" not in text, doc
    assert "pip install -e '.[demo]' -e ./sandbox" in text, doc
