"""The operator's run-time context: one object, built at start-up, kept in kopf's memo.

It holds the settings, the Kubernetes gateway, the served CAPI version, one backend client
per pool (reused while the pool's spec and Secret stay the same, so a phpIPAM token is
reused), the flow control per IPAM endpoint and the work queue. Nothing here is
module-global.

Keys of the work queue and its wake tokens are plain tuples, made by the functions below:
``("claim", namespace, name)``, ``("pool", namespace, kind, name)``, ``("cluster", namespace,
name)`` (a Cluster's control-plane endpoint, `bridge.reconcilers.control_plane`); wake tokens
``("cluster", namespace, name)`` (the claims of a paused or missing Cluster) and
``("pool-ready", namespace, kind, name)`` (the claims waiting for a pool) and
``("endpoint", "scheme://host:port")`` (the claims waiting for a place at an IPAM endpoint,
`backends.flowcontrol.endpoint_token`; they are queued one by one by the flow control, not
woken by the token).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiException

from backends.base import IPAMBackend
from backends.flowcontrol import FlowControl
from bridge.metrics import Metrics
from bridge.runtime.cache import Cache
from bridge.runtime.gateway import Kube
from bridge.runtime.holds import PendingHolds
from bridge.runtime.workqueue import WorkQueue
from bridge.settings import Settings

__all__ = [
    "BackendCache",
    "Context",
    "Notices",
    "claim_key",
    "cluster_key",
    "cluster_token",
    "pool_key",
    "pool_token",
]

log = logging.getLogger(__name__)

PoolKey = tuple[str, str, str]
CacheKey = tuple[str, str, str, str]


def claim_key(namespace: str, name: str) -> tuple[str, str, str]:
    """Return the work-queue key of a claim."""
    return ("claim", namespace, name)


def pool_key(namespace: str, kind: str, name: str) -> tuple[str, str, str, str]:
    """Return the work-queue key of a pool."""
    return ("pool", namespace, kind, name)


def cluster_key(namespace: str, name: str) -> tuple[str, str, str]:
    """Return the work-queue key of a Cluster's control-plane endpoint (`control_plane`)."""
    return ("cluster", namespace, name)


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


def cluster_token(namespace: str, name: str) -> tuple[str, str, str]:
    """Return the wake token of the claims waiting for a Cluster (unpaused or created)."""
    return ("cluster", namespace, name)


