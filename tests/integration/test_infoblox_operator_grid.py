"""The real operator against the WAPI mock serving the WAPI 2.12 schema, in every mode.

Host records (with an upper-case ``dnsZone``: NIOS stores names in lower case) and fixed
addresses, IPv4 and IPv6: claims are allocated, the drift audit lists the pool's records
(through the address view: ``network`` is not a search field of ``record:host`` at 2.12) and
finds a record a person added, released addresses stay quarantined for the grace period and
are then purged, and no record is left behind. The mock refuses every request a grid refuses
(search fields, body fields, return fields of the schema), so each step also proves the
client sends only what a grid accepts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from bridge.reconcilers.audit import IN_SYNC
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for

__all__: list[str] = []

KIND = "InfobloxIPPool"
ZONE = "Nodes.Example.COM"
GRACE_SECONDS = 2
SETTINGS = {"IPAM_BRIDGE_AUDIT_SECONDS": "0.5", "IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS": "0.5"}
RECORD_TYPES = ("record:host", "fixedaddress", "ipv6fixedaddress")


def records(server: MockInfobloxServer) -> list[dict[str, Any]]:
    """Every host record and fixed address of the mock grid."""
    dump = server.store.dump()["objects"]
    return [r for t in RECORD_TYPES for r in dump.get(t, [])]


def names(server: MockInfobloxServer) -> set[str]:
    return {str(r["name"]) for r in records(server)}


def in_sync(sandbox: Sandbox, name: str) -> dict[str, Any]:
    pool = sandbox.pool(NAMESPACE, name, KIND) or {}
    conditions = (pool.get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conditions if c["type"] == IN_SYNC), {})


@pytest.mark.parametrize(
    ("record_type", "cidr"),
    [
        ("host", "10.20.0.0/24"),
        ("host", "2001:db8:20::/64"),
        ("fixedaddress", "10.20.0.0/24"),
        ("fixedaddress", "2001:db8:20::/64"),
    ],
)
def test_allocate_audit_release_and_purge_leave_nothing_behind(
    infoblox: MockInfobloxServer,
    make_sandbox: Callable[..., Sandbox],
    record_type: str,
    cidr: str,
) -> None:
    sandbox = make_sandbox(settings=SETTINGS)
    spec: dict[str, Any] = {
        "recordType": record_type,
        "addressReuseGracePeriodSeconds": GRACE_SECONDS,
    }
    if record_type == "host":
        spec["dnsZone"] = ZONE
    sandbox.infoblox_pool(
        NAMESPACE, "grid", endpoint=infoblox.url, subnet=cidr, credentials=CREDENTIALS, **spec
    )
    sandbox.wait_pool_ready(NAMESPACE, "grid", KIND)
    for claim in ("a", "b"):
        sandbox.claim(NAMESPACE, claim, "grid", kind=KIND)
    sandbox.wait_claims_bound(NAMESPACE, 2, timeout=60)

    suffix = ".test.nodes.example.com" if record_type == "host" else ".test"
    assert names(infoblox) == {f"a{suffix}", f"b{suffix}"}  # lower case, as NIOS stores them
    assert {r["network_view"] for r in records(infoblox)} == {"default"}
    network = ipaddress.ip_network(cidr)
    bound = {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}
    assert all(ipaddress.ip_address(ip) in network for ip in bound.values())

    # The audit lists the pool's records: it finds the record of a claim that is gone.
    kind = "record:host" if record_type == "host" else ("ipv6" if network.version == 6 else "")
    kind = kind if kind == "record:host" else f"{kind}fixedaddress"
    infoblox.store.add_record(
        {
            "type": kind,
            "name": "ghost.test",
            "address": str(network.network_address + 200),
            "comment": f"ipam-bridge {NAMESPACE}/ghost",
        }
    )
    wait_for(
        lambda: "1 orphan" in str(in_sync(sandbox, "grid").get("message")),
        timeout=60,
        message="the audit reports the orphaned record",
    )
    infoblox.store.remove_records({"name": "ghost.test"})
    wait_for(
        lambda: in_sync(sandbox, "grid").get("status") == "True",
        timeout=60,
        message="the audit finds the pool in sync",
    )

    # Release: the record stays quarantined for the grace period, then it is purged.
    sandbox.delete_claim(NAMESPACE, "a")
    wait_for(
        lambda: f"quarantined.a{suffix}" in names(infoblox) and f"a{suffix}" not in names(infoblox),
        timeout=60,
        message="a's record quarantined",
    )
    sandbox.delete_claim(NAMESPACE, "b")
    sandbox.wait_gone(NAMESPACE)
    wait_for(
        lambda: records(infoblox) == [],
        timeout=60,
        message="every quarantined record purged after the grace period",
    )
    assert records(infoblox) == []  # 0 leaked records
