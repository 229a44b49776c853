"""The drift audit of one large pool: time (wall and CPU) and IPAM requests.

A mock phpIPAM holds a /18 with ``addresses`` entries registered as ipam-bridge registers them
(``<claim>.<namespace>``, ``ipam-bridge <namespace>/<claim>``), plus a few entries of other
tools; the pool's IPAddresses and claims are built in memory as the API returns them. One
audit of the pool is what the operator does each round (`bridge.reconcilers.audit`): the entries are
listed with the real `backends.phpipam.PHPIPAMBackend` over HTTP (one list request per
subnet), the Kubernetes lists are decoded from JSON (what the kubernetes client does with a
list answer) and typed (`bridge.reconcilers.audit.typed_addresses`, `typed_claims`), and
everything is compared (`bridge.reconcilers.audit.compare`).

CPU seconds are the auditing thread's own (``time.thread_time``): the mock serves from
another thread of this process and is not counted.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backends.retry import RetryPolicy
from benchmarks.common import CREDENTIALS, SUBNET_ID, classify
from bridge import capi
from bridge.reconcilers.audit import compare, typed_addresses, typed_claims
from bridge.reconcilers.pool_backends import build_backend, location_of, parse_pool
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["AuditResult", "run_audit_bench"]

NAMESPACE = "bench"
NETWORK = ipaddress.ip_network("10.64.0.0/18")


@dataclass
class AuditResult:
    """Figures of one audit of a pool of ``addresses`` addresses.

    Attributes
    ----------
    addresses:
        Rows registered by ipam-bridge (and as many IPAddresses and claims).
    entries:
        Entries the IPAM listed (``addresses`` plus the gateway and other tools' entries).
    findings:
        What the comparison found (0 expected: the pool is in sync).
    list_wall, list_cpu:
        Seconds of ``entries()`` (HTTP and JSON included): wall clock, this thread's CPU.
    decode_wall, decode_cpu:
        Seconds to decode the IPAddress and claim lists from JSON into typed values.
    compare_wall, compare_cpu:
        Seconds of the in-memory comparison.
    requests:
        IPAM requests of the audit by ``METHOD controller/action`` (mock journal).
    """

    addresses: int
    entries: int = 0
    findings: int = 0
    list_wall: float = 0.0
    list_cpu: float = 0.0
    decode_wall: float = 0.0
    decode_cpu: float = 0.0
    compare_wall: float = 0.0
    compare_cpu: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)

    @property
    def wall(self) -> float:
        """Seconds of the whole audit of the pool (wall clock)."""
        return self.list_wall + self.decode_wall + self.compare_wall

    @property
    def cpu(self) -> float:
        """CPU seconds of the whole audit of the pool (the auditing thread)."""
        return self.list_cpu + self.decode_cpu + self.compare_cpu


def _seed() -> dict[str, Any]:
    return {
        "users": [dict(CREDENTIALS)],
        "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
        "sections": [
            {
                "id": 3,
                "name": "bench",
                "subnets": [
                    {
                        "id": SUBNET_ID,
                        "cidr": str(NETWORK),
                        "gateway": str(NETWORK.network_address + 1),
                    }
                ],
            }
        ],
    }


def _pool_body(endpoint: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{capi.GROUP}/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {"name": "big", "namespace": NAMESPACE, "uid": "uid-big", "generation": 1},
        "spec": {
            "endpoint": endpoint,
            "appId": "capi",
            "subnetId": SUBNET_ID,
            "credentialsRef": {"name": "creds"},
        },
    }


def _objects(n: int, location: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return ``n`` IPAddresses and their claims, as the API lists them."""
    pool_ref = {"apiGroup": capi.GROUP, "kind": "PHPIPAMIPPool", "name": "big"}
    addresses, claims = [], []
    for i in range(n):
        name = f"machine-{i:05d}"
        claims.append(
            {
                "apiVersion": f"{capi.GROUP}/v1beta2",
                "kind": "IPAddressClaim",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "uid": f"uid-{i}",
                    "finalizers": [capi.CLAIM_FINALIZER],
                    "labels": {capi.CLUSTER_NAME_LABEL: "bench"},
                },
                "spec": {"poolRef": pool_ref, "clusterName": "bench"},
                "status": {"addressRef": {"name": name}},
            }
        )
        addresses.append(
            {
                "apiVersion": f"{capi.GROUP}/v1beta2",
                "kind": "IPAddress",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "annotations": {
                        capi.HOSTNAME_ANNOTATION: f"{name}.{NAMESPACE}",
                        capi.LOCATION_ANNOTATION: location,
                    },
                    "finalizers": [capi.ADDRESS_FINALIZER],
                    "labels": {capi.CLUSTER_NAME_LABEL: "bench"},
                },
                "spec": {
                    "address": str(NETWORK.network_address + 10 + i),
                    "prefix": NETWORK.prefixlen,
                    "gateway": str(NETWORK.network_address + 1),
                    "claimRef": {"name": name},
                    "poolRef": pool_ref,
                },
            }
        )
    return addresses, claims


