"""`backends.phpipam.PHPIPAMBackend` against the mock: a pool of two subnets, a requested
address, the quarantine of a released address, and edits behind the operator's back as the
drift audit sees them (``entries()``). Milliseconds each: no timers, the quarantine end is
passed in.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.base import EntryOwner, SubnetRef
from backends.errors import AddressUnavailableError, EntryOwnedError, SubnetExhaustedError
from backends.flowcontrol import FlowControl
from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from mock_phpipam import MockPhpipamServer, Store

#: This management cluster and a claim of it (the owner written on the entries).
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "default/c")


NOW = 1_800_000_000.0


@pytest.fixture
def backend(server: MockPhpipamServer) -> Iterator[PHPIPAMBackend]:
    """A pool of the /30 (subnet 9, no gateway) then the /24 (subnet 7, gateway .1)."""
    config = PHPIPAMConfig(
        endpoint=server.url,
        app_id="capi",
        username="Admin",
        password="ipamadmin",
        subnets=(SubnetRef(subnet_id=9), SubnetRef(cidr="10.20.0.0/24", prefix=23)),
        retry=RetryPolicy(attempts=3, initial_delay_seconds=0.0, sleep=lambda _: None),
    )
    with PHPIPAMBackend(config, endpoints=FlowControl()) as client:
        yield client


def test_first_subnet_fills_then_the_second_with_its_prefix_and_gateway(
    backend: PHPIPAMBackend,
) -> None:
    got = [backend.allocate(f"c{n}.default", OWNER) for n in range(3)]

    assert [(a.address, a.prefix, a.gateway, a.subnet) for a in got] == [
        ("10.20.1.1", 30, None, "10.20.1.0/30"),
        ("10.20.1.2", 30, None, "10.20.1.0/30"),
        ("10.20.0.2", 23, "10.20.0.1", "10.20.0.0/24"),
    ]
    first, second = backend.describe_subnets()
    assert (first.cidr, first.used, first.free) == ("10.20.1.0/30", 2, 0)
    assert (second.cidr, second.prefix, second.used, second.free) == ("10.20.0.0/24", 23, 2, 252)
    assert backend.find("c0.default") == got[0]
    assert backend.allocate("c2.default", OWNER) == got[2]


def test_pool_exhausted_only_when_both_subnets_are_full(
    backend: PHPIPAMBackend, store: Store
) -> None:
    for n in range(2, 255):
        store.add_address(7, f"10.20.0.{n}", hostname=f"filler-{n}")
    backend.allocate("a.default", OWNER)
    backend.allocate("b.default", OWNER)

    with pytest.raises(SubnetExhaustedError, match="all 2 subnets"):
        backend.allocate("c.default", OWNER)


def test_requested_address_granted_repeated_held_and_outside(
    backend: PHPIPAMBackend, store: Store
) -> None:
    granted = backend.allocate("static.default", OWNER, address="10.20.0.50")
    repeated = backend.allocate("static.default", OWNER, address="10.20.0.50")
    with pytest.raises(AddressUnavailableError) as held:
        backend.allocate("other.default", OWNER, address="10.20.0.50")
    with pytest.raises(AddressUnavailableError) as outside:
        backend.allocate("other.default", OWNER, address="10.20.2.5")

    assert (granted.address, granted.prefix, granted.subnet) == ("10.20.0.50", 23, "10.20.0.0/24")
    assert repeated.ref == granted.ref
    assert (held.value.holder, outside.value.holder) == ("static.default", None)
    assert [a.hostname for a in store.search_ip(store.locate("10.20.0.50").ip)] == [
        "static.default"
    ]
    assert store.search_hostname("other.default") == []


def test_quarantined_address_is_skipped_until_purged(backend: PHPIPAMBackend) -> None:
    first = backend.allocate("a.default", OWNER)
    backend.allocate("b.default", OWNER)

    assert backend.release("a.default", OWNER, quarantine_until=NOW + 60) is True
    assert backend.find("a.default") is None
    replacement = backend.allocate("a.default", OWNER)
    held = [e for e in backend.entries() if e.quarantined_until is not None]

    assert first.address == "10.20.1.1"
    assert replacement.address == "10.20.0.2"  # the /30 is full: its quarantined row counts
    assert [(e.address, e.hostname, e.quarantined_until) for e in held] == [
        ("10.20.1.1", "quarantined.a.default", NOW + 60)
    ]
    assert backend.describe_subnets()[0].used == 2
    assert backend.purge_quarantined(NOW, CLUSTER) == []
    assert backend.purge_quarantined(NOW + 60, CLUSTER) == ["10.20.1.1"]
    assert backend.allocate("c.default", OWNER).address == "10.20.1.1"


def test_entries_see_edits_behind_the_operators_back_with_one_list_per_subnet(
    backend: PHPIPAMBackend, store: Store
) -> None:
    backend.allocate("a.default", OWNER)
    backend.allocate("b.default", OWNER)
    kept = backend.allocate("c.default", OWNER)
    store.remove_address("10.20.1.1")
    store.edit_address("10.20.1.2", {"hostname": "printer"})
    store.add_address(7, "10.20.0.99", hostname="someone", description="by hand")
    store.clear_journal()

    found = {e.address: (e.hostname, e.description, e.subnet) for e in backend.entries()}

    assert found == {
        "10.20.1.2": ("printer", "ipam-bridge default/c", "10.20.1.0/30"),
        "10.20.0.1": ("gw.capi-test", "gateway", "10.20.0.0/24"),
        kept.address: ("c.default", "ipam-bridge default/c", "10.20.0.0/24"),
        "10.20.0.99": ("someone", "by hand", "10.20.0.0/24"),
    }
    assert [e.path for e in store.requests()] == [
        "/api/capi/subnets/9/addresses/",
        "/api/capi/subnets/7/addresses/",
    ]
    owners = {e.address: e.owner for e in backend.entries()}
    assert owners[kept.address] == owners["10.20.1.2"] == OWNER  # the note, kept by the mock
    assert owners["10.20.0.99"] is None


def test_two_management_clusters_share_the_mock_without_taking_each_others_entries(
    backend: PHPIPAMBackend, store: Store
) -> None:
    other = EntryOwner("a-second-cluster", OWNER.claim)
    mine = backend.allocate("m1.default", OWNER)

    with pytest.raises(EntryOwnedError) as raised:
        backend.allocate("m1.default", other)  # same names, no hostnameSuffix
    assert (raised.value.address, raised.value.owner) == (mine.address, OWNER)
    assert backend.release("m1.default", other) is False
    assert backend.purge_quarantined(NOW, other.cluster_id) == []

    # A network team's reservation is adopted and stamped with the owner (one PATCH).
    store.add_address(7, "10.20.0.77", hostname="vip.default", description="reserved")
    adopted = backend.allocate("vip.default", other)
    [row] = [r for r in store.requests() if r.method == "PATCH"]
    assert adopted.address == "10.20.0.77" and adopted.owner == other
    assert {e.address: e.owner for e in backend.entries()}["10.20.0.77"] == other
    assert row.path.startswith("/api/capi/addresses/")
    assert backend.release("m1.default", OWNER) is True
