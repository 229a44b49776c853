"""Prometheus metrics of the operator (``/metrics`` on ``IPAM_BRIDGE_METRICS_PORT``).

One `Metrics` object per operator, with its own registry (kept in the
`bridge.operator.Operator`, not in prometheus-client's global registry), so several
operators can run in one process (tests, the demo). Labels carry pool and claim names,
never credentials.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Thread
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from backends.flowcontrol import EndpointState, RequestRecord

__all__ = ["Metrics", "PortUnavailableError", "check_port", "listen_address"]

T = TypeVar("T")


def listen_address(address: str, port: int) -> str:
    """Return ``address:port`` as a person writes it (``[::]:8080`` for an IPv6 address)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class PortUnavailableError(OSError):
    """A TCP port the operator must listen on cannot be bound.

    ``str()`` of it is the whole message, e.g. ``cannot listen on 0.0.0.0:8080 for metrics
    (IPAM_BRIDGE_METRICS_PORT): Address already in use``. It is an `OSError` (the error of
    the failed ``bind``) so that code catching ``OSError`` keeps working.

    Parameters
    ----------
    address:
        The address to listen on (``0.0.0.0``, ``::``, a host name).
    port:
        The TCP port.
    purpose:
        What the port serves (``metrics``, ``health``), for the message.
    setting:
        What chose the port (``IPAM_BRIDGE_METRICS_PORT``, ``--liveness``), for the message.
    reason:
        Why it cannot be bound (the system's text, e.g. ``Address already in use``).
    code:
        The ``errno`` of the failure (``errno.EADDRINUSE``...), or None when unknown.

    Attributes
    ----------
    address, port, purpose, setting, reason:
        As given; ``errno`` is ``code``.
    """

    def __init__(
        self,
        address: str,
        port: int,
        purpose: str,
        setting: str,
        reason: str,
        code: int | None = None,
    ) -> None:
        super().__init__(
            f"cannot listen on {listen_address(address, port)} for {purpose} ({setting}): {reason}"
        )
        # errno alone (no strerror) keeps str() the message above (CPython's OSError.__str__).
        self.errno = code
        self.address = address
        self.port = port
        self.purpose = purpose
        self.setting = setting
        self.reason = reason

    @classmethod
    def from_os_error(
        cls, exc: OSError, address: str, port: int, purpose: str, setting: str
    ) -> PortUnavailableError:
        """Build the error from the ``OSError`` of a failed ``bind`` or address lookup."""
        code = exc.errno if isinstance(exc.errno, int) else None
        if isinstance(exc, socket.gaierror):
            reason = exc.strerror or str(exc)
        elif code is not None:
            reason = os.strerror(code)
        else:
            reason = str(exc) or type(exc).__name__
        return cls(address, port, purpose, setting, reason, code)


def check_port(port: int, address: str, *, purpose: str, setting: str) -> None:
    """Check that a server can listen on ``address:port`` now, and release the port again.

    Binds (and listens on) a TCP socket for every address ``address`` resolves to, with
    ``SO_REUSEADDR`` as the servers that will listen there do (prometheus-client's WSGI
    server, aiohttp's ``TCPSite`` for kopf's liveness endpoint), so a port held only by
    connections in ``TIME_WAIT`` is not reported, and a port another process listens on is.

    Parameters
    ----------
    port:
        TCP port; 0 checks nothing (the endpoint is off).
    address:
        Address or host name to bind (``0.0.0.0`` binds every IPv4 address).
    purpose, setting:
        For the message of the error (see `PortUnavailableError`).

    Raises
    ------
    PortUnavailableError
        When the address does not resolve, or the port is in use, privileged or not
        assignable on this machine.
    """
    if not port:
        return
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise PortUnavailableError.from_os_error(exc, address, port, purpose, setting) from exc
    if not infos:  # pragma: no cover - getaddrinfo raises rather than return nothing
        raise PortUnavailableError(
            address, port, purpose, setting, "no address", errno.EADDRNOTAVAIL
        )
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr)
                sock.listen(1)
        except OSError as exc:
            raise PortUnavailableError.from_os_error(exc, address, port, purpose, setting) from exc


