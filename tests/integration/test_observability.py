"""Observability of the running operator: metrics, events, JSON logs, probe, namespace scope."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import requests
from integration_env import CREDENTIALS, NAMESPACE
from prometheus_client.parser import text_string_to_metric_families

from bridge.capi import CLAIM_FINALIZER
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: Anything that must never show up in metrics, events or logs.
SECRET_NEEDLES = (
    CREDENTIALS["password"],
    base64.b64encode(CREDENTIALS["password"].encode()).decode(),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> Samples:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert not any(needle in text for needle in SECRET_NEEDLES)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def phpipam_tokens(phpipam: MockPhpipamServer) -> list[str]:
    return [user.token for user in phpipam.store.users.values() if user.token]


def hostnames(phpipam: MockPhpipamServer, subnet_id: int) -> list[str]:
    return sorted(
        a.hostname or "" for a in phpipam.store.subnet_addresses(subnet_id) if not a.is_gateway
    )


def free_in_mock(phpipam: MockPhpipamServer, subnet_id: int) -> int:
    usage = phpipam.store.usage(subnet_id)
    assert usage is not None
    return int(usage["freehosts"])


def exhausted_claim(sandbox: Sandbox, namespace: str) -> dict[str, Any]:
    """Wait until exactly one claim of ``namespace`` waits on an exhausted pool; return it."""

    def find() -> dict[str, Any] | None:
        waiting = [c for c in sandbox.claims(namespace) if sandbox.ready(c)[1] == "PoolExhausted"]
        return waiting[0] if len(waiting) == 1 else None

    return dict(wait_for(find, message="one PoolExhausted claim"))


# -- metrics ------------------------------------------------------------------------------


def test_metrics_follow_allocations_releases_and_exhaustion(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    port = free_port()
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_METRICS_PORT": str(port)})
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    # subnet 9 is a /30: two usable addresses for three claims
    sandbox.phpipam_pool(
        NAMESPACE, "small", endpoint=phpipam.url, subnet_id=9, secret="pool-credentials"
    )
    for i in range(3):
        sandbox.claim(NAMESPACE, f"m{i}", "pool")
        sandbox.claim(NAMESPACE, f"s{i}", "small")
    sandbox.wait_claims_bound(NAMESPACE, 5)
    waiting = exhausted_claim(sandbox, NAMESPACE)
    sandbox.delete_claim(NAMESPACE, "m0")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "m0") is None, message="m0 released")

    big = {"pool": f"{NAMESPACE}/pool", "kind": "PHPIPAMIPPool"}
    small = {"pool": f"{NAMESPACE}/small", "kind": "PHPIPAMIPPool"}

    # the refresher brings the free gauges (and the status) to what the IPAM holds now
    def settled() -> Samples | None:
        s = scrape(port)
        pool = sandbox.pool(NAMESPACE, "pool") or {}
        free = ((pool.get("status") or {}).get("ipAddresses") or {}).get("free")
        return (
            s
            if value(s, "ipam_bridge_pool_free_addresses", **big) == free_in_mock(phpipam, 7)
            and value(s, "ipam_bridge_pool_free_addresses", **small) == free_in_mock(phpipam, 9)
            and free == free_in_mock(phpipam, 7)
            else None
        )

    samples = wait_for(settled, message="free addresses as in the mock")
    assert hostnames(phpipam, 7) == ["m1.test", "m2.test"]
    assert free_in_mock(phpipam, 9) == 0

    assert value(samples, "ipam_bridge_allocations_total", **big, result="success") == 3
    assert value(samples, "ipam_bridge_allocations_total", **small, result="success") == 2
    assert value(samples, "ipam_bridge_allocations_total", **small, result="PoolExhausted") >= 1
    assert value(samples, "ipam_bridge_releases_total", **big, result="success") == 1
    assert value(samples, "ipam_bridge_releases_total", **small, result="success") == 0
    assert value(samples, "ipam_bridge_claims_pending", reason="PoolExhausted") == 1
    for operation, at_least in (("allocate", 5), ("release", 1), ("describe_subnets", 2)):
        count = value(
            samples,
            "ipam_bridge_backend_request_duration_seconds_count",
            backend="phpipam",
            operation=operation,
            result="ok",
        )
        assert count >= at_least, operation
    assert (
        value(samples, "ipam_bridge_backend_last_success_timestamp_seconds", backend="phpipam")
        > time.time() - 60
    )

    # a waiting claim that is deleted leaves the pending gauge
    sandbox.delete_claim(NAMESPACE, waiting["metadata"]["name"])
    samples = wait_for(
        lambda: (
            (s := scrape(port))
            and value(s, "ipam_bridge_releases_total", **small, result="success") == 1
            and s
        ),
        message="release of the waiting claim counted",
    )
    assert value(samples, "ipam_bridge_claims_pending", reason="PoolExhausted") == 0
    assert sum(v for (name, _), v in samples.items() if name == "ipam_bridge_claims_pending") == 0
    assert sandbox.get_claim(NAMESPACE, waiting["metadata"]["name"]) is None


def test_pending_gauge_reason_for_a_pool_without_credentials(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    port = free_port()
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_METRICS_PORT": str(port)})
    sandbox.phpipam_pool(NAMESPACE, "nocreds", endpoint=phpipam.url, subnet_id=10)
    sandbox.claim(NAMESPACE, "c1", "nocreds")
    sandbox.wait_claim_reason(NAMESPACE, "c1", "PoolNotReady")
    labels = {"pool": f"{NAMESPACE}/nocreds", "kind": "PHPIPAMIPPool"}
    samples = wait_for(
        lambda: (
            (s := scrape(port))
            and value(s, "ipam_bridge_claims_pending", reason="PoolNotReady") == 1
            and s
        ),
        message="claim pending with PoolNotReady",
    )
    # The claim waits for its pool to turn Ready: no allocation is attempted, none counted.
    assert value(samples, "ipam_bridge_allocations_total", **labels, result="PoolNotReady") == 0
    assert value(samples, "ipam_bridge_allocations_total", **labels, result="success") == 0
    assert phpipam.store.requests(writes_only=True) == []

    # the Secret appears: the claim is bound and leaves the gauge
    sandbox.secret(NAMESPACE, "nocreds-credentials", CREDENTIALS)
    sandbox.wait_claims_bound(NAMESPACE, 1)
    samples = scrape(port)
    assert value(samples, "ipam_bridge_claims_pending", reason="PoolNotReady") == 0
    assert value(samples, "ipam_bridge_allocations_total", **labels, result="success") == 1


def test_backend_outage_is_counted_evented_and_recovered(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    port = free_port()
    # As deploy/'s RBAC lets the operator: a repeated Event is a patch of the one told before.
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_METRICS_PORT": str(port)}, identity="operator")
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=10, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m1", "pool")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    labels = {"pool": f"{NAMESPACE}/pool", "kind": "PHPIPAMIPPool"}

    phpipam.faults.update(down=True, down_mode="503")
    sandbox.claim(NAMESPACE, "m2", "pool")
    failed = sandbox.wait_claim_reason(NAMESPACE, "m2", "AllocationFailed")
    # the refresher finds the pool unreachable and says so on the pool
    pool_event = wait_event(sandbox, "PHPIPAMIPPool", "pool", "BackendUnavailable")
    assert pool_event["type"] == "Warning"
    claim_event = wait_event(sandbox, "IPAddressClaim", "m2", "AllocationFailed")
    assert claim_event["type"] == "Warning"
    assert f"{NAMESPACE}/pool" in claim_event["message"]
    assert sandbox.ready(failed) == ("False", "AllocationFailed")
    samples = scrape(port)
    assert value(samples, "ipam_bridge_claims_pending", reason="AllocationFailed") == 1
    assert value(samples, "ipam_bridge_allocations_total", **labels, result="AllocationFailed") >= 1
    errors = value(
        samples,
        "ipam_bridge_backend_request_duration_seconds_count",
        backend="phpipam",
        operation="allocate",
        result="error",
    )
    assert errors >= 1

    phpipam.faults.update(down=False)
    sandbox.wait_claims_bound(NAMESPACE, 2)

    def ready_events() -> list[dict[str, Any]]:
        return [
            e for e in events_of(sandbox, "PHPIPAMIPPool", "pool") if e["reason"] == "PoolReady"
        ]

    def told(events: list[dict[str, Any]]) -> int:
        return sum(int(e.get("count") or 1) for e in events)

    # PoolReady when created, BackendUnavailable, PoolReady again: the same Event told again
    # raises its count (as client-go's recorder does) unless its message changed
    recovered = wait_for(
        lambda: told(ready_events()) == 2 and ready_events(), message="Ready again"
    )
    assert all(e["type"] == "Normal" for e in recovered)
    samples = scrape(port)
    assert value(samples, "ipam_bridge_claims_pending", reason="AllocationFailed") == 0
    assert value(samples, "ipam_bridge_allocations_total", **labels, result="success") == 2


# -- events -------------------------------------------------------------------------------


def events_of(sandbox: Sandbox, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sandbox.events(NAMESPACE)
        if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name
    ]


def wait_event(sandbox: Sandbox, kind: str, name: str, reason: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next((e for e in events_of(sandbox, kind, name) if e["reason"] == reason), None)

    return dict(wait_for(find, message=f"event {reason} on {kind} {name}"))


def test_events_on_allocation_release_and_failures(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE, "small", endpoint=phpipam.url, subnet_id=9, secret="pool-credentials"
    )
    sandbox.phpipam_pool(NAMESPACE, "nocreds", endpoint=phpipam.url, subnet_id=10)
    sandbox.claim(NAMESPACE, "m1", "pool")
    for i in range(3):
        sandbox.claim(NAMESPACE, f"s{i}", "small")
    sandbox.claim(NAMESPACE, "n1", "nocreds")
    sandbox.wait_claims_bound(NAMESPACE, 3)
    waiting = exhausted_claim(sandbox, NAMESPACE)["metadata"]["name"]

    # Claims allocated at once post no Event: their Ready condition says it all.
    assert [e for e in sandbox.events(NAMESPACE) if e["reason"] == "AddressAllocated"] == []

    exhausted = wait_event(sandbox, "IPAddressClaim", waiting, "PoolExhausted")
    assert exhausted["type"] == "Warning"
    assert f"{NAMESPACE}/small" in exhausted["message"]

    not_ready = wait_event(sandbox, "IPAddressClaim", "n1", "PoolNotReady")
    assert not_ready["type"] == "Warning"
    assert f"{NAMESPACE}/nocreds" in not_ready["message"]

    pool_failed = wait_event(sandbox, "PHPIPAMIPPool", "nocreds", "CredentialsNotFound")
    assert pool_failed["type"] == "Warning"
    assert f"{NAMESPACE}/nocreds-credentials" in pool_failed["message"]
    pool_ready = wait_event(sandbox, "PHPIPAMIPPool", "pool", "PoolReady")
    assert pool_ready["type"] == "Normal"
    assert "10.20.0.0/24" in pool_ready["message"]

    # one event per transition: while the claim waits, its pool looks at the IPAM again (once
    # a second here) without the claim posting the same warning again
    def pool_probes() -> int:
        return sum(1 for r in phpipam.store.requests() if r.path.endswith("/subnets/9/"))

    probes = pool_probes()
    wait_for(lambda: pool_probes() >= probes + 2, message="two more probes of the pool")
    assert [e["reason"] for e in events_of(sandbox, "IPAddressClaim", waiting)] == ["PoolExhausted"]

    # The end of a wait is told: a released address goes to the waiting claim, whose
    # AddressAllocated Event names the address and the pool. The release itself posts none.
    bound_small = sorted(
        a["metadata"]["name"]
        for a in sandbox.addresses(NAMESPACE)
        if a["spec"]["poolRef"]["name"] == "small"
    )
    sandbox.delete_claim(NAMESPACE, bound_small[0])
    allocated = wait_event(sandbox, "IPAddressClaim", waiting, "AddressAllocated")
    assert allocated["type"] == "Normal"
    (address,) = [
        a["spec"]["address"]
        for a in sandbox.addresses(NAMESPACE)
        if a["metadata"]["name"] == waiting
    ]
    assert address in allocated["message"]
    assert f"{NAMESPACE}/small" in allocated["message"]
    assert allocated["involvedObject"]["namespace"] == NAMESPACE
    assert [e for e in sandbox.events(NAMESPACE) if e["reason"] == "AddressReleased"] == []

    text = json.dumps(sandbox.events())
    tokens = phpipam_tokens(phpipam)
    assert tokens
    for needle in (*SECRET_NEEDLES, *tokens):
        assert needle not in text


# -- the CLI as a process: JSON logs, probe, namespace scope, SIGTERM -----------------------


class OperatorProcess:
    """``python -m bridge.cli run ...`` with its output collected line by line."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def output(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def terminate(self, timeout: float = 15.0) -> tuple[int, float]:
        """SIGTERM; return the exit code and the seconds it took to exit."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        elapsed = time.monotonic() - start
        self._reader.join(5)
        return code, elapsed

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def operator_process(
    sandbox: Sandbox, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[OperatorProcess]:
    environment = {
        **os.environ,
        **sandbox.settings,
        "KUBECONFIG": str(sandbox.workdir / "kubeconfig"),
        "IPAM_BRIDGE_METRICS_PORT": "0",
        "IPAM_BRIDGE_HEALTH_PORT": "0",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    process = OperatorProcess(["--standalone", *args], environment)
    try:
        yield process
    except BaseException:
        sys.stderr.write("\n".join(process.output()[-60:]) + "\n")
        raise
    finally:
        process.kill()


def get_probe(port: int) -> dict[str, Any] | None:
    try:
        response = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except requests.ConnectionError:
        return None
    return dict(response.json()) if response.status_code == 200 else None


def test_json_logs_and_probe_of_the_cli(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    sandbox = make_sandbox(start_operator=False)
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m1", "pool")
    health = free_port()
    with operator_process(
        sandbox,
        "--liveness",
        f"http://127.0.0.1:{health}/healthz",
        env={
            "IPAM_BRIDGE_LOG_FORMAT": "json",
            "IPAM_BRIDGE_LOG_LEVEL": "DEBUG",
            # no refresh while the probe is asked: any backend call would be the probe's
            "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "3600",
        },
    ) as operator:
        sandbox.wait_claims_bound(NAMESPACE, 1)
        (ip_address,) = sandbox.addresses(NAMESPACE)
        address = ip_address["spec"]["address"]
        sandbox.wait_pool_ready(NAMESPACE, "pool")
        wait_for(
            lambda: any("PoolReady" in line for line in operator.output()),
            message="the pool check logged",
        )
        tokens = phpipam_tokens(phpipam)  # the operator's phpIPAM session token
        assert tokens
        calls = len(phpipam.store.journal)
        probe = wait_for(lambda: get_probe(health), message="liveness endpoint")
        assert len(phpipam.store.journal) == calls
        sandbox.delete_claim(NAMESPACE, "m1")
        sandbox.wait_gone(NAMESPACE)
        code, _ = operator.terminate()
    assert code == 0

    facts = probe["bridge"]
    assert facts["started"] is True
    assert facts["capiVersion"] == sandbox.version
    assert facts["pools"] == 1
    assert facts["backends"] == 1
    assert facts["claimsPending"] == 0
    assert facts["lastBackendSuccess"] is not None
    assert 0 <= facts["secondsSinceBackendSuccess"] < 60

    lines = [line for line in operator.output() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(r, dict) and "message" in r and "severity" in r for r in records)

    def about(kind: str, name: str) -> list[dict[str, Any]]:
        return [
            r
            for r in records
            if (r.get("object") or {}).get("kind") == kind and r["object"].get("name") == name
        ]

    claim_lines = about("IPAddressClaim", "m1")
    assert all(r["object"]["namespace"] == NAMESPACE for r in claim_lines)
    # the lines logged while the claim is reconciled carry the claim, with the address
    ours = [r["message"] for r in claim_lines if r.get("logger") == "bridge.reconcilers.claims"]
    assert any(f"{address} registered as m1.{NAMESPACE}" in m for m in ours), ours
    assert any(f"released {address}" in m and f"{NAMESPACE}/pool" in m for m in ours), ours
    assert any(r.get("logger", "").startswith("backends.") for r in claim_lines)
    assert about("PHPIPAMIPPool", "pool")

    text = "\n".join(lines)
    for needle in (*SECRET_NEEDLES, *tokens):
        assert needle not in text


def test_namespace_scope_and_sigterm(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    sandbox = make_sandbox(start_operator=False)
    sandbox.namespace("other")
    # the other namespace's objects exist first: a cluster-wide watch would see them first
    sandbox.phpipam_pool(
        "other", "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim("other", "o1", "pool")
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m1", "pool")
    with operator_process(sandbox, "--namespace", NAMESPACE) as operator:
        sandbox.wait_claims_bound(NAMESPACE, 1)
        first = sandbox.wait_pool_ready(NAMESPACE, "pool")["status"]["conditions"][0]
        wait_for(
            lambda: sandbox.pool(NAMESPACE, "pool")["metadata"].get("finalizers"),
            message="pool protected",
        )
        assert first["status"] == "True"
        code, elapsed = operator.terminate()
    assert code == 0
    assert elapsed < 10

    other = sandbox.get_claim("other", "o1")
    assert other is not None
    assert CLAIM_FINALIZER not in (other["metadata"].get("finalizers") or [])
    assert not other["metadata"].get("finalizers")
    assert not any(
        key.startswith("ipam-bridge") or key.startswith("kopf")
        for key in other["metadata"].get("annotations") or {}
    )
    assert not other.get("status")
    assert sandbox.addresses("other") == []
    other_pool = sandbox.pool("other", "pool")
    assert other_pool is not None and not other_pool.get("status")
    assert not other_pool["metadata"].get("finalizers")
    assert hostnames(phpipam, 7) == ["m1.test"]
    assert sandbox.events("other") == []
    # text logs (the default) prefix the lines of an object with its namespace/name
    output = operator.output()
    assert any("[test/m1]" in line and "registered as m1.test" in line for line in output)
    assert not any("other/" in line for line in output)