def pool_token(namespace: str, kind: str, name: str) -> tuple[str, str, str, str]:
    """Return the wake token of the claims waiting for a pool (Ready, or an address freed)."""
    return ("pool-ready", namespace, kind, name)


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

    def drop(self, key: PoolKey) -> None:
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
    metrics:
        The Prometheus metrics.
    flow:
        The flow control per IPAM endpoint (`backends.flowcontrol.FlowControl`, built by
        `Settings.flow_control`), shared by every backend client and every claim: exhausted
        pools, circuit breaker, claims in flight, slots, login budget. Its hooks feed
        `metrics`, and claims it keeps a place for are queued again (`enqueue`).
    queue:
        The work queue (None until start-up wires it; services then only decide).
    v1beta2_kept:
        Whether the served v1beta1 IPAddressClaim schema keeps ``status.v1beta2`` (CAPI
        >= 1.9). None until the first status write of a v1beta1 claim shows it: the API
        server prunes unknown fields and returns what it stored.
    cluster_version:
        The served CAPI ``Cluster`` version (``v1beta2`` on CAPI >= 1.11, else ``v1beta1``),
        detected at start-up; None when Clusters are not served (no control-plane endpoints).
    notices:
        Warnings already told (`Notices`), by subject.
    cache:
        The objects claims are decided from (claims, pools, Clusters, our IPAddresses), fed
        by the watches (`bridge.runtime.cache`, `bridge.handlers.cache`).
    holds:
        Claims between their look at their pool and their finalizer write
        (`bridge.runtime.holds.PendingHolds`), counted by a pool's deletion guard.
    """

    settings: Settings
    kube: Kube
    address_version: str
    backends: BackendCache = field(default_factory=BackendCache)
    metrics: Metrics = field(default_factory=Metrics)
    flow: FlowControl = field(default_factory=FlowControl)
    queue: WorkQueue | None = None
    v1beta2_kept: bool | None = None
    cluster_version: str | None = None
    notices: Notices = field(default_factory=Notices)
    cache: Cache = field(default_factory=Cache)
    holds: PendingHolds = field(default_factory=PendingHolds)
    _events: concurrent.futures.ThreadPoolExecutor | None = field(default=None, repr=False)
    _namespace_locks: dict[str, tuple[threading.Lock, int]] = field(
        default_factory=dict, repr=False
    )
    _locks_guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.flow.on_state = self.metrics.endpoint_changed
        self.flow.on_request = self.metrics.request_made
        self.flow.on_limit = self.metrics.endpoint_limit
        self.flow.wake = self._requeue
        if isinstance(self.kube, Kube):  # test doubles have no write-through
            self.kube.on_stored = self.cache.stored
            self.kube.on_deleted = self.cache.deleted

    @contextlib.contextmanager
    def namespace_lock(self, namespace: str) -> Iterator[None]:
        """Hold, for the block, the lock that serialises decisions about a namespace's Secrets.

        Two pools that read one Secret, deleted at once (a namespace deletion), must not
        each see the other and both keep the Secret's finalizer. A namespace's lock lives
        while a thread holds or waits for it (a count under ``_locks_guard``), so namespaces
        come and go without their locks staying behind.
        """
        with self._locks_guard:
            lock, users = self._namespace_locks.get(namespace, (threading.Lock(), 0))
            self._namespace_locks[namespace] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._locks_guard:
                lock, users = self._namespace_locks[namespace]
                if users > 1:
                    self._namespace_locks[namespace] = (lock, users - 1)
                else:
                    del self._namespace_locks[namespace]

    def sizes(self) -> dict[str, int]:
        """Return the sizes of the in-memory structures that grow with objects, by name.

        For the soak benchmark (``python -m benchmarks --only soak``): the cache's parts
        (objects), the work queue's (`bridge.runtime.workqueue.WorkQueue.sizes`), the backend
        cache's (`BackendCache.sizes`), namespace locks, the flow control's
        (`backends.flowcontrol.FlowControl.sizes`) and its endpoints, notices and the claims
        counted as pending by the metrics.
        """
        sizes = {
            f"cache.{name}": len(part)
            for name, part in (
                ("claims", self.cache.claims),
                ("addresses", self.cache.addresses),
                ("pools", self.cache.pools),
                ("clusters", self.cache.clusters),
            )
        }
        if self.queue is not None:
            sizes |= {f"queue.{k}": v for k, v in self.queue.sizes().items()}
        sizes |= {f"backends.{k}": v for k, v in self.backends.sizes().items()}
        sizes |= {f"flow.{k}": v for k, v in self.flow.sizes().items()}
        with self._locks_guard:
            sizes["namespace_locks"] = len(self._namespace_locks)
        sizes["notices"] = len(self.notices)
        sizes["metrics.pending"] = len(self.metrics.pending_claims())
        return sizes

    def enqueue(self, key: tuple[str, ...], after: float = 0.0) -> None:
        """Queue ``key`` (see `claim_key`, `pool_key`) if the queue runs; else do nothing."""
        if self.queue is not None:
            self.queue.add(key, after)

    def _requeue(self, key: Hashable) -> None:
        """Queue a claim key woken by the flow control (`enqueue` for any hashable key)."""
        if self.queue is not None:
            self.queue.add(key)

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Post an Event about ``obj``; a refused one is logged, never raised.

        Events are told, not relied on: the API refuses them in a terminating namespace
        (403), and that must never stop a release. With the real gateway (`Kube`) they are
        posted by a few background threads, so the worker that decided goes on at once
        instead of waiting for the API server (an Event is a fourth write per allocation
        and per release, off the claim's critical path); `close` posts those still queued.
        Test doubles get them at once.
        """
        if not isinstance(self.kube, Kube):
            self._post(obj, kind, reason, message)
            return
        with self._locks_guard:
            if self._events is None:
                self._events = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="ipam-bridge-events"
                )
            events = self._events
        try:
            events.submit(self._post, obj, kind, reason, message)
        except RuntimeError:  # shut down: closing
            self._post(obj, kind, reason, message)

    def _post(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            self.kube.post_event(obj, type=kind, reason=reason, message=message)
        except ApiException as exc:
            log.debug("event %s not posted: %s %s", reason, exc.status, exc.reason)
        except Exception:
            if isinstance(self.kube, Kube):  # a background thread: nobody else would see it
                log.exception("event %s not posted", reason)
            else:
                raise

    def wake(self, token: tuple[str, ...], count: int | None = None) -> None:
        """Wake the keys parked under ``token`` (see `cluster_token`, `pool_token`).

        ``count`` wakes at most that many, longest waiting first (None: all).
        """
        if self.queue is not None:
            self.queue.wake(token, count)

    def waiting(self, token: tuple[str, ...]) -> bool:
        """Return True when any key is parked under ``token``."""
        return self.queue is not None and bool(self.queue.parked(token))

    def close(self) -> None:
        """Post the queued Events; close backends, metrics endpoint, Kubernetes connections."""
        with self._locks_guard:
            events, self._events = self._events, None
        if events is not None:
            events.shutdown(wait=True)
        self.backends.close()
        self.metrics.close()
        self.kube.close()
