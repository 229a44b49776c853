"""What the reconcilers share: served versions, the work queue, backend clients, notices.

Each reconciler takes a dataclass of what it uses (`bridge.reconcilers.claims.ClaimDeps`,
`bridge.reconcilers.pools.PoolDeps`, `bridge.reconcilers.control_plane.ClusterDeps`); the
pieces they share are defined here: `ServedVersions` (the CAPI versions detected at
start-up), `Queue` (where keys go), `Notices` and `NamespaceLocks`; the
IPAM clients of the pools are `bridge.reconcilers.backend_clients`. Nothing here is
module-global.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "NamespaceLocks",
    "Notices",
    "Queue",
    "ServedVersions",
]

log = logging.getLogger(__name__)

#: A pool's identity: ``(namespace, kind, name)`` (namespace empty for a Global pool).
PoolId = tuple[str, str, str]


@dataclass
class ServedVersions:
    """The CAPI versions the API server serves, detected at start-up.

    Attributes
    ----------
    address:
        The IPAddressClaim/IPAddress version read and written (``v1beta2``/``v1beta1``).
    cluster:
        The served CAPI ``Cluster`` version (``v1beta2`` on CAPI >= 1.11, else ``v1beta1``);
        None when Clusters are not served (no control-plane endpoints).
    v1beta2_kept:
        Whether the served v1beta1 IPAddressClaim schema keeps ``status.v1beta2`` (CAPI
        >= 1.9). None until the first status write of a v1beta1 claim shows it: the API
        server prunes unknown fields and returns what it stored.
    """

    address: str
    cluster: str | None = None
    v1beta2_kept: bool | None = None


class Queue(Protocol):
    """Where reconcilers put keys (`bridge.runtime.workqueue.WorkQueue`, or a test's fake)."""

    def add(self, key: Hashable, after: float = 0.0) -> None:
        """Queue ``key`` to be reconciled after ``after`` seconds."""

    def wake(self, token: Hashable, count: int | None = None) -> int:
        """Queue the keys parked under ``token`` (at most ``count``); return how many."""

    def parked(self, token: Hashable) -> frozenset[Hashable]:
        """Return the keys parked under ``token``."""


class NamespaceLocks:
    """One lock per namespace, for the decisions about that namespace's Secrets.

    Two pools that read one Secret, deleted at once (a namespace deletion), must not each
    see the other and both keep the Secret's finalizer. A namespace's lock lives while a
    thread holds or waits for it (a count under a guard), so namespaces come and go
    without their locks staying behind. Thread-safe.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def holding(self, namespace: str) -> Iterator[None]:
        """Hold the lock of ``namespace`` for the block."""
        with self._guard:
            lock, users = self._locks.get(namespace, (threading.Lock(), 0))
            self._locks[namespace] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[namespace]
                if users > 1:
                    self._locks[namespace] = (lock, users - 1)
                else:
                    del self._locks[namespace]

    def __len__(self) -> int:
        """Return how many namespaces have a lock now."""
        with self._guard:
            return len(self._locks)


class Notices:
    """What was last told about each subject, so that a steady problem is told once.

    A Warning Event repeated on every pass (a Cluster is updated by CAPI's controllers many
    times a minute) would flood the Events of the object; a subject's notice is told again
    only when its message changes, or after `forget`. Kept in memory: after a restart a
    problem still present is told once more. Thread-safe.

    Bounded: at most ``limit`` subjects are remembered, the least recently told forgotten
    first (a subject gone without `forget`, a Cluster deleted while it had a problem, is
    dropped in time; one forgotten while its problem lasts is told once more).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._told: dict[Hashable, str] = {}  # insertion order: least recently told first

    def first(self, subject: Hashable, message: str) -> bool:
        """Record ``message`` for ``subject``; True when it differs from the one told last."""
        with self._lock:
            told = self._told.pop(subject, None)
            self._told[subject] = message
            while len(self._told) > self.limit:
                del self._told[next(iter(self._told))]
            return told != message

    def __len__(self) -> int:
        """Return how many subjects are remembered."""
        with self._lock:
            return len(self._told)

    def forget(self, subject: Hashable) -> None:
        """Drop what was told about ``subject`` (its problem is over, or it is gone)."""
        with self._lock:
            self._told.pop(subject, None)
