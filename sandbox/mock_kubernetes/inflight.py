"""DELETEs in flight: a window between a DELETE's read of an object and its commit.

kube-apiserver decides how to delete an object from what it read
(``staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go``, ``Store.Delete``:
no finalizers and no grace period means "delete immediately"); the storage layer then removes
the object (``storage/etcd3/store.go``, ``conditionalDelete``), checking again only the
DELETE's preconditions (uid, resourceVersion) against the object as it is by then, not the
decision. A finalizer added by a PATCH committed between the read and the commit (answered
200, with the finalizer) is thus lost with the object, and the DELETE answers ``200`` with a
``Status`` ``Success`` (``shared/reference/real-cluster.md`` 13e: 3 of 150 quick deletes of
one storm, 30-80 ms apart).

`DeletesInFlight` (``emulator.handler.deletes``) opens such a window on DELETEs of a chosen
resource, for the emulator's HTTP face and for `EmulatedKubernetes.delete` alike: a DELETE
that finds the object without finalizers (and not being deleted) waits ``seconds`` (or,
with no ``seconds``, until `DeletesInFlight.release`) before it commits. Off by default.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["DeletesInFlight"]

#: How often a gated DELETE looks whether it was released (seconds).
_POLL_SECONDS = 0.01


class DeletesInFlight:
    """The window of DELETEs between their read and their commit; callable from any thread.

    Examples
    --------
    >>> kube.handler.deletes.open(0.1, resource="ipaddressclaims")  # doctest: +SKIP
    >>> kube.handler.deletes.open(resource="widgets")  # held until release()  # doctest: +SKIP

    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._seconds: float | None = None
        self._resource: str | None = None
        self._waiting = 0
        self._released = 0  # release() calls so far: a gated DELETE goes on at the next one

    def open(self, seconds: float | None = None, *, resource: str | None = None) -> None:
        """Open the window for DELETEs from now on.

        Parameters
        ----------
        seconds : float or None
            How long a DELETE waits between its read and its commit; ``None``: until the next
            `release` (or `close`), for a test that drives the race step by step.
        resource : str or None
            The plural the window applies to (e.g. ``ipaddressclaims``); ``None``: every
            resource (Namespaces excepted: their deletion is the namespace controller's).

        Raises
        ------
        ValueError
            If ``seconds`` is negative.
        """
        if seconds is not None and seconds < 0:
            raise ValueError(f"seconds must not be negative, not {seconds}")
        with self._lock:
            self._open, self._seconds, self._resource = True, seconds, resource

    def close(self) -> None:
        """Close the window: DELETEs commit at once again, those waiting commit now."""
        with self._lock:
            self._open = False
            self._released += 1

    def release(self) -> None:
        """Let every DELETE waiting for a release (``seconds=None``) commit now."""
        with self._lock:
            self._released += 1

    def applies(self, plural: str) -> bool:
        """Return whether a DELETE of ``plural`` gets the window now."""
        with self._lock:
            return self._open and (self._resource is None or self._resource == plural)

    @property
    def waiting(self) -> int:
        """How many DELETEs have read their object and not committed yet."""
        with self._lock:
            return self._waiting

    async def wait(self) -> None:
        """Wait out the window of one DELETE that has read its object (on the server's loop)."""
        with self._lock:
            seconds, released = self._seconds, self._released
            self._waiting += 1
        try:
            if seconds is not None:
                await asyncio.sleep(seconds)
                return
            while True:
                with self._lock:
                    if self._released != released:
                        return
                await asyncio.sleep(_POLL_SECONDS)
        finally:
            with self._lock:
                self._waiting -= 1
