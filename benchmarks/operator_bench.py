"""Throughput and latency of the whole operator: emulated Kubernetes, mock phpIPAM, real kopf."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.common import CREDENTIALS, SUBNET_ID, classify, percentile, seed_for
from bridge.capi import ready_of
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["OperatorResult", "run_operator_bench"]

NAMESPACE = "bench"
POLL_SECONDS = 0.05


@dataclass
class OperatorResult:
    """Figures of one run: N claims created at once with W workers, then deleted at once."""

    claims: int
    workers: int
    bind_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    release_seconds: float = 0.0
    alloc_requests: Counter[str] = field(default_factory=Counter)
    release_requests: Counter[str] = field(default_factory=Counter)

    @property
    def claims_per_second(self) -> float:
        return self.claims / self.bind_seconds if self.bind_seconds else float("nan")

    @property
    def releases_per_second(self) -> float:
        return self.claims / self.release_seconds if self.release_seconds else float("nan")

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 0.95)


def _bound(claim: dict[str, object]) -> bool:
    status = claim.get("status")
    return bool(
        isinstance(status, dict) and status.get("addressRef") and ready_of(claim)[0] == "True"
    )


def run_operator_bench(claims: int, workers: int, *, timeout: float = 120.0) -> OperatorResult:
    """Create ``claims`` claims at once against an operator with ``workers`` workers.

    Latency of a claim is from the return of its create call to the first poll (every
    50 ms) that sees it bound (addressRef and Ready True): it includes up to one poll
    interval. The pool refresher is slowed down so that the request journal counts the
    claims' requests only.

    Raises
    ------
    TimeoutError
        When the claims are not all bound (or all gone) within ``timeout`` seconds.
    """
    result = OperatorResult(claims, workers)
    settings = {"IPAM_BRIDGE_WORKERS": str(workers), "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "3600"}
    with (
        MockPhpipamServer(Store(seed_for(claims))) as phpipam,
        Sandbox(settings=settings) as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        sandbox.wait_pool_ready(NAMESPACE, "pool")
        phpipam.store.clear_journal()

        created: dict[str, float] = {}
        start = time.monotonic()
        for i in range(claims):
            name = f"m-{i:04d}"
            sandbox.claim(NAMESPACE, name, "pool")
            created[name] = time.monotonic()
        seen: dict[str, float] = {}
        deadline = start + timeout
        while len(seen) < claims:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(seen)}/{claims} claims bound after {timeout}s")
            now = time.monotonic()
            for claim in sandbox.claims(NAMESPACE):
                name = claim["metadata"]["name"]
                if name not in seen and _bound(claim):
                    seen[name] = now
            time.sleep(POLL_SECONDS)
        result.bind_seconds = max(seen.values()) - start
        result.latencies = [seen[n] - created[n] for n in created]
        result.alloc_requests = classify(phpipam.store.requests())

        phpipam.store.clear_journal()
        start = time.monotonic()
        for name in created:
            sandbox.delete_claim(NAMESPACE, name)
        sandbox.wait_gone(NAMESPACE, timeout=timeout)
        result.release_seconds = time.monotonic() - start
        result.release_requests = classify(phpipam.store.requests())
    return result
