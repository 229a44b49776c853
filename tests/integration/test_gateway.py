"""The gateway, network and broadcast addresses are never handed out (issue 9, item 4).

The real operator against the emulated Kubernetes API and the IPAM mocks over HTTP on
127.0.0.1. Both IPAMs hand out a gateway they do not know as taken: phpIPAM's first-free skips
address rows only (a pool ``gateway`` with no row in the subnet is free to it), and Infoblox's
next-available-IP ignores the DHCP ``routers`` option (the mocks reproduce both, see their
tests). In every test below the gateway is the first free address of its subnet.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from backends.phpipam import RESERVED_GATEWAY_HOSTNAME
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []

PHP = "PHPIPAMIPPool"
IB = "InfobloxIPPool"

#: A /29 in phpIPAM without any gateway row: 6 host addresses, .1 the first free one.
BARE_SUBNET_ID = 20
BARE_CIDR = ipaddress.IPv4Network("10.20.9.0/29")
BARE_GATEWAY = "10.20.9.1"


def bound_addresses(sandbox: Sandbox) -> dict[str, dict[str, Any]]:
    """Return ``{IPAddress name: spec}`` of `NAMESPACE`."""
    return {a["metadata"]["name"]: dict(a["spec"]) for a in sandbox.addresses(NAMESPACE)}


def usage(sandbox: Sandbox, pool: str, kind: str) -> dict[str, int] | None:
    return ((sandbox.pool(NAMESPACE, pool, kind) or {}).get("status") or {}).get("ipAddresses")


def fill(sandbox: Sandbox, pool: str, kind: str, count: int) -> dict[str, dict[str, Any]]:
    """Create ``count`` claims on ``pool``, wait until all are bound; return their addresses."""
    for i in range(count):
        sandbox.claim(NAMESPACE, f"n{i}", pool, kind=kind)
    sandbox.wait_claims_bound(NAMESPACE, count, timeout=60)
    return bound_addresses(sandbox)


def assert_exhausted_without_special_addresses(
    sandbox: Sandbox, pool: str, kind: str, network: ipaddress.IPv4Network
) -> None:
    """One claim more than there are addresses waits as exhausted; nothing special was used."""
    sandbox.claim(NAMESPACE, "one-too-many", pool, kind=kind)
    sandbox.wait_claim_reason(NAMESPACE, "one-too-many", "PoolExhausted", timeout=30)
    used = {spec["address"] for spec in bound_addresses(sandbox).values()}
    assert str(network.network_address) not in used
    assert str(network.broadcast_address) not in used


# ------------------------------------------------------------------------------ phpIPAM


def test_phpipam_gateway_without_a_row_is_never_handed_out(
    phpipam: MockPhpipamServer, sandbox: Sandbox
) -> None:
    phpipam.store.add_subnet(str(BARE_CIDR), section_id=3, subnet_id=BARE_SUBNET_ID)
    assert phpipam.store.gateway_of(BARE_SUBNET_ID) is None
    assert str(phpipam.store.first_free(BARE_SUBNET_ID)) == BARE_GATEWAY
    sandbox.phpipam_pool(
        NAMESPACE,
        "bare",
        endpoint=phpipam.url,
        subnet_id=BARE_SUBNET_ID,
        credentials=CREDENTIALS,
        gateway=BARE_GATEWAY,
    )
    pool = sandbox.wait_pool_ready(NAMESPACE, "bare", PHP)
    assert pool["status"]["gateway"] == BARE_GATEWAY
    # Not free even before the first allocation registers it.
    assert pool["status"]["ipAddresses"] == {"total": 6, "used": 1, "free": 5}

    addresses = fill(sandbox, "bare", PHP, 5)

    assert sorted(spec["address"] for spec in addresses.values()) == [
        f"10.20.9.{i}" for i in range(2, 7)
    ]
    assert {spec.get("gateway") for spec in addresses.values()} == {BARE_GATEWAY}
    rows = {str(a.ip): a for a in phpipam.store.subnet_addresses(BARE_SUBNET_ID)}
    gateway_row = rows[BARE_GATEWAY]
    assert gateway_row.hostname == RESERVED_GATEWAY_HOSTNAME
    assert not gateway_row.is_gateway  # a plain row: phpIPAM's own gateway setting untouched
    assert_exhausted_without_special_addresses(sandbox, "bare", PHP, BARE_CIDR)
    wait_for(
        lambda: usage(sandbox, "bare", PHP) == {"total": 6, "used": 6, "free": 0},
        timeout=15,
        message="pool usage counts the gateway row",
    )

    # Releases never take the gateway's row along.
    sandbox.delete_claim(NAMESPACE, "n0")
    wait_for(lambda: "n0" not in bound_addresses(sandbox), timeout=30, message="claim n0 released")
    assert phpipam.store.search_hostname(RESERVED_GATEWAY_HOSTNAME)


def test_phpipam_gateway_row_of_someone_else_is_left_alone(
    phpipam: MockPhpipamServer, sandbox: Sandbox
) -> None:
    """phpIPAM's own gateway (an is_gateway row) is skipped by first-free: nothing to add."""
    phpipam.store.add_subnet(
        str(BARE_CIDR), section_id=3, subnet_id=BARE_SUBNET_ID, gateway=BARE_GATEWAY
    )
    before = {str(a.ip): dict(a.values) for a in phpipam.store.subnet_addresses(BARE_SUBNET_ID)}
    sandbox.phpipam_pool(
        NAMESPACE, "gw", endpoint=phpipam.url, subnet_id=BARE_SUBNET_ID, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "gw", PHP)

    addresses = fill(sandbox, "gw", PHP, 2)

    assert sorted(spec["address"] for spec in addresses.values()) == ["10.20.9.2", "10.20.9.3"]
    assert {spec.get("gateway") for spec in addresses.values()} == {BARE_GATEWAY}
    after = {str(a.ip): dict(a.values) for a in phpipam.store.subnet_addresses(BARE_SUBNET_ID)}
    assert after[BARE_GATEWAY] == before[BARE_GATEWAY]
    assert not phpipam.store.search_hostname(RESERVED_GATEWAY_HOSTNAME)


