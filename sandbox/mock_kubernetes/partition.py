"""A network partition of one client identity: its requests hang or are refused.

The emulated API server (`mock_kubernetes.emulator.KubeEmulator`) asks `Partition.admit`
about every authenticated request before serving it. A cut identity (one replica of the
operator: its bearer token) is then cut off while every other client goes on:

- ``hang``: the request is accepted and never answered (a blackholed route: the client's
  timeout is its only way out), until the partition heals or the client gives up;
- ``refuse``: the connection is closed without an answer (a reset: the client sees a
  connection error at once).

Requests already being served when the cut begins (a watch stream that is open) go on; a
real partition would stall them too, but a replica cut off from new requests can renew
nothing and write nothing, which is what a partition test exercises.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

from mock_kubernetes.auth import Identity

__all__ = ["Partition"]

Mode = Literal["hang", "refuse"]
#: How often a hung request looks whether the partition healed (seconds).
_POLL_SECONDS = 0.05


class Partition:
    """Which identities are cut off, and how; `cut` and `heal` may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cut: dict[str, Mode] = {}

    def cut(self, identity: Identity, mode: Mode = "hang") -> None:
        """Cut ``identity`` off from now on: its new requests hang or are refused."""
        with self._lock:
            self._cut[identity.token] = mode

    def heal(self, identity: Identity | None = None) -> None:
        """End the cut of ``identity`` (None: of every identity); hung requests then go on."""
        with self._lock:
            if identity is None:
                self._cut.clear()
            else:
                self._cut.pop(identity.token, None)

    def mode(self, identity: Identity) -> Mode | None:
        """Return how ``identity`` is cut off, or None when it is not."""
        with self._lock:
            return self._cut.get(identity.token)

    async def admit(self, identity: Identity, raw_request: Any) -> None:
        """Return when ``identity``'s request may be served.

        A ``hang`` cut waits until it heals (or the client disconnects: aiohttp then cancels
        the handler). A ``refuse`` cut closes the request's connection and waits for that
        cancellation.
        """
        while (mode := self.mode(identity)) is not None:
            if mode == "refuse":
                raw_request.transport.close()
                await asyncio.Event().wait()  # cancelled: the connection is gone
            await asyncio.sleep(_POLL_SECONDS)
