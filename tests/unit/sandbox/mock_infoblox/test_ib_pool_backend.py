"""The Infoblox client against the mock grid: several networks, requested addresses,
quarantine and entries(), with records edited behind the client's back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from ib_helpers import PASSWORD, USER

from backends.base import EntryOwner, SubnetRef, quarantined_until
from backends.errors import AddressUnavailableError, SubnetExhaustedError
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy
from mock_infoblox import InfobloxStore, MockInfobloxServer

#: This management cluster and a claim of it (the owner written on the entries).
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "default/c")


NET1, NET2 = "10.40.0.0/29", "10.41.0.0/29"
POOL_SEED: dict[str, Any] = {
    "users": {USER: PASSWORD},
    "extensible_attributes": ["Owner"],
    "zones": [{"fqdn": "k8s.example.com", "view": "default"}],
    "networks": [
        {"network": NET1, "gateway": "10.40.0.1"},
        {"network": NET2, "gateway": "10.41.0.1"},
        {"network": "10.42.0.0/24"},
        {"network": "2001:db8:40::/126"},
    ],
}
#: 2026-11-24T06:00:00Z
UNTIL = 1795500000.0


@pytest.fixture
def pool_store(server: MockInfobloxServer) -> InfobloxStore:
    server.store.reset()
    server.store.seed(POOL_SEED)
    server.faults.reset()
    return server.store


@pytest.fixture
def make(server: MockInfobloxServer, pool_store: InfobloxStore) -> Iterator[Any]:
    made: list[InfobloxBackend] = []

    def factory(**overrides: Any) -> InfobloxBackend:
        values: dict[str, Any] = {
            "endpoint": server.url,
            "subnets": (SubnetRef(cidr=NET1), SubnetRef(cidr=NET2, gateway="10.41.0.6", prefix=24)),
            "username": USER,
            "password": PASSWORD,
            "extensible_attributes": {"Owner": "capi"},
            "retry": RetryPolicy(attempts=2, initial_delay_seconds=0.01, sleep=lambda _: None),
        }
        values.update(overrides)
        backend = InfobloxBackend(InfobloxConfig(**values))
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


def test_first_network_fills_then_the_second_with_its_facts(
    make: Any, pool_store: InfobloxStore
) -> None:
    backend = make()
    got = [backend.allocate(f"m{i}.ns1", OWNER) for i in range(9)]

    # NET1: .2-.6 (the routers gateway .1 is never handed out); NET2: .2-.5 (.1 routers,
    # .6 the override).
    assert [a.address for a in got] == [
        *(f"10.40.0.{i}" for i in range(2, 7)),
        *(f"10.41.0.{i}" for i in range(2, 6)),
    ]
    assert {(a.subnet, a.prefix, a.gateway) for a in got[:5]} == {(NET1, 29, "10.40.0.1")}
    assert {(a.subnet, a.prefix, a.gateway) for a in got[5:]} == {(NET2, 24, "10.41.0.6")}
    with pytest.raises(SubnetExhaustedError):
        backend.allocate("m9.ns1", OWNER)
    assert [(s.cidr, s.used, s.free) for s in backend.describe_subnets()] == [
        (NET1, 6, 0),
        (NET2, 6, 0),
    ]
    hosts = pool_store.records(type_name="record:host", name="m5.ns1")
    assert hosts[0]["extattrs"] == {"Owner": {"value": "capi"}}
    assert backend.find("m6.ns1") == got[6]


def test_requested_address_granted_held_outside_and_gateway(
    make: Any, pool_store: InfobloxStore
) -> None:
    pool_store.add_record({"name": "printer.lab", "address": "10.41.0.3"})
    backend = make()

    granted = backend.allocate("m1.ns1", OWNER, address="10.41.0.4")
    assert (granted.address, granted.subnet, granted.prefix) == ("10.41.0.4", NET2, 24)
    assert backend.allocate("m1.ns1", OWNER, address="10.41.0.4") == granted  # repeat: same entry

    with pytest.raises(AddressUnavailableError) as held:
        backend.allocate("m2.ns1", OWNER, address="10.41.0.3")
    assert held.value.holder == "printer.lab"
    with pytest.raises(AddressUnavailableError) as outside:
        backend.allocate("m2.ns1", OWNER, address="10.42.0.9")
    assert outside.value.holder is None
    with pytest.raises(AddressUnavailableError, match="never handed out"):
        backend.allocate("m2.ns1", OWNER, address="10.41.0.6")
    assert pool_store.records(name="m2.ns1") == []  # nothing registered
    # Next available skips the requested and the foreign addresses.
    assert backend.allocate("m3.ns1", OWNER).address == "10.40.0.2"


def test_requested_fixed_address_held_by_another_fixed_address(
    make: Any, pool_store: InfobloxStore
) -> None:
    pool_store.add_record({"type": "fixedaddress", "name": "ups", "address": "10.40.0.5"})
    backend = make(record_type="fixedaddress")
    with pytest.raises(AddressUnavailableError) as info:
        backend.allocate("m1.ns1", OWNER, address="10.40.0.5")
    assert info.value.holder == "ups"
    assert backend.allocate("m1.ns1", OWNER, address="10.40.0.4").address == "10.40.0.4"


def test_quarantine_keeps_the_address_until_purged(make: Any, pool_store: InfobloxStore) -> None:
    backend = make()
    first = backend.allocate("m1.ns1", OWNER)
    assert backend.release("m1.ns1", OWNER, quarantine_until=UNTIL) is True

    (record,) = pool_store.records(address=first.address)
    assert record["name"] == "quarantined.m1.ns1"
    assert quarantined_until(record["comment"]) == UNTIL
    assert record["comment"].endswith(f": ipam-bridge {CLUSTER} default/c")  # owner kept
    assert backend.find("m1.ns1") is None
    assert backend.release("m1.ns1", OWNER, quarantine_until=UNTIL) is False  # left as it is
    with pytest.raises(AddressUnavailableError, match="grace period") as info:
        backend.allocate("m1.ns1", OWNER, address=first.address)
    assert info.value.holder == "quarantined.m1.ns1"
    again = backend.allocate("m1.ns1", OWNER)
    assert again.address != first.address

    listed = {e.address: e for e in backend.entries()}
    assert listed[first.address].hostname == "quarantined.m1.ns1"
    assert listed[first.address].quarantined_until == UNTIL
    assert listed[again.address].quarantined_until is None

    assert backend.purge_quarantined(UNTIL - 1, CLUSTER) == []
    assert backend.purge_quarantined(UNTIL, CLUSTER) == [first.address]
    assert pool_store.records(address=first.address) == []
    assert backend.purge_quarantined(UNTIL, CLUSTER) == []


def test_second_quarantine_of_a_hostname_joins_the_first(
    make: Any, pool_store: InfobloxStore
) -> None:
    backend = make()
    first = backend.allocate("m1.ns1", OWNER).address
    backend.release("m1.ns1", OWNER, quarantine_until=UNTIL + 60)
    second = backend.allocate("m1.ns1", OWNER).address
    backend.release("m1.ns1", OWNER, quarantine_until=UNTIL)

    (record,) = pool_store.records(name="quarantined.m1.ns1")
    assert sorted(a["ipv4addr"] for a in record["ipv4addrs"]) == sorted([first, second])
    assert quarantined_until(record["comment"]) == UNTIL + 60
    assert pool_store.records(name="m1.ns1") == []
    assert sorted(backend.purge_quarantined(UNTIL + 60, CLUSTER)) == sorted([first, second])


def test_quarantine_in_a_dns_zone(make: Any, pool_store: InfobloxStore) -> None:
    backend = make(dns_zone="k8s.example.com")
    address = backend.allocate("m1.ns1", OWNER).address
    backend.release("m1.ns1", OWNER, quarantine_until=UNTIL)
    (record,) = pool_store.records(address=address)
    assert record["name"] == "quarantined.m1.ns1.k8s.example.com"
    (entry,) = backend.entries()
    assert entry.hostname == "quarantined.m1.ns1"


def test_entries_see_edits_behind_the_clients_back(
    server: MockInfobloxServer, make: Any, pool_store: InfobloxStore
) -> None:
    backend = make()
    kept = backend.allocate("m1.ns1", OWNER)
    renamed = backend.allocate("m2.ns1", OWNER)
    gone = backend.allocate("m3.ns1", OWNER)
    admin = f"{server.url}/_mock/records"

    assert requests.delete(admin, params={"name": "m3.ns1"}, timeout=5).status_code == 200
    patch = {"match": {"address": renamed.address}, "set": {"name": "printer-7"}}
    assert requests.patch(admin, json=patch, timeout=5).json()["name"] == "printer-7"
    added = {"type": "record:host", "name": "leftover.ns1", "address": "10.41.0.2"}
    assert requests.post(admin, json=added, timeout=5).status_code == 201

    listed = [(e.address, e.hostname, e.subnet) for e in backend.entries()]
    assert listed == [
        (kept.address, "m1.ns1", NET1),
        (renamed.address, "printer-7", NET1),
        ("10.41.0.2", "leftover.ns1", NET2),
    ]
    assert gone.address not in {a for a, _, _ in listed}
    assert backend.find("m2.ns1") is None


def test_fixed_addresses_over_ipv4_then_ipv6_with_quarantine(
    make: Any, pool_store: InfobloxStore
) -> None:
    backend = make(
        record_type="fixedaddress",
        subnets=(SubnetRef(cidr=NET1), SubnetRef(cidr="2001:db8:40::/126")),
    )
    got = [backend.allocate(f"m{i}.ns1", OWNER).address for i in range(7)]
    assert got[4:] == ["10.40.0.6", "2001:db8:40::1", "2001:db8:40::2"]
    (v6,) = pool_store.records(type_name="ipv6fixedaddress", name="m5.ns1")
    assert v6["duid"].startswith("00:04:")
    found = backend.find("m6.ns1")
    assert found is not None and (found.address, found.prefix) == ("2001:db8:40::2", 126)

    assert backend.release("m6.ns1", OWNER, quarantine_until=UNTIL) is True
    (marked,) = pool_store.records(address="2001:db8:40::2")
    assert (marked["name"], quarantined_until(marked["comment"])) == ("quarantined.m6.ns1", UNTIL)
    assert backend.find("m6.ns1") is None
    listed = [(e.hostname, e.subnet) for e in backend.entries()]
    assert listed[-2:] == [
        ("m5.ns1", "2001:db8:40::/126"),
        ("quarantined.m6.ns1", "2001:db8:40::/126"),
    ]
    assert backend.purge_quarantined(UNTIL, CLUSTER) == ["2001:db8:40::2"]
    assert backend.release("m5.ns1", OWNER) is True
    assert pool_store.records(name="m5.ns1") == []
