"""The operator's run-time context: one object, built at start-up, kept in kopf's memo.

It holds the settings, the Kubernetes gateway, the served CAPI version, one backend client
per pool (reused while the pool's spec and Secret stay the same, so a phpIPAM token is
reused), and the exhaustion gate. Nothing here is module-global.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.base import IPAMBackend
from bridge.kube import Kube
from bridge.metrics import Metrics
from bridge.settings import Settings

__all__ = ["BackendCache", "Context", "ExhaustionGate"]

log = logging.getLogger(__name__)

PoolKey = tuple[str, str, str]


class BackendCache:
    """Backend clients by pool, rebuilt when what they were built from changes.

    Thread-safe: claim and pool handlers of different objects run in parallel threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[PoolKey, tuple[str, IPAMBackend]] = {}

    def get(self, key: PoolKey, fingerprint: str, build: Callable[[], IPAMBackend]) -> IPAMBackend:
        """Return the cached backend of ``key`` if built from ``fingerprint``, else build one.

        Parameters
        ----------
        key:
            ``(namespace, kind, name)`` of the pool.
        fingerprint:
            Digest of the pool spec, Secret data and CA (see `bridge.pools.fingerprint`).
        build:
            Makes a new backend; its errors propagate and nothing is cached.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == fingerprint:
                return entry[1]
        backend = build()
        with self._lock:
            old = self._entries.get(key)
            self._entries[key] = (fingerprint, backend)
        if old is not None and old[1] is not backend:
            old[1].close()
        return backend

    def __len__(self) -> int:
        """Return how many backend clients are cached."""
        with self._lock:
            return len(self._entries)

    def drop(self, key: PoolKey) -> None:
        """Close and forget the backend of a pool (the pool is gone)."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        """Close every backend."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for _, backend in entries:
            backend.close()


class ExhaustionGate:
    """Remembers which pools were found exhausted, so waiting claims do not all ask the IPAM.

    While a pool was found exhausted less than ``hold_seconds`` ago, claims of that pool
    wait without a backend call; a release in that pool opens the gate at once.
    """

    def __init__(self, hold_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[PoolKey, float] = {}

    def closed(self, key: PoolKey) -> bool:
        """Return True when the pool was found exhausted within the hold time."""
        with self._lock:
            since = self._since.get(key)
            return since is not None and self._clock() - since < self.hold_seconds

    def exhausted(self, key: PoolKey) -> None:
        """Record that the pool was just found exhausted."""
        with self._lock:
            self._since[key] = self._clock()

    def open(self, key: PoolKey) -> None:
        """Record that the pool may have a free address (an allocation or a release happened)."""
        with self._lock:
            self._since.pop(key, None)


@dataclass
class Context:
    """Everything handlers need, built once by the start-up handler.

    Attributes
    ----------
    settings:
        The operator settings.
    kube:
        The Kubernetes gateway.
    address_version:
        The IPAddress version to write (the served CAPI version: ``v1beta2`` or ``v1beta1``).
    backends:
        Backend clients by pool.
    gate:
        The exhaustion gate.
    metrics:
        The Prometheus metrics.
    """

    settings: Settings
    kube: Kube
    address_version: str
    backends: BackendCache = field(default_factory=BackendCache)
    gate: ExhaustionGate = field(default_factory=lambda: ExhaustionGate(5.0))
    metrics: Metrics = field(default_factory=Metrics)

    def close(self) -> None:
        """Close backends, the metrics endpoint and the Kubernetes connection pool."""
        self.backends.close()
        self.metrics.close()
        self.kube.close()
