"""``pip install '.[demo]'`` then ``ipam-bridge demo``: the wheel carries all the demo needs.

The wheel is built offline from a copy of the source tree (``pip wheel --no-deps
--no-build-isolation``, with the setuptools of the test environment), installed with
``--no-deps`` into a fresh venv whose only other packages are those of this environment
(the operator's and the ``demo`` extra's), and run from a directory outside the checkout, so
nothing can come from the source tree.
"""

from __future__ import annotations

import os
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

# What `git` would not ship either, and what an earlier build left behind.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "out", "*.egg-info", "__pycache__", ".*_cache", "tests"
)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
        ],
        cwd=work,
        timeout=120,
    )
    (built,) = (work / "dist").glob("ipam_bridge-*.whl")
    return built


def test_the_wheel_carries_the_crds_and_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    crds = sorted(p.relative_to(CRDS).as_posix() for p in CRDS.rglob("*.yaml"))
    assert crds, "no CRD in the checkout"
    for crd in crds:
        assert f"bridge/crds/{crd}" in names, crd
        packaged = zipfile.ZipFile(wheel).read(f"bridge/crds/{crd}")
        assert packaged == (CRDS / crd).read_bytes(), f"{crd} differs from crds/{crd}"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    for package in packages:
        for module in (REPO / package).rglob("*.py"):
            relative = module.relative_to(REPO).as_posix()
            assert relative in names, f"{relative} is not in the wheel"


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
    assert not any(r.startswith(("kmock", "jsonpatch")) for r in runtime)
    assert any(r.startswith("jsonpatch") for r in demo)


def test_installed_wheel_runs_the_demo_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=tmp_path,
    ).stdout.strip()
    # The runtime dependencies come from this environment's site-packages as a plain path:
    # its .pth files (the editable install's finder, which maps `bridge` to the checkout)
    # are not processed, so `bridge` can only come from the wheel.
    Path(site, "runtime-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "KUBECONFIG") and not key.startswith("IPAM_BRIDGE_")
    }
    origin = _run(
        [str(python), "-c", "import bridge, mock_kubernetes; print(bridge.__file__)"],
        cwd=outside,
        env=env,
    ).stdout.strip()
    assert Path(origin).is_relative_to(venv), origin

    demo = _run(
        [str(venv / "bin" / "ipam-bridge"), "demo", "--claims", "2"],
        cwd=outside,
        env=env,
        timeout=90,
    )
    out = demo.stdout
    assert "10.20.0.2" in out and "10.20.0.3" in out, out + demo.stderr