def run_audit_bench(addresses: int = 10_000, *, others: int = 50) -> AuditResult:
    """Audit a pool of ``addresses`` registered addresses (plus ``others`` entries of other tools).

    Raises
    ------
    ValueError
        When the /18 cannot hold that many addresses.
    """
    if addresses + others + 10 > NETWORK.num_addresses - 2:
        raise ValueError(f"{NETWORK} holds at most {NETWORK.num_addresses - others - 12} entries")
    result = AuditResult(addresses)
    store = Store(_seed())
    for i in range(addresses):
        name = f"machine-{i:05d}"
        store.add_address(
            SUBNET_ID,
            str(NETWORK.network_address + 10 + i),
            hostname=f"{name}.{NAMESPACE}",
            description=f"ipam-bridge {NAMESPACE}/{name} cluster bench",
        )
    for j in range(others):
        store.add_address(
            SUBNET_ID,
            str(NETWORK.broadcast_address - 1 - j),
            hostname=f"printer-{j}.example.com",
            description="not ours",
        )
    with MockPhpipamServer(store) as phpipam:
        pool = parse_pool(_pool_body(phpipam.url))
        backend = build_backend(
            pool,
            dict(CREDENTIALS),
            None,
            timeout_seconds=60.0,
            retry=RetryPolicy(attempts=1, max_delay_seconds=1.0, total_seconds=120.0),
        )
        try:
            backend.describe_subnets()  # warm up: login and subnet facts, as a running operator
            store.clear_journal()
            wall, cpu = time.perf_counter(), time.thread_time()
            entries = backend.entries()
            result.list_wall = time.perf_counter() - wall
            result.list_cpu = time.thread_time() - cpu
            result.requests = classify(store.requests())
        finally:
            backend.close()
    result.entries = len(entries)
    ip_list, claim_list = _objects(addresses, location_of(pool))
    ip_text = json.dumps({"kind": "IPAddressList", "items": ip_list})
    claim_text = json.dumps({"kind": "IPAddressClaimList", "items": claim_list})
    wall, cpu = time.perf_counter(), time.thread_time()
    ip_items = typed_addresses(json.loads(ip_text)["items"])
    claim_items = typed_claims(json.loads(claim_text)["items"])
    result.decode_wall = time.perf_counter() - wall
    result.decode_cpu = time.thread_time() - cpu
    wall, cpu = time.perf_counter(), time.thread_time()
    findings = compare(pool, entries, ip_items, claim_items, claim_namespaces={NAMESPACE})
    result.compare_wall = time.perf_counter() - wall
    result.compare_cpu = time.thread_time() - cpu
    result.findings = len(findings)
    return result


def format_result(result: AuditResult) -> str:
    """Return the figures of `run_audit_bench` as text."""
    requests = ", ".join(f"{k} {v}" for k, v in sorted(result.requests.items())) or "none"
    return (
        f"(f) drift audit of one pool: {result.addresses} addresses in {NETWORK} (phpIPAM mock "
        f"over HTTP, {result.entries} entries listed), {result.findings} findings\n"
        f"  list entries:   {result.list_wall:6.2f} s wall  {result.list_cpu:6.2f} s CPU\n"
        f"  decode lists:   {result.decode_wall:6.2f} s wall  {result.decode_cpu:6.2f} s CPU  "
        f"({result.addresses} IPAddresses + {result.addresses} claims from JSON, typed)\n"
        f"  compare:        {result.compare_wall:6.2f} s wall  {result.compare_cpu:6.2f} s CPU\n"
        f"  whole audit:    {result.wall:6.2f} s wall  {result.cpu:6.2f} s CPU (target < 5 s CPU)\n"
        f"  IPAM requests:  {sum(result.requests.values())} ({requests}; target: one list per "
        "subnet)"
    )
