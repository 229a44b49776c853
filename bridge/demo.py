"""``ipam-bridge demo``: the whole flow on one machine, with no cluster and no IPAM.

The demo runs the real operator against the in-memory Kubernetes API and a mock IPAM
(``mock_kubernetes.demo``: what it shows is described there). Those are the sandbox, a
distribution of their own (``ipam-bridge-sandbox``, of the same version) that the ``demo``
extra requires (``pip install 'ipam-bridge[demo]'``), not the operator, so this module imports
them when the command runs and nowhere else: the only import of the sandbox in ``bridge``
(``docs/architecture.md``).
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["DEMO_EXTRA", "SANDBOX_MODULES", "run_demo"]

#: The command that installs what the demo needs.
DEMO_EXTRA = "pip install 'ipam-bridge[demo]'"
#: Top-level modules of the ``demo`` extra: the sandbox's packages and their own dependencies.
SANDBOX_MODULES = frozenset(
    {"mock_kubernetes", "mock_phpipam", "mock_infoblox", "aiohttp", "jsonpatch", "jsonpointer"}
)


def run_demo(*, claims: int = 10, backend: str = "phpipam", err: TextIO | None = None) -> int:
    """Run the demo (``mock_kubernetes.demo.run_demo``); return the exit code.

    Parameters
    ----------
    claims : int
        How many IPAddressClaims to create.
    backend : str
        ``phpipam`` or ``infoblox``: which mock IPAM the pools point at.
    err : TextIO, optional
        Where the missing-extra message goes (default ``sys.stderr``).

    Returns
    -------
    int
        0 when every step did what it should, 1 when one did not, 2 when the ``demo`` extra
        is not installed (one line on ``err`` naming the missing module and
        ``pip install 'ipam-bridge[demo]'``).

    Raises
    ------
    ImportError
        When a module outside :data:`SANDBOX_MODULES` fails to import (a broken install).

    """
    try:
        from mock_kubernetes.demo import run_demo as run_sandbox_demo
    except ImportError as e:
        if (e.name or "").partition(".")[0] not in SANDBOX_MODULES:
            raise
        print(
            f"ipam-bridge demo: {e.name} is not installed; the demo needs the demo extra: "
            f"{DEMO_EXTRA}",
            file=err or sys.stderr,
        )
        return 2
    return run_sandbox_demo(claims=claims, backend=backend)
