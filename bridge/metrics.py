"""Prometheus metrics of the operator (``/metrics`` on ``IPAM_BRIDGE_METRICS_PORT``).

One `Metrics` object per operator, with its own registry (kept in the operator context, not
in prometheus-client's global registry), so several operators can run in one process
(tests, the demo). Labels carry pool and claim names, never credentials.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Thread
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["Metrics"]

T = TypeVar("T")


class Metrics:
    """The operator's metrics.

    Attributes
    ----------
    allocations:
        ``ipam_bridge_allocations_total{pool, kind, result}``: allocation attempts;
        result is ``success`` or the claim condition reason of the failure.
    releases:
        ``ipam_bridge_releases_total{pool, kind, result}``: release attempts.
    backend_duration:
        ``ipam_bridge_backend_request_duration_seconds{backend, operation, result}``: time of
        each backend operation (``describe_subnet``, ``allocate``, ``release``), retries
        included.
    pool_free:
        ``ipam_bridge_pool_free_addresses{pool, kind}``: free addresses as last reported.
    claims_pending:
        ``ipam_bridge_claims_pending{reason}``: claims waiting for an address, by reason.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.allocations = Counter(
            "ipam_bridge_allocations", "Address allocations by pool and result.",
            ["pool", "kind", "result"], registry=self.registry,
        )
        self.releases = Counter(
            "ipam_bridge_releases", "Address releases by pool and result.",
            ["pool", "kind", "result"], registry=self.registry,
        )
        self.backend_duration = Histogram(
            "ipam_bridge_backend_request_duration_seconds",
            "Duration of backend operations (retries included), in seconds.",
            ["backend", "operation", "result"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.pool_free = Gauge(
            "ipam_bridge_pool_free_addresses", "Free addresses of each pool, as last reported.",
            ["pool", "kind"], registry=self.registry,
        )
        self.claims_pending = Gauge(
            "ipam_bridge_claims_pending", "Claims waiting for an address, by reason.",
            ["reason"], registry=self.registry,
        )
        self._pending: dict[str, str] = {}
        self._server: tuple[WSGIServer, Thread] | None = None

    @contextmanager
    def timed(self, backend: str, operation: str) -> Iterator[None]:
        """Time a backend operation into ``backend_duration`` (result ``ok`` or ``error``)."""
        start = time.perf_counter()
        result = "error"
        try:
            yield
            result = "ok"
        finally:
            self.backend_duration.labels(backend, operation, result).observe(
                time.perf_counter() - start
            )

    def call(self, backend: str, operation: str, fn: Callable[[], T]) -> T:
        """Run ``fn()`` timed as ``backend``/``operation`` and return its result."""
        with self.timed(backend, operation):
            return fn()

    def pending(self, claim: str, reason: str | None) -> None:
        """Record that ``claim`` (``ns/name``) waits for ``reason``, or no longer waits (None)."""
        old = self._pending.pop(claim, None)
        if old is not None:
            self.claims_pending.labels(old).dec()
        if reason is not None:
            self._pending[claim] = reason
            self.claims_pending.labels(reason).inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> int:  # noqa: S104 (a pod port)
        """Serve ``/metrics`` on ``port`` (0 picks a free one); return the bound port."""
        server, thread = start_http_server(port, addr=address, registry=self.registry)
        self._server = (server, thread)
        return int(server.server_port)

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None
