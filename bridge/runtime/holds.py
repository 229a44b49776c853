"""Claims about to hold a pool: between their look at it and their finalizer write.

A pool being deleted lets go once nothing holds an entry in it
(`bridge.reconcilers.pools.users_of`: claims carrying ``ReleaseAddress``, IPAddresses). A claim
decides from its pool as cached, then writes that finalizer: between the two it holds the
pool without showing it. `PendingHolds` shows it: a claim registers before it looks at its
pool and leaves after its finalizer write, and the deletion guard counts those registered.
Either the guard sees the claim here (or its finalizer), or the claim's look comes after the
pool's deletion reached the cache (the guard runs on that event) and the claim waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PendingHolds"]

#: A pool's key: ``(namespace, kind, name)``; namespace ``""`` for a Global pool.
PoolKey = tuple[str, str, str]


class PendingHolds:
    """The claims (``namespace/name``) about to hold each pool; thread-safe, bounded.

    An entry lives only while `holding` runs: memory is bounded by the claims in flight.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pool: dict[PoolKey, set[str]] = {}

    @contextmanager
    def holding(self, pool: PoolKey, claim: str) -> Iterator[None]:
        """Count ``claim`` (``namespace/name``) as about to hold ``pool`` while the block runs.

        Whatever the block raises propagates; the claim is no longer counted after it.
        """
        with self._lock:
            self._by_pool.setdefault(pool, set()).add(claim)
        try:
            yield
        finally:
            with self._lock:
                claims = self._by_pool.get(pool, set())
                claims.discard(claim)
                if not claims:
                    self._by_pool.pop(pool, None)

    def of(self, pool: PoolKey) -> list[str]:
        """Return the claims (``namespace/name``, sorted) now about to hold ``pool``."""
        with self._lock:
            return sorted(self._by_pool.get(pool, ()))

    def __len__(self) -> int:
        """Return the number of pools some claim is about to hold."""
        with self._lock:
            return len(self._by_pool)
