"""The IPAM backend clients of the pools: built from each pool's spec and Secrets, cached.

`PoolClients.backend_for` reads a pool's Secret(s) and returns its client from the
`BackendCache` (one per pool and IPAM location, rebuilt when what it was built from
changes, closed by its last holder); `bridge.reconcilers.pool_backends` builds them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from backends.base import IPAMBackend
from backends.flowcontrol import FlowControl
from bridge.capi import Reason
from bridge.reconcilers.context import PoolId
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import Pool, build_backend, fingerprint, location_of
from bridge.runtime.fence import Fence
from bridge.settings import Settings

__all__ = ["BackendCache", "PoolClients", "SecretReader"]

log = logging.getLogger(__name__)

#: A backend client's key: ``(namespace, kind, name, location)``.
CacheKey = tuple[str, str, str, str]


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
        spec: object | None = None,
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

    def reuse(self, key: CacheKey, spec: object) -> IPAMBackend | None:
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


class SecretReader(Protocol):
    """What reads a Secret (`bridge.runtime.gateway.Kube.read_secret`)."""

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """Return the Secret's data as text, or None when it does not exist."""


@dataclass
class PoolClients:
    """The IPAM backend client of each pool, built from its spec and Secrets, cached.

    Attributes
    ----------
    settings:
        The operator settings (backend timeout, retry policy).
    secrets:
        Reads the pools' Secrets.
    flow:
        The flow control per IPAM server shared by every client (circuit breaker, one
        concurrency limit, login budget; `Settings.flow_control`).
    backends:
        The clients by pool and location.
    fence:
        This replica's write fence: every IPAM request that is not a read has its whole
        timeout cut to the time the Lease stays valid, or is not sent
        (`bridge.runtime.fence.Fence.bound`, given as the retry policy's ``write_timeout``).
    """

    settings: Settings
    secrets: SecretReader
    flow: FlowControl
    backends: BackendCache = field(default_factory=BackendCache)
    fence: Fence = field(default_factory=Fence.open)

    def backend_for(self, pool: Pool, *, reuse: bool = False) -> IPAMBackend:
        """Return the pool's backend client, built from its Secret(s) or taken from the cache.

        Reads the credentials Secret (and the CA Secret when ``spec.tls.caSecretRef`` is set)
        on every call, so a fixed Secret takes effect at once: in the pool's own namespace, or
        for a Global pool in the namespace its reference names. A Secret being deleted is still
        read (it is kept by `CREDENTIALS_FINALIZER` for releases).

        With ``reuse`` (claims: allocations and releases) a client already built from this very
        pool spec is returned without reading any Secret: Secrets are not watched (that would
        need list/watch on every Secret), so the pool's check (`check_pool`, at every pool change
        and every ``IPAM_BRIDGE_POOL_REFRESH_SECONDS``) is what reads them and rebuilds the
        client when they changed. Without such a client the Secrets are read as above.

        Parameters
        ----------
        pool:
            The pool (possibly with a recorded location, `pool_backends.with_location`): the cache
            key includes its spec, so another location gets its own client.

        Raises
        ------
        PoolError
            ``CredentialsNotFound`` when a Secret or one of its keys is missing; ``InvalidSpec``
            when the client refuses the configuration.
        """
        key = (*pool.key, location_of(pool))
        if reuse and (cached := self.backends.reuse(key, pool.spec)) is not None:
            return cached
        secret_namespace = pool.secret_namespace or pool.namespace
        secret = self.secrets.read_secret(secret_namespace, pool.credentials_secret)
        if secret is None:
            raise PoolError(
                Reason.CREDENTIALS_NOT_FOUND,
                f"Secret {secret_namespace}/{pool.credentials_secret} not found",
                needs_person=True,
            )
        ca_pem: str | None = None
        if pool.tls.ca_secret_name and not pool.tls.insecure_skip_verify:
            ca_namespace = pool.tls.ca_secret_namespace or pool.namespace
            ca = self.secrets.read_secret(ca_namespace, pool.tls.ca_secret_name)
            ca_pem = (ca or {}).get(pool.tls.ca_secret_key)
            if not ca_pem:
                raise PoolError(
                    Reason.CREDENTIALS_NOT_FOUND,
                    f"CA bundle: Secret {ca_namespace}/{pool.tls.ca_secret_name} or its key "
                    f"{pool.tls.ca_secret_key!r} not found",
                    needs_person=True,
                )
        return self.backends.get(
            key,
            fingerprint(pool, secret, ca_pem),
            lambda: build_backend(
                pool,
                secret,
                ca_pem,
                timeout_seconds=self.settings.backend_timeout_seconds,
                retry=replace(self.settings.retry_policy(), write_timeout=self.fence.bound),
                endpoints=self.flow,
            ),
            spec=pool.spec,
        )
