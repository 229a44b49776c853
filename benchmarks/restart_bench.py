"""Restart with many bound claims: time to steady state, IPAM writes, the operator's memory.

Issue 15's target: with 10,000 bound claims, a restarted operator binds a new claim within
60 s, writes nothing to the IPAM for the bound ones, and stays under 300 MB RSS.

1. The operator (its own process, `benchmarks.operator_process`) makes the pool Ready and
   binds two claims; their claim and IPAddress are the templates of the rest.
2. With the operator stopped, ``bound`` more claims are written straight into the emulated
   API (claim with its finalizer and status, IPAddress) and registered in the mock phpIPAM,
   exactly as the operator would have left them.
3. The operator starts again; a new claim is created at once. Measured: seconds from the
   process start to the new claim bound, the operator's API requests (by verb) and phpIPAM
   requests (writes apart) until then, RSS then and at its peak, and the API writes of the
   following seconds (the bound claims must cost none).
"""

from __future__ import annotations

import copy
import ipaddress
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import CREDENTIALS, SUBNET_ID, seed_for
from benchmarks.operator_process import OperatorProcess
from bridge import capi
from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["RestartResult", "run_restart_bench"]

NAMESPACE = "restart"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class RestartResult:
    """Figures of one restart with ``bound`` bound claims (see the module docstring)."""

    bound: int
    seed_seconds: float = 0.0
    steady_seconds: float = 0.0
    rss_mib: float = 0.0
    peak_mib: float = 0.0
    api: Counter[str] = field(default_factory=Counter)
    api_after: Counter[str] = field(default_factory=Counter)
    ipam_requests: int = 0
    ipam_writes: int = 0


def _bound(claim: dict[str, Any] | None) -> bool:
    status = (claim or {}).get("status") or {}
    return bool(status.get("addressRef")) and capi.ready_of(claim or {})[0] == "True"


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout}s")
        time.sleep(0.05)


def _seed(sandbox: Sandbox, store: Store, bound: int) -> None:
    """Write ``bound`` bound claims like the operator's two templates (see module)."""
    version = sandbox.version
    claim_t = sandbox.get_claim(NAMESPACE, "t-0")
    address_t = sandbox.get_object(f"{GROUP}/{version}", "ipaddresses", "t-0", NAMESPACE)
    assert claim_t is not None and address_t is not None
    used = {
        a["spec"]["address"]
        for a in sandbox.addresses(NAMESPACE)  # the templates' addresses
    }
    subnet = store.get_subnet(SUBNET_ID)
    assert subnet is not None
    network = ipaddress.ip_network(subnet.cidr)
    free = (str(ip) for ip in list(network.hosts())[1:] if str(ip) not in used)
    old_ip = address_t["spec"]["address"]
    for i in range(bound):
        name, ip = f"b-{i:05d}", next(free)
        hostname = f"{name}.{NAMESPACE}"
        store.add_address(
            SUBNET_ID, ip, hostname=hostname, description=f"ipam-bridge {NAMESPACE}/{name}"
        )
        claim = {
            "apiVersion": claim_t["apiVersion"],
            "kind": "IPAddressClaim",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "finalizers": list(claim_t["metadata"].get("finalizers") or []),
            },
            "spec": copy.deepcopy(claim_t["spec"]),
        }
        created = sandbox.create(claim)
        status = copy.deepcopy(claim_t["status"])
        status["addressRef"] = {"name": name}
        for conditions in (
            status.get("conditions"),
            (status.get("v1beta2") or {}).get("conditions"),
        ):
            for condition in conditions or []:
                condition["message"] = str(condition.get("message", "")).replace(old_ip, ip)
        sandbox.kube.patch(
            created["apiVersion"],
            "ipaddressclaims",
            name,
            {"status": status},
            NAMESPACE,
            subresource="status",
        )
        address = copy.deepcopy(address_t)
        meta = address["metadata"]
        for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
            meta.pop(key, None)
        meta["name"] = name
        meta["annotations"][capi.HOSTNAME_ANNOTATION] = hostname
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == "IPAddressClaim":
                ref["name"], ref["uid"] = name, created["metadata"]["uid"]
        address["spec"]["address"] = ip
        address["spec"]["claimRef"] = {"name": name}
        sandbox.create(address)


def _requests(sandbox: Sandbox, since: int) -> tuple[Counter[str], int]:
    records = sandbox.kube.access_log.records()
    user = sandbox.identity.user.name
    counts: Counter[str] = Counter(
        f"{r.verb} {r.resource_path}"
        for r in records[since:]
        if r.via == "request" and r.user == user
    )
    return counts, len(records)


def run_restart_bench(bound: int, *, timeout: float = 300.0, after: float = 5.0) -> RestartResult:
    """Restart the operator with ``bound`` bound claims; see the module docstring.

    ``after`` seconds after the new claim is bound, the API writes are counted once more
    (the bound claims' reconciles may still be running then).

    Raises
    ------
    TimeoutError
        When the templates or the new claim are not bound within ``timeout`` seconds.
    """
    result = RestartResult(bound)
    settings = {"IPAM_BRIDGE_WORKERS": "16"}
    with (
        MockPhpipamServer(Store(seed_for(bound + 16))) as phpipam,
        Sandbox(settings=settings, start_operator=False) as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        with OperatorProcess():
            sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=timeout)
            for name in ("t-0", "t-1"):
                sandbox.claim(NAMESPACE, name, "pool")
            sandbox.wait_claims_bound(NAMESPACE, 2, timeout=timeout)
        start = time.monotonic()
        _seed(sandbox, phpipam.store, bound)
        result.seed_seconds = time.monotonic() - start
        phpipam.store.clear_journal()
        _, mark = _requests(sandbox, 0)

        log = Path(os.environ["BENCH_OPERATOR_LOG"]) if "BENCH_OPERATOR_LOG" in os.environ else None
        with OperatorProcess(log=log) as operator:
            sandbox.claim(NAMESPACE, "new", "pool")
            _wait(
                lambda: _bound(sandbox.get_claim(NAMESPACE, "new")),
                timeout,
                "the new claim not bound",
            )
            result.steady_seconds = time.monotonic() - operator.started
            memory = operator.memory_mib()
            result.api, mark = _requests(sandbox, mark)
            journal = phpipam.store.requests()
            result.ipam_requests = len(journal)
            result.ipam_writes = len(phpipam.store.requests(writes_only=True))
            time.sleep(after)
            result.api_after, _ = _requests(sandbox, mark)
            memory = {**memory, **{k: v for k, v in operator.memory_mib().items() if k == "VmHWM"}}
            result.rss_mib = memory.get("VmRSS", 0.0)
            result.peak_mib = memory.get("VmHWM", 0.0)
    return result


def format_result(result: RestartResult) -> str:
    """Return the figures as text."""

    def verbs(counts: Counter[str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"

    writes = sum(v for k, v in result.api.items() if k.split(" ", 1)[0] in WRITE_VERBS)
    return (
        f"(f) restart with {result.bound} bound claims (seeded in {result.seed_seconds:.1f} s), "
        "operator in its own process, a new claim created at its start\n"
        f"  start -> new claim bound: {result.steady_seconds:.1f} s; RSS then "
        f"{result.rss_mib:.0f} MiB (peak {result.peak_mib:.0f} MiB)\n"
        f"  phpIPAM until then: {result.ipam_requests} requests, {result.ipam_writes} writes "
        "(the new claim's first-free is 1)\n"
        f"  API requests until then ({writes} writes): {verbs(result.api)}\n"
        f"  API requests in the next seconds: {verbs(result.api_after)}"
    )