class Metrics:
    """The operator's metrics.

    Attributes
    ----------
    registry:
        The ``CollectorRegistry`` holding all of them (what `serve` exposes).
    allocations:
        ``ipam_bridge_allocations_total{pool, kind, result}``: allocation attempts that
        reached a result (``pool`` is ``<namespace>/<name>``); result is ``success`` (an
        address was reserved in the IPAM) or the claim's Ready reason of the failure. A
        claim already bound (restart, ``clusterctl move``) is not counted again.
    releases:
        ``ipam_bridge_releases_total{pool, kind, result}``: release attempts; result is
        ``success``, ``skipped`` (the pool was gone, nothing could be freed) or the failure's
        reason.
    backend_duration:
        ``ipam_bridge_backend_request_duration_seconds{backend, operation, result}``: time of
        each backend operation (``describe_subnets``, ``allocate``, ``release``, ...),
        retries included.
    pool_free:
        ``ipam_bridge_pool_free_addresses{pool, kind}``: free addresses as last reported.
    pool_total:
        ``ipam_bridge_pool_total_addresses{pool, kind}``: addresses the pool's subnets hold
        (what allocations are made from), as last reported; with `pool_free`, the fraction
        free.
    claims_pending:
        ``ipam_bridge_claims_pending{reason}``: claims waiting for an address, by reason
        (claim condition reason: ``PoolNotReady``, ``PoolExhausted``, ``AllocationFailed``).
    backend_last_success:
        ``ipam_bridge_backend_last_success_timestamp_seconds{backend}``: POSIX time of the last
        backend operation that succeeded (alert when it grows old while claims are pending).
    endpoint_state:
        ``ipam_bridge_backend_endpoint_state{endpoint}``: circuit breaker of each IPAM endpoint
        (``scheme://host:port``): 0 closed (calls go through), 1 open (calls fail fast),
        2 half-open (one probe call in flight).
    endpoint_concurrency:
        ``ipam_bridge_backend_endpoint_concurrency{endpoint}``: how many works each IPAM
        endpoint may have in flight now (`backends.flowcontrol.FlowControl`: between 1 and
        ``IPAM_BRIDGE_ENDPOINT_MAX_CONCURRENT``; halved on a timeout, connection error, 429 or
        5xx but phpIPAM's refusals).
    http_requests:
        ``ipam_bridge_backend_http_requests_total{endpoint, result}``: HTTP requests to each
        IPAM endpoint by result (the status code, or ``timeout``, ``connection_error``,
        ``tls_error``, ``error``).
    drift:
        ``ipam_bridge_drift{pool, kind, finding}``: what the last drift audit of each pool
        left unresolved (`audit`), by finding: ``missing`` (an IPAddress's entry is
        gone and could not be registered again yet), ``conflict`` (its address or hostname
        is held by another entry), ``orphan`` (an entry ipam-bridge made for a claim that no
        longer exists). 0 for every finding when the pool is in sync.
    drift_restored:
        ``ipam_bridge_drift_restored_total{pool, kind}``: missing entries the audit
        registered again at their address.
    watch_idle:
        ``ipam_bridge_watch_idle_seconds{resource, namespace}``: seconds since each watch's
        last event, bookmark or list (``namespace`` empty for a cluster-wide watch),
        computed at scrape time (`watched`). A real API server sends a bookmark about every
        60 s; beyond ``IPAM_BRIDGE_WATCH_STALL_SECONDS`` the watch is dead and listed again.
    leader:
        ``ipam_bridge_leader``: 1 on the replica that handles claims and pools (the holder of
        the leader Lease, or the only process without leader election), 0 on a standby
        (served from the start of the process, before any API request).
    events_dropped:
        ``ipam_bridge_events_dropped_total{reason}``: Kubernetes Events not posted, by why:
        ``queue_full`` (1,000 Events were waiting to be posted already: the API server
        answers slowly; `bridge.runtime.events.MAX_QUEUED_EVENTS`) or ``spam_filter`` (more
        than 25 Events about one object within minutes; client-go's spam filter). Both
        series exist from the start, at 0.
    last_success:
        The same time, across backends, as a float (None before the first success); read by
        the liveness probe.

    Notes
    -----
    Metric types and the text exposition format are prometheus-client's; the counters are
    exposed with the ``_total`` suffix. Methods are thread-safe: kopf runs sync handlers of
    different objects in parallel threads.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._claim_metrics()
        self._backend_metrics()
        self._audit_metrics()
        self.watch_idle = Gauge(
            "ipam_bridge_watch_idle_seconds",
            "Seconds since each watch's last event, bookmark or list.",
            ["resource", "namespace"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "ipam_bridge_leader",
            "1 on the replica that handles claims and pools (the leader), 0 on a standby.",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "ipam_bridge_events_dropped",
            "Kubernetes Events not posted, by reason (queue_full, spam_filter).",
            ["reason"],
            registry=self.registry,
        )
        for reason in ("queue_full", "spam_filter"):
            self.events_dropped.labels(reason)
        self.last_success: float | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}
        self._server: tuple[WSGIServer, Thread] | None = None

    def _claim_metrics(self) -> None:
        """Register the claims' and pools' metrics."""
        self.allocations = Counter(
            "ipam_bridge_allocations",
            "Address allocations by pool and result.",
            ["pool", "kind", "result"],
            registry=self.registry,
        )
        self.releases = Counter(
            "ipam_bridge_releases",
            "Address releases by pool and result.",
            ["pool", "kind", "result"],
            registry=self.registry,
        )
        self.backend_duration = Histogram(
            "ipam_bridge_backend_request_duration_seconds",
            "Duration of backend operations (retries included), in seconds.",
            ["backend", "operation", "result"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.pool_free = Gauge(
            "ipam_bridge_pool_free_addresses",
            "Free addresses of each pool, as last reported.",
            ["pool", "kind"],
            registry=self.registry,
        )
        self.pool_total = Gauge(
            "ipam_bridge_pool_total_addresses",
            "Addresses of each pool's subnets (free and used), as last reported.",
            ["pool", "kind"],
            registry=self.registry,
        )
        self.claims_pending = Gauge(
            "ipam_bridge_claims_pending",
            "Claims waiting for an address, by reason.",
            ["reason"],
            registry=self.registry,
        )

    def _backend_metrics(self) -> None:
        """Register the IPAM servers' metrics."""
        self.backend_last_success = Gauge(
            "ipam_bridge_backend_last_success_timestamp_seconds",
            "POSIX time of the last successful backend operation.",
            ["backend"],
            registry=self.registry,
        )
        self.endpoint_state = Gauge(
            "ipam_bridge_backend_endpoint_state",
            "Circuit breaker of each IPAM endpoint: 0 closed, 1 open, 2 half-open.",
            ["endpoint"],
            registry=self.registry,
        )
        self.endpoint_concurrency = Gauge(
            "ipam_bridge_backend_endpoint_concurrency",
            "Claims each IPAM endpoint may have in flight now (adapts to what it sustains).",
            ["endpoint"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            "ipam_bridge_backend_http_requests",
            "HTTP requests to each IPAM endpoint by result (status code or failure).",
            ["endpoint", "result"],
            registry=self.registry,
        )

    def _audit_metrics(self) -> None:
        """Register the drift audit's metrics."""
        self.drift = Gauge(
            "ipam_bridge_drift",
            "Drift found by the last audit of each pool and left unresolved, by finding.",
            ["pool", "kind", "finding"],
            registry=self.registry,
        )
        self.drift_restored = Counter(
            "ipam_bridge_drift_restored",
            "Missing IPAM entries the drift audit registered again at their address.",
            ["pool", "kind"],
            registry=self.registry,
        )

    @contextmanager
    def timed(self, backend: str, operation: str) -> Iterator[None]:
        """Time the enclosed backend operation into ``backend_duration``.

        Parameters
        ----------
        backend:
            ``phpipam`` or ``infoblox`` (see `bridge.reconcilers.pool_backends.BACKEND_NAMES`).
        operation:
            ``describe_subnets``, ``allocate``, ``release``, ``purge_quarantined`` or ``entries``.

        Notes
        -----
        The result label is ``ok`` when the block completes and ``error`` when it raises (the
        exception propagates unchanged). A success also sets ``backend_last_success`` and
        `last_success` to the current POSIX time.
        """
        start = time.perf_counter()
        result = "error"
        try:
            yield
            result = "ok"
        finally:
            self.backend_duration.labels(backend, operation, result).observe(
                time.perf_counter() - start
            )
            if result == "ok":
                now = time.time()
                self.last_success = now
                self.backend_last_success.labels(backend).set(now)

    def call(self, backend: str, operation: str, fn: Callable[[], T]) -> T:
        """Run ``fn()`` timed as ``backend``/``operation`` (see `timed`) and return its result.

        Raises
        ------
        Exception
            Whatever ``fn`` raises, after it was recorded with result ``error``.
        """
        with self.timed(backend, operation):
            return fn()

    def event_dropped(self, reason: str) -> None:
        """Count one Event not posted (the `bridge.runtime.events.EventRecorder` drop hook).

        Parameters
        ----------
        reason:
            ``queue_full`` or ``spam_filter``.
        """
        self.events_dropped.labels(reason).inc()

    def endpoint_changed(self, endpoint: str, state: EndpointState) -> None:
        """Record an endpoint's new circuit state (the `FlowControl` state hook)."""
        self.endpoint_state.labels(endpoint).set(int(state))

    def endpoint_limit(self, endpoint: str, limit: int) -> None:
        """Record how many claims ``endpoint`` may have in flight (`flowcontrol` hook)."""
        self.endpoint_concurrency.labels(endpoint).set(limit)

    def request_made(self, record: RequestRecord) -> None:
        """Count one HTTP request to an IPAM endpoint (the `FlowControl` request hook)."""
        self.http_requests.labels(record.endpoint, record.result).inc()

    def watched(self, resource: str, namespace: str, idle: Callable[[], float]) -> None:
        """Export ``idle()`` (seconds since a watch's last event, bookmark or list) at scrape.

        Parameters
        ----------
        resource:
            The watched resource's plural (``ipaddressclaims``).
        namespace:
            The watched namespace; empty for a cluster-wide watch.
        idle:
            Returns the seconds (e.g. `bridge.runtime.informer.Informer.quiet`); called in
            the scraping thread.
        """
        self.watch_idle.labels(resource, namespace).set_function(idle)

    def pending(self, claim: str, reason: str | None) -> None:
        """Record that a claim waits for an address, or no longer waits.

        Parameters
        ----------
        claim:
            ``<namespace>/<name>`` of the claim.
        reason:
            The claim's Ready reason while it waits; None once it is bound, released or
            deleted (its series is decremented, never left behind).
        """
        with self._lock:
            old = self._pending.pop(claim, None)
            if old is not None:
                self.claims_pending.labels(old).dec()
            if reason is not None:
                self._pending[claim] = reason
                self.claims_pending.labels(reason).inc()

    def pending_claims(self) -> dict[str, str]:
        """Return a copy of the waiting claims: ``{"<namespace>/<name>": reason}``."""
        with self._lock:
            return dict(self._pending)

    def pools(self) -> list[str]:
        """Return the pools (``<namespace>/<name>``) whose free count is exported, sorted."""
        return sorted(
            {
                sample.labels["pool"]
                for family in self.pool_free.collect()
                for sample in family.samples
            }
        )

    def forget_pool(self, pool: str, kind: str) -> None:
        """Drop the gauges (free, total, drift) of a deleted pool (``<namespace>/<name>``, kind).

        A gauge left behind would report addresses of a pool that no longer exists; the
        counters keep their series (Prometheus counters are not deleted).
        """
        self.pool_free.remove(pool, kind)  # a no-op for an unknown series
        self.pool_total.remove(pool, kind)
        for finding in ("missing", "conflict", "orphan"):
            self.drift.remove(pool, kind, finding)  # the drift audit's series too

    def serve(
        self,
        port: int,
        address: str = "0.0.0.0",
        *,
        setting: str = "IPAM_BRIDGE_METRICS_PORT",
    ) -> int:
        """Serve ``/metrics`` over HTTP with prometheus-client's WSGI server, in a thread.

        Parameters
        ----------
        port:
            TCP port; 0 picks a free one.
        address:
            Address to bind (``0.0.0.0`` in a pod, so the metrics Service reaches it).
        setting:
            What chose the port, named in the error (default ``IPAM_BRIDGE_METRICS_PORT``).

        Returns
        -------
        int
            The bound port.

        Raises
        ------
        PortUnavailableError
            When the port cannot be bound (in use, privileged, or an address this machine
            does not have); an `OSError`, its message names the address, port and setting.
        """
        try:
            server, thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise PortUnavailableError.from_os_error(
                exc, address, port, "metrics", setting
            ) from exc
        self._server = (server, thread)
        return int(server.server_port)

    def close(self) -> None:
        """Stop serving ``/metrics`` and join the server thread (no-op when not serving)."""
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None
