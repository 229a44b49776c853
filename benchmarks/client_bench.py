"""The phpIPAM client alone against mock_phpipam: allocate/release operations per second."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from backends.base import EntryOwner
from backends.flowcontrol import FlowControl
from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from benchmarks.common import CREDENTIALS, SUBNET_ID, classify, seed_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["ClientResult", "run_client_bench"]


@dataclass
class ClientResult:
    """Figures of ``ops`` allocations then ``ops`` releases with ``threads`` threads."""

    ops: int
    threads: int
    latency_ms: float
    alloc_seconds: float = 0.0
    release_seconds: float = 0.0
    alloc_latencies: list[float] = field(default_factory=list)
    alloc_requests: Counter[str] = field(default_factory=Counter)
    release_requests: Counter[str] = field(default_factory=Counter)

    @property
    def alloc_per_second(self) -> float:
        return self.ops / self.alloc_seconds

    @property
    def release_per_second(self) -> float:
        return self.ops / self.release_seconds


def _timed(fn: Callable[..., object], *args: object) -> float:
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def run_client_bench(ops: int, *, threads: int = 1, latency_ms: float = 0.0) -> ClientResult:
    """Allocate ``ops`` hostnames, then release them, with one shared `PHPIPAMBackend`.

    ``latency_ms`` is added by the mock before every answer (fault injection). The
    client is warmed up first (login, subnet facts), so the figures are steady-state.
    """
    result = ClientResult(ops, threads, latency_ms)
    with MockPhpipamServer(Store(seed_for(ops))) as phpipam:
        config = PHPIPAMConfig(
            endpoint=phpipam.url,
            app_id="capi",
            subnet_id=SUBNET_ID,
            username=CREDENTIALS["username"],
            password=CREDENTIALS["password"],
            timeout_seconds=10,
            retry=RetryPolicy(attempts=5, max_delay_seconds=0.5),
        )
        # As many endpoint slots as threads: the client alone, no operator limit in the way.
        endpoints = FlowControl(max_concurrent=max(threads, 1))
        with PHPIPAMBackend(config, endpoints=endpoints) as client:
            client.describe_subnets()  # warm-up: login and subnet facts
            phpipam.faults.update(latency_seconds=latency_ms / 1000)
            phpipam.store.clear_journal()
            hosts = [f"bench-{i:05d}.bench" for i in range(ops)]
            with ThreadPoolExecutor(max_workers=threads) as pool:
                start = time.monotonic()
                result.alloc_latencies = list(
                    pool.map(lambda h: _timed(client.allocate, h, _owner(h)), hosts)
                )
                result.alloc_seconds = time.monotonic() - start
                result.alloc_requests = classify(phpipam.store.requests())
                phpipam.store.clear_journal()
                start = time.monotonic()
                released = list(pool.map(lambda h: client.release(h, _owner(h)), hosts))
                result.release_seconds = time.monotonic() - start
                result.release_requests = classify(phpipam.store.requests())
            if not all(released):
                raise RuntimeError("a release found nothing to delete")
    return result


def _owner(hostname: str) -> EntryOwner:
    """Return the owner the benchmark writes on the entry of ``hostname`` (``bench/<name>``)."""
    return EntryOwner("ipam-bridge-benchmark", f"bench/{hostname}")
