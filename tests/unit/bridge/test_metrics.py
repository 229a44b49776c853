"""bridge.metrics: the per-operator registry, pending bookkeeping, timing, the HTTP endpoint.

Also the liveness probe of bridge.handlers.lifecycle, whose facts come from the metrics.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import kopf
import pytest
import requests
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from backends.base import IPAMBackend
from bridge.handlers.lifecycle import probe
from bridge.metrics import Metrics
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.settings import Settings


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def pending_total(metrics: Metrics) -> float:
    return sum(s.value for family in metrics.claims_pending.collect() for s in family.samples)


def test_each_operator_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.allocations.labels("ns/pool", "PHPIPAMIPPool", "success").inc()
    labels = {"pool": "ns/pool", "kind": "PHPIPAMIPPool", "result": "success"}
    assert sample(first, "ipam_bridge_allocations_total", **labels) == 1
    assert sample(second, "ipam_bridge_allocations_total", **labels) is None
    assert REGISTRY.get_sample_value("ipam_bridge_allocations_total", labels) is None


def test_pending_moves_a_claim_between_reasons_and_drops_it() -> None:
    metrics = Metrics()
    metrics.pending("ns/a", "PoolExhausted")
    metrics.pending("ns/b", "PoolExhausted")
    metrics.pending("ns/a", "PoolNotReady")  # same claim, new reason: moves, not added
    assert sample(metrics, "ipam_bridge_claims_pending", reason="PoolExhausted") == 1
    assert sample(metrics, "ipam_bridge_claims_pending", reason="PoolNotReady") == 1
    assert metrics.pending_claims() == {"ns/a": "PoolNotReady", "ns/b": "PoolExhausted"}

    metrics.pending("ns/a", "PoolNotReady")  # a retry with the same reason counts once
    assert sample(metrics, "ipam_bridge_claims_pending", reason="PoolNotReady") == 1

    metrics.pending("ns/a", None)
    metrics.pending("ns/b", None)
    metrics.pending("ns/never-waited", None)  # bound at once: nothing to drop, no negative
    assert pending_total(metrics) == 0
    assert metrics.pending_claims() == {}
    assert sample(metrics, "ipam_bridge_claims_pending", reason="PoolExhausted") == 0


def test_pending_is_consistent_under_concurrent_handlers() -> None:
    metrics = Metrics()
    reasons = ["PoolExhausted", "PoolNotReady", "AllocationFailed", None]
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        barrier.wait()
        for step in range(300):
            claim = f"ns/c{(index * 7 + step) % 20}"
            metrics.pending(claim, reasons[(index + step) % len(reasons)])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    waiting = metrics.pending_claims()
    assert pending_total(metrics) == len(waiting)
    for reason in reasons[:-1]:
        expected = sum(1 for r in waiting.values() if r == reason)
        assert sample(metrics, "ipam_bridge_claims_pending", reason=reason) == expected


def test_timed_records_ok_and_error_and_the_last_success() -> None:
    metrics = Metrics()
    assert metrics.last_success is None
    before = time.time()
    assert metrics.call("phpipam", "allocate", lambda: "10.0.0.2") == "10.0.0.2"
    assert metrics.last_success is not None and metrics.last_success >= before
    success = metrics.last_success

    def fail() -> None:
        raise RuntimeError("IPAM down")

    with pytest.raises(RuntimeError, match="IPAM down"):
        metrics.call("phpipam", "release", fail)
    assert metrics.last_success == success  # a failure does not count as contact

    count = "ipam_bridge_backend_request_duration_seconds_count"
    assert sample(metrics, count, backend="phpipam", operation="allocate", result="ok") == 1
    assert sample(metrics, count, backend="phpipam", operation="release", result="error") == 1
    assert sample(metrics, count, backend="phpipam", operation="release", result="ok") is None
    assert (
        sample(metrics, "ipam_bridge_backend_last_success_timestamp_seconds", backend="phpipam")
        == success
    )


def test_timed_measures_seconds() -> None:
    metrics = Metrics()
    with metrics.timed("infoblox", "describe_subnet"):
        time.sleep(0.02)  # the thing measured, not a synchronisation
    total = sample(
        metrics,
        "ipam_bridge_backend_request_duration_seconds_sum",
        backend="infoblox",
        operation="describe_subnet",
        result="ok",
    )
    assert total is not None and 0.02 <= total < 5
    within = sample(
        metrics,
        "ipam_bridge_backend_request_duration_seconds_bucket",
        backend="infoblox",
        operation="describe_subnet",
        result="ok",
        le="0.01",
    )
    assert within == 0


def test_pools_and_forget_pool() -> None:
    metrics = Metrics()
    metrics.pool_free.labels("ns/b", "InfobloxIPPool").set(3)
    metrics.pool_total.labels("ns/b", "InfobloxIPPool").set(6)
    metrics.pool_free.labels("ns/a", "PHPIPAMIPPool").set(0)
    metrics.pool_total.labels("ns/a", "PHPIPAMIPPool").set(2)
    assert metrics.pools() == ["ns/a", "ns/b"]
    metrics.forget_pool("ns/b", "InfobloxIPPool")
    metrics.forget_pool("ns/unknown", "PHPIPAMIPPool")
    assert metrics.pools() == ["ns/a"]
    for name in ("ipam_bridge_pool_free_addresses", "ipam_bridge_pool_total_addresses"):
        assert sample(metrics, name, pool="ns/b", kind="InfobloxIPPool") is None
    assert (
        sample(metrics, "ipam_bridge_pool_total_addresses", pool="ns/a", kind="PHPIPAMIPPool") == 2
    )


def test_serve_exposes_the_registry_over_http() -> None:
    metrics = Metrics()
    metrics.releases.labels("ns/pool", "InfobloxIPPool", "success").inc(2)
    port = metrics.serve(0, address="127.0.0.1")
    try:
        response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        assert families["ipam_bridge_releases"].type == "counter"
        assert families["ipam_bridge_backend_request_duration_seconds"].type == "histogram"
        assert families["ipam_bridge_pool_free_addresses"].type == "gauge"
        values = {
            (s.name, s.labels.get("result")): s.value
            for s in families["ipam_bridge_releases"].samples
        }
        assert values[("ipam_bridge_releases_total", "success")] == 2
        assert "python_gc" not in response.text  # not the global registry
    finally:
        metrics.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    metrics.close()  # idempotent


# -- the liveness probe (bridge.handlers.lifecycle.probe) ----------------------------------


class _Backend:
    def close(self) -> None:
        pass


class _Kube:
    def close(self) -> None:
        pass


def test_probe_before_start_up() -> None:
    assert probe(memo=kopf.Memo()) == {"started": False}


def test_probe_reports_in_memory_facts_only() -> None:
    ctx = Operator(settings=Settings(), kube=_Kube(), versions=ServedVersions("v1beta1"))  # type: ignore[arg-type]
    memo = kopf.Memo()
    memo.bridge = ctx
    facts: dict[str, Any] = probe(memo=memo)
    assert facts == {
        "started": True,
        "capiVersion": "v1beta1",
        "pools": 0,
        "backends": 0,
        "claimsPending": 0,
        "lastBackendSuccess": None,
        "secondsSinceBackendSuccess": None,
        "queueStalledSeconds": 0.0,
        "watchIdleSeconds": 0.0,
    }

    backend: IPAMBackend = _Backend()  # type: ignore[assignment]
    ctx.backends.get(("ns", "PHPIPAMIPPool", "pool"), "fp", lambda: backend)
    ctx.metrics.pool_free.labels("ns/pool", "PHPIPAMIPPool").set(10)
    ctx.metrics.pending("ns/c1", "PoolExhausted")
    ctx.metrics.call("phpipam", "describe_subnet", lambda: None)
    facts = probe(memo=memo)
    assert facts["pools"] == 1
    assert facts["backends"] == 1
    assert facts["claimsPending"] == 1
    assert facts["lastBackendSuccess"].endswith("+00:00")
    assert 0 <= facts["secondsSinceBackendSuccess"] < 5


class _StalledQueue:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def stalled(self) -> float:
        return self.seconds


def test_probe_fails_when_the_work_queue_makes_no_progress_while_keys_are_due() -> None:
    ctx = Operator(
        settings=Settings(stall_seconds=60), kube=_Kube(), versions=ServedVersions("v1beta2")
    )  # type: ignore[arg-type]
    memo = kopf.Memo()
    memo.bridge = ctx
    ctx.queue = _StalledQueue(59.0)  # type: ignore[assignment]
    assert probe(memo=memo)["queueStalledSeconds"] == 59.0
    ctx.queue = _StalledQueue(61.0)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="no progress for 61s"):
        probe(memo=memo)
    ctx.settings = Settings(stall_seconds=0)  # 0: never
    assert probe(memo=memo)["queueStalledSeconds"] == 61.0


class _Watch:
    """An informer as the probe and the metric see it: a name and its idle seconds."""

    def __init__(self, name: str, idle: float) -> None:
        self.name = name
        self.idle = idle

    def quiet(self) -> float:
        return self.idle


def test_probe_fails_when_a_watch_had_nothing_for_twice_the_stall_limit() -> None:
    ctx = Operator(
        settings=Settings(watch_stall_seconds=10), kube=_Kube(), versions=ServedVersions("v1beta2")
    )  # type: ignore[arg-type]
    memo = kopf.Memo()
    memo.bridge = ctx
    claims = _Watch("ipaddressclaims in ns", 19.0)
    memo.informers = [_Watch("ipaddresses in ns", 1.0), claims]
    # Dead beyond the limit but younger than twice it: the relist may still get through.
    assert probe(memo=memo)["watchIdleSeconds"] == 19.0
    claims.idle = 21.0
    with pytest.raises(RuntimeError, match=r"more than 20s on the watch of ipaddressclaims in ns"):
        probe(memo=memo)


def test_the_idle_seconds_of_each_watch_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    watch = _Watch("ipaddressclaims", 1.5)
    metrics.watched("ipaddressclaims", "", watch.quiet)
    metrics.watched("ipaddresses", "ns", lambda: 0.25)

    def scraped() -> dict[tuple[str, str], float]:
        return {
            (sample.labels["resource"], sample.labels["namespace"]): sample.value
            for family in metrics.registry.collect()
            if family.name == "ipam_bridge_watch_idle_seconds"
            for sample in family.samples
        }

    assert scraped() == {("ipaddressclaims", ""): 1.5, ("ipaddresses", "ns"): 0.25}
    watch.idle = 95.0
    assert scraped()[("ipaddressclaims", "")] == 95.0
