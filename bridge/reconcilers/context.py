"""What the reconcilers share: served versions, the work queue, backend clients, notices.

Each reconciler takes a dataclass of what it uses (`bridge.reconcilers.claims.ClaimDeps`,
`bridge.reconcilers.pools.PoolDeps`, `bridge.reconcilers.control_plane.ClusterDeps`); the
pieces they share are defined here: `ServedVersions` (the CAPI versions detected at
start-up), `Queue` (where keys go), `BackendCache` (one IPAM client per pool),
`ExhaustionGate`, `Notices` and `NamespaceLocks`. Nothing here is module-global.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.base import IPAMBackend

__all__ = [
    "BackendCache",
    "ExhaustionGate",
    "NamespaceLocks",
    "Notices",
    "Queue",
    "ServedVersions",
]

log = logging.getLogger(__name__)

#: A pool's identity: ``(namespace, kind, name)`` (namespace empty for a Global pool).
PoolId = tuple[str, str, str]
#: A backend client's key: ``(namespace, kind, name, location)``.
CacheKey = tuple[str, str, str, str]


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


@dataclass
class _Entry:
    """A cached backend: the fingerprint and spec it was built from."""

    fingerprint: str
    spec: Any
    backend: IPAMBackend


@dataclass
class _Flight:
    """A build in progress for one key: waiters for its fingerprint share its outcome."""

    fingerprint: str
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class BackendCache:
    """Backend clients by pool, rebuilt when what they were built from changes.

    Thread-safe: claim and pool handlers of different objects run in parallel threads.

    - **Single flight**: one build per key at a time. Threads that miss while a client is
      being built for the same fingerprint wait for it and share it (or its error: a wrong
      password is tried once, not once per worker, which keeps within an IPAM's login
      lock-out budget). A build for another fingerprint waits, then builds its own.
    - **Held clients are not closed**: code that takes clients inside `holding` (each work
      queue item, each audit round) holds them until the scope ends; a client replaced
      (`get` with a new fingerprint) or dropped (`drop`) while held is retired and closed
      when its last holder lets go, so a worker never sees its client's session logged out
      under it. A reference count per client, kept here; clients taken outside any
      `holding` scope are not held (one-off tools).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, _Entry] = {}
        self._building: dict[CacheKey, _Flight] = {}
        self._holds: dict[int, int] = {}  # id(backend) -> how many holders
        self._retired: dict[int, IPAMBackend] = {}  # replaced or dropped, still held
        self._local = threading.local()

    def get(
        self,
        key: CacheKey,
        fingerprint: str,
        build: Callable[[], IPAMBackend],
        spec: Mapping[str, Any] | None = None,
    ) -> IPAMBackend:
        """Return the cached backend of ``key`` if built from ``fingerprint``, else build one.

        Parameters
        ----------
        key:
            ``(namespace, kind, name, location)`` of the pool: a release at a location
            recorded on an IPAddress (`pool_backends.with_location`) gets a client of its own
            and never replaces (and closes) the one the pool's current location uses.
        fingerprint:
            Digest of the pool spec, Secret data and CA (see `pool_backends.fingerprint`).
        build:
            Makes a new backend; called once per key and fingerprint however many threads
            ask at once. Its errors propagate (to every thread that waited for that build)
            and nothing is cached.
        spec:
            The pool spec the backend is built from, remembered for `reuse`.
        """
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry.fingerprint == fingerprint:
                    return self._hold(entry.backend)
                flight = self._building.get(key)
                if flight is None:
                    flight = self._building[key] = _Flight(fingerprint)
                    break
            flight.done.wait()
            if flight.fingerprint == fingerprint and flight.error is not None:
                raise flight.error
        try:
            backend = build()
        except Exception as exc:
            flight.error = exc
            with self._lock:
                del self._building[key]
            flight.done.set()
            raise
        with self._lock:
            del self._building[key]
            old = self._entries.get(key)
            self._entries[key] = _Entry(fingerprint, spec, backend)
            self._hold(backend)
            closing = self._retire([old.backend] if old is not None else [])
        flight.done.set()
        _close_all(closing)
        return backend

    def reuse(self, key: CacheKey, spec: Mapping[str, Any]) -> IPAMBackend | None:
        """Return the backend of ``key`` when it was built from this pool ``spec``, else None.

        No Secret is read: the credentials are those of the last build (the pool's check
        reads its Secrets and rebuilds the client when they changed, `get`). A backend
        returned is held like one from `get`.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.spec is not None and entry.spec == spec:
                return self._hold(entry.backend)
        return None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold, until the block ends, every backend this thread takes (`get`, `reuse`).

        On exit each is let go; a retired one (replaced or dropped meanwhile) whose last
        holder this was is closed. Scopes nest.
        """
        outer = getattr(self._local, "held", None)
        held: list[IPAMBackend] = []
        self._local.held = held
        try:
            yield
        finally:
            self._local.held = outer
            closing: list[IPAMBackend] = []
            with self._lock:
                for backend in held:
                    count = self._holds[id(backend)] - 1
                    if count:
                        self._holds[id(backend)] = count
                        continue
                    del self._holds[id(backend)]
                    retired = self._retired.pop(id(backend), None)
                    if retired is not None:
                        closing.append(retired)
            _close_all(closing)

    def _hold(self, backend: IPAMBackend) -> IPAMBackend:
        """Count a hold of ``backend`` by this thread's `holding` scope, if any (lock held)."""
        held: list[IPAMBackend] | None = getattr(self._local, "held", None)
        if held is not None:
            held.append(backend)
            self._holds[id(backend)] = self._holds.get(id(backend), 0) + 1
        return backend

    def _retire(self, backends: list[IPAMBackend]) -> list[IPAMBackend]:
        """Keep the held ones of ``backends`` for their last holder; return the rest (lock held)."""
        free: list[IPAMBackend] = []
        for backend in backends:
            if self._holds.get(id(backend)):
                self._retired[id(backend)] = backend
            else:
                free.append(backend)
        return free

    def __len__(self) -> int:
        """Return how many backend clients are cached."""
        with self._lock:
            return len(self._entries)

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the cache's structures, by name (for benchmarks).

        ``entries``, ``retired`` (replaced or dropped, still held), ``held`` (clients with a
        holder) and ``building``.
        """
        with self._lock:
            return {
                "entries": len(self._entries),
                "retired": len(self._retired),
                "held": len(self._holds),
                "building": len(self._building),
            }

    def drop(self, key: PoolId) -> None:
        """Close and forget every backend of a pool ``(namespace, kind, name)`` (it is gone).

        A backend still held is closed when its last holder lets go (`holding`).
        """
        with self._lock:
            gone = [k for k in self._entries if k[:3] == key]
            closing = self._retire([self._entries.pop(k).backend for k in gone])
        _close_all(closing)

    def close(self) -> None:
        """Close every backend, held or not (the operator stops)."""
        with self._lock:
            backends = [e.backend for e in self._entries.values()] + list(self._retired.values())
            self._entries, self._retired = {}, {}
        _close_all(backends)


def _close_all(backends: list[IPAMBackend]) -> None:
    """Close each of ``backends``; an error closing one is logged and the others still close."""
    for backend in backends:
        try:
            backend.close()
        except Exception:
            log.exception("closing a backend client failed")


class ExhaustionGate:
    """Remembers which pools were found exhausted, so waiting claims do not all ask the IPAM.

    While a pool was found exhausted less than ``hold_seconds`` ago, claims of that pool
    wait without a backend call; a release in that pool opens the gate at once.
    """

    def __init__(self, hold_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[PoolId, float] = {}

    def closed(self, key: PoolId) -> bool:
        """Return True when the pool was found exhausted within the hold time."""
        with self._lock:
            since = self._since.get(key)
            return since is not None and self._clock() - since < self.hold_seconds

    def exhausted(self, key: PoolId) -> None:
        """Record that the pool was just found exhausted."""
        with self._lock:
            self._since[key] = self._clock()

    def open(self, key: PoolId) -> None:
        """Record that the pool may have a free address (a release happened, or it is gone)."""
        with self._lock:
            self._since.pop(key, None)

    def __len__(self) -> int:
        """Return how many pools are remembered as exhausted."""
        with self._lock:
            return len(self._since)