# ------------------------------------------------------------------------------ Infoblox


def test_infoblox_routers_option_is_never_handed_out(
    infoblox: MockInfobloxServer, sandbox: Sandbox
) -> None:
    network = ipaddress.IPv4Network("10.40.0.0/29")
    # The routers option only: no object holds the gateway, next-available-IP would offer it.
    infoblox.store.seed({"networks": [{"network": str(network), "gateway": "10.40.0.1"}]})
    sandbox.infoblox_pool(
        NAMESPACE, "routers", endpoint=infoblox.url, subnet=str(network), credentials=CREDENTIALS
    )
    pool = sandbox.wait_pool_ready(NAMESPACE, "routers", IB)
    assert pool["status"]["gateway"] == "10.40.0.1"
    assert pool["status"]["ipAddresses"] == {"total": 6, "used": 1, "free": 5}

    addresses = fill(sandbox, "routers", IB, 5)

    assert sorted(spec["address"] for spec in addresses.values()) == [
        f"10.40.0.{i}" for i in range(2, 7)
    ]
    assert {spec.get("gateway") for spec in addresses.values()} == {"10.40.0.1"}
    assert_exhausted_without_special_addresses(sandbox, "routers", IB, network)
    # Nothing was registered at the gateway: it is excluded, not reserved.
    used = infoblox.store.dump()
    assert "10.40.0.1" not in str(used.get("objects", {}).get("record:host", []))


@pytest.mark.parametrize(
    ("network", "routers", "override", "first"),
    [
        ("10.40.1.0/29", None, "10.40.1.1", "10.40.1.2"),
        ("10.40.2.0/29", "10.40.2.1", "10.40.2.2", "10.40.2.3"),
        ("2001:db8:40::/64", None, "2001:db8:40::1", "2001:db8:40::2"),
    ],
    ids=["override-only", "override-and-routers", "ipv6-override"],
)
@pytest.mark.parametrize("record_type", ["host", "fixedaddress"])
def test_infoblox_gateway_override_is_never_handed_out(
    infoblox: MockInfobloxServer,
    sandbox: Sandbox,
    network: str,
    routers: str | None,
    override: str,
    first: str,
    record_type: str,
) -> None:
    seeded: dict[str, Any] = {"network": network}
    if routers:
        seeded["gateway"] = routers
    infoblox.store.seed({"networks": [seeded]})
    sandbox.infoblox_pool(
        NAMESPACE,
        "override",
        endpoint=infoblox.url,
        subnet=network,
        credentials=CREDENTIALS,
        gateway=override,
        recordType=record_type,
    )
    sandbox.wait_pool_ready(NAMESPACE, "override", IB)

    addresses = fill(sandbox, "override", IB, 2)

    taken = sorted(ipaddress.ip_address(spec["address"]) for spec in addresses.values())
    assert taken[0] == ipaddress.ip_address(first)
    assert {spec.get("gateway") for spec in addresses.values()} == {override}
    never = {override} | ({routers} if routers else set())
    assert not never & {str(a) for a in taken}
