"""A silent network between the clients and the emulated API server: nothing gets through.

A blackhole (a frozen peer, a middlebox that drops packets, a dropped conntrack entry):
connections stay open, no byte arrives, no error is seen. The emulated API server
(`mock_kubernetes.emulator.KubeEmulator`) asks `Silence.admit` about every request and
`Silence.silenced` about every watch stream before each line it sends:

- while silent, a new request is held (never answered) until the heal, or until the
  client gives up and closes its connection;
- a watch stream opened before the silence began sends nothing more, ever: its
  connection stays open, silent, until the client closes it (the heal does not bring it
  back: after a blackhole, a TCP connection whose state a middlebox dropped stays dead).
  Only a client that gives up on the silent socket (its read timeout) and connects again
  sees events again.

Every client is affected alike (the test harness's own calls on the store are not HTTP).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["Silence"]

#: How often a held request or a silent stream looks whether its client went away (seconds).
_POLL_SECONDS = 0.05


class Silence:
    """Whether the network is silent; `begin` and `heal` may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._silent = False
        self._epoch = 0

    def begin(self) -> None:
        """Go silent from now on: open watch streams send nothing more, new requests hang."""
        with self._lock:
            self._silent = True
            self._epoch += 1

    def heal(self) -> None:
        """End the silence: held and new requests are served (silenced streams stay silent)."""
        with self._lock:
            self._silent = False

    @property
    def silent(self) -> bool:
        """True while the network is silent."""
        with self._lock:
            return self._silent

    @property
    def epoch(self) -> int:
        """How many silences began: a stream opened at an older epoch was silenced."""
        with self._lock:
            return self._epoch

    async def admit(self, raw_request: Any) -> None:
        """Return when the request may be served: at once, or after the heal.

        A request held while silent waits until the heal; a client that gives up closes
        its connection, and the hold ends with it (`hold_open`).
        """
        while self.silent:
            if _gone(raw_request):
                await asyncio.Event().wait()  # cancelled with the connection, or the server
            await asyncio.sleep(_POLL_SECONDS)

    def silenced(self, epoch: int) -> bool:
        """Whether a stream opened at ``epoch`` (`epoch` then) was silenced for good."""
        return self.epoch != epoch

    @staticmethod
    async def hold_open(raw_request: Any) -> None:
        """Keep a silenced connection open, sending nothing, until the client closes it."""
        while not _gone(raw_request):
            await asyncio.sleep(_POLL_SECONDS)


def _gone(raw_request: Any) -> bool:
    """Whether the client closed the request's connection."""
    transport = raw_request.transport
    return transport is None or transport.is_closing()
