"""Both wheels, installed: ``ipam-bridge`` alone is the operator, with the sandbox it runs the demo.

The wheels (``ipam-bridge`` from the checkout, ``ipam-bridge-sandbox`` from ``sandbox/``) are
built offline from a copy of the source tree (``pip wheel --no-deps --no-build-isolation``,
with the setuptools of the test environment) and installed with ``--no-deps`` into fresh venvs
whose only other packages are those of this environment's site-packages, read as a plain path:
their ``.pth`` files (the editable installs' finders, which map ``bridge`` and the mocks to the
checkout) are not processed, so ``bridge`` comes from the wheel only and the mocks from the
sandbox wheel only, or from nowhere. Everything runs from a directory outside the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
SANDBOX = REPO / "sandbox"

# What `git` would not ship either, and what an earlier build left behind.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "out", "*.egg-info", "__pycache__", ".*_cache", "tests"
)


def _run(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"ipam-bridge": wheel, "ipam-bridge-sandbox": wheel}``, built offline."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=IGNORED, symlinks=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--wheel-dir",
            str(work / "dist"),
            str(source),
            str(source / "sandbox"),
        ],
        cwd=work,
        timeout=120,
    )
    (operator,) = (work / "dist").glob("ipam_bridge-*.whl")
    (sandbox,) = (work / "dist").glob("ipam_bridge_sandbox-*.whl")
    return {"ipam-bridge": operator, "ipam-bridge-sandbox": sandbox}


@pytest.fixture(scope="module")
def wheel(wheels: dict[str, Path]) -> Path:
    """The operator's wheel."""
    return wheels["ipam-bridge"]


def _packages(pyproject: Path) -> list[str]:
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]


def test_the_wheel_carries_the_crds_and_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    crds = sorted(p.relative_to(CRDS).as_posix() for p in CRDS.rglob("*.yaml"))
    assert crds, "no CRD in the checkout"
    for crd in crds:
        assert f"bridge/crds/{crd}" in names, crd
        packaged = zipfile.ZipFile(wheel).read(f"bridge/crds/{crd}")
        assert packaged == (CRDS / crd).read_bytes(), f"{crd} differs from crds/{crd}"
    packages = _packages(REPO / "pyproject.toml")
    assert sorted(packages) == ["backends", "bridge"]
    for package in packages:
        for module in (REPO / package).rglob("*.py"):
            relative = module.relative_to(REPO).as_posix()
            assert relative in names, f"{relative} is not in the wheel"


def test_the_sandbox_wheel_carries_every_module_of_the_mocks(wheels: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(wheels["ipam-bridge-sandbox"]).namelist())
    packages = _packages(SANDBOX / "pyproject.toml")
    assert sorted(packages) == ["mock_infoblox", "mock_kubernetes", "mock_phpipam"]
    for package in packages:
        for module in (SANDBOX / package).rglob("*.py"):
            relative = module.relative_to(SANDBOX).as_posix()
            assert relative in names, f"{relative} is not in the sandbox wheel"


def test_wheel_metadata_puts_the_demo_dependencies_in_the_demo_extra(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in archive.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    runtime = {r.split(";")[0].strip() for r in requires if "extra ==" not in r}
    demo = {r.split(";")[0].strip() for r in requires if r.endswith('extra == "demo"')}
    assert not any(r.startswith(("kmock", "jsonpatch", "aiohttp", "ipam-bridge")) for r in runtime)
    assert any(r.startswith("ipam-bridge-sandbox==") for r in demo)


def _venv(tmp_path: Path, *wheels: Path) -> Path:
    """Return a fresh venv with ``wheels`` installed and this environment's site as a path."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=tmp_path,
    ).stdout.strip()
    # The runtime dependencies come from this environment's site-packages as a plain path:
    # its .pth files (the editable installs' finders, which map `bridge` and the mocks to the
    # checkout) are not processed, so `bridge` and the mocks can only come from the wheels.
    Path(site, "runtime-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    _run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install"),
            *("--quiet", "--no-deps", "--no-index", *map(str, wheels)),
        ],
        cwd=tmp_path,
    )
    return venv


def _outside(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Return a directory outside the checkout and an environment without our settings."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "KUBECONFIG") and not key.startswith("IPAM_BRIDGE_")
    }
    return outside, env


def test_installed_wheel_runs_the_demo_outside_the_checkout(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = _venv(tmp_path, wheels["ipam-bridge"], wheels["ipam-bridge-sandbox"])
    outside, env = _outside(tmp_path)
    origin = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import bridge, mock_kubernetes; print(bridge.__file__, mock_kubernetes.__file__)",
        ],
        cwd=outside,
        env=env,
    ).stdout.split()
    assert all(Path(o).is_relative_to(venv) for o in origin), origin
    assert (venv / "bin" / "mock-phpipam").is_file()

    demo = _run(
        [str(venv / "bin" / "ipam-bridge"), "demo", "--claims", "2"],
        cwd=outside,
        env=env,
        timeout=90,
    )
    out = demo.stdout
    assert "10.20.0.2" in out and "10.20.0.3" in out, out + demo.stderr
    # Each IPAM entry names its owner: the demo cluster's identity (a uid) and the claim.
    assert re.search(r"node-00-eth0\.demo +[0-9a-f-]{36} demo/node-00-eth0", out), out


def test_a_plain_install_says_what_to_install_for_the_demo(wheel: Path, tmp_path: Path) -> None:
    # `pip install ipam-bridge`: the operator's wheel and its dependencies, no sandbox.
    venv = _venv(tmp_path, wheel)
    outside, env = _outside(tmp_path)
    python = str(venv / "bin" / "python")
    imported = _run(
        [python, "-c", "import bridge, kopf, aiohttp; print(bridge.__file__)"],
        cwd=outside,
        env=env,
    ).stdout.strip()
    assert Path(imported).is_relative_to(venv), imported
    for package in ("mock_kubernetes", "mock_phpipam", "mock_infoblox"):
        found = _run(
            [python, "-c", f"import importlib.util as u; print(u.find_spec({package!r}))"],
            cwd=outside,
            env=env,
        ).stdout.strip()
        assert found == "None", f"{package} is importable in a plain install: {found}"
    assert not (venv / "bin" / "mock-phpipam").exists()

    demo = _run(
        [str(venv / "bin" / "ipam-bridge"), "demo", "--claims", "1"],
        cwd=outside,
        env=env,
        check=False,
    )
    assert demo.returncode == 2, demo.stdout + demo.stderr
    assert demo.stdout == ""
    assert demo.stderr.strip() == (
        "ipam-bridge demo: mock_kubernetes is not installed; the demo needs the demo extra: "
        "pip install 'ipam-bridge[demo]'"
    )
