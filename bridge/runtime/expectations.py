"""Expectations: a reconcile never acts on a store older than its own last write.

kube-controller-manager's ``ControllerExpectations``
(https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/controller_utils.go),
keyed by resourceVersion (compared for equality only): after our write of key K was answered
with version V (`Expectations.wrote`), the reconcile of K parks under `Expectations.token`
while `Expectations.pending`, and the watch event of V (`Expectations.observed`, which tells
it is ours) wakes it. A deletion of ours (version `GONE`) is met by the DELETED event. A
record lapses after ``timeout`` seconds (the watch is down, or the event came before the
answer and a later one since): the reconcile then acts on the store, its writes still guarded
by resourceVersion preconditions. Thread-safe: workers write, informers' threads observe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["EXPECT_SECONDS", "GONE", "Expectations"]

#: Seconds an expectation waits for its watch event at most (then the reconcile acts).
EXPECT_SECONDS: Final = 5.0
#: The version that stands for a deletion (`Expectations.wrote`, `Expectations.observed`).
GONE: Final = ""

log = logging.getLogger(__name__)


class Expectations:
    """The versions our writes answered, until their watch events come.

    Parameters
    ----------
    timeout:
        Seconds a record is kept (`EXPECT_SECONDS`).
    clock:
        Monotonic seconds.
    """

    def __init__(
        self, timeout: float = EXPECT_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._written: OrderedDict[tuple[Hashable, str], float] = OrderedDict()
        self._observed: OrderedDict[tuple[Hashable, str], float] = OrderedDict()
        self._pending: OrderedDict[Hashable, tuple[str, float]] = OrderedDict()

    @staticmethod
    def token(key: Hashable) -> Hashable:
        """Return the work queue's wake token of the expectation of ``key``."""
        return ("expectation", key)

    def wrote(self, key: Hashable, version: str) -> None:
        """Record that our write of ``key`` was answered with ``version`` (`GONE`: deleted).

        The reconcile of ``key`` then waits (`pending`) until the watch tells of that
        version, unless it told already (its event came before the answer).
        """
        now = self._clock()
        with self._lock:
            self._lapse(now)
            self._written[(key, version)] = now
            self._written.move_to_end((key, version))
            self._pending.pop(key, None)
            if (key, version) not in self._observed:
                self._pending[key] = (version, now)
        log.debug("wrote %s: version %s", key, version or "gone")

    def observed(self, key: Hashable, version: str, *, deleted: bool = False) -> bool:
        """Record a watch event (or a list's sight) of ``key``; True when it is our write's.

        ``deleted``: a DELETED event (or an object a relist found gone), which meets any
        expectation of ``key``: nothing later will come of that object.
        """
        seen = GONE if deleted else version
        now = self._clock()
        with self._lock:
            self._lapse(now)
            self._observed[(key, seen)] = now
            self._observed.move_to_end((key, seen))
            pending = self._pending.get(key)
            if pending is not None and (deleted or pending[0] == seen):
                del self._pending[key]
            ours = (key, seen) in self._written
        log.debug("observed %s: version %s%s", key, seen or "gone", " (ours)" if ours else "")
        return ours

    def ours(self, key: Hashable, version: str, *, deleted: bool = False) -> bool:
        """Tell whether ``version`` of ``key`` (``deleted``: its deletion) was our write's."""
        with self._lock:
            return (key, GONE if deleted else version) in self._written

    def pending(self, key: Hashable, current: str | None = None) -> float:
        """Return the seconds the reconcile of ``key`` should still wait (0.0: none).

        ``current``: the version the store holds now; the one expected met the wait (a
        write that changed nothing answers the version stored, and no event comes of it).
        """
        now = self._clock()
        with self._lock:
            found = self._pending.get(key)
            if found is None:
                return 0.0
            left = found[1] + self._timeout - now
            if left <= 0 or found[0] == current:
                del self._pending[key]
                return 0.0
            return left

    def __len__(self) -> int:
        """Return how many records are kept (bounded memory)."""
        with self._lock:
            return len(self._written) + len(self._observed) + len(self._pending)

    def _lapse(self, now: float) -> None:
        """Drop the records older than the timeout (lock held)."""
        limit = now - self._timeout
        for records in (self._written, self._observed):
            while records and next(iter(records.values())) < limit:
                records.popitem(last=False)
        while self._pending and next(iter(self._pending.values()))[1] < limit:
            self._pending.popitem(last=False)
