"""Infoblox client: pools of several networks, requested addresses, quarantine, entries().

Against `responses` with the WAPI shapes of reference/backends.md B (record:host,
fixedaddress, ipv4address, network, paging, error bodies).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import responses
from responses import matchers
from wapi_requests import add_fixed_search, assert_grid_accepts

from backends.base import (
    Allocation,
    EntryOwner,
    SubnetInfo,
    SubnetRef,
    quarantine_mark,
    quarantined_until,
)
from backends.errors import (
    AddressUnavailableError,
    EntryOwnedError,
    SubnetExhaustedError,
    SubnetNotFoundError,
)
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy

#: This management cluster (the uid of its kube-system namespace) and a claim of it.
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "ns1/m1")
COMMENT = f"ipam-bridge {CLUSTER} ns1/m1"
#: The previous release's comment ``ipam-bridge ns1/m1`` names this owner.
PREVIOUS = EntryOwner("", "ns1/m1")

GM = "https://gm.example.com"
WAPI = f"{GM}/wapi/v2.12"
NET1, NET2 = "10.20.0.0/24", "10.30.0.0/28"
#: The second network overrides gateway and prefix (a spec.subnets entry).
SUBNETS = (SubnetRef(cidr=NET1), SubnetRef(cidr=NET2, gateway="10.30.0.14", prefix=26))
HOST_FIELDS = "name,view,comment,ipv4addrs,ipv6addrs"
PAGING = {"_paging": "1", "_max_results": "1000", "_return_as_object": "1"}
EXHAUSTED = {
    "Error": "AdmConDataError: None (IBDataError: IB.Data:Cannot find 1 available IP "
    "address(es) in this network.)",
    "code": "Client.Ibap.Data",
    "text": "Cannot find 1 available IP address(es) in this network.",
}
#: 2026-11-24T06:00:00Z
UNTIL = 1795500000.0


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    """`responses` mock; afterwards every request sent must be one a WAPI 2.12 grid accepts."""
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock
        assert_grid_accepts(mock.calls)


@pytest.fixture
def make(sleeps: list[float]) -> Iterator[Any]:
    made: list[InfobloxBackend] = []

    def factory(**overrides: Any) -> InfobloxBackend:
        values: dict[str, Any] = {
            "endpoint": GM,
            "subnets": SUBNETS,
            "username": "capi",
            "password": "s3cr3t-Pa55",
            "retry": RetryPolicy(attempts=3, initial_delay_seconds=0.01, sleep=sleeps.append),
        }
        values.update(overrides)
        backend = InfobloxBackend(InfobloxConfig(**values), session=requests.Session())
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend._session.close()


def body_of(call: Any) -> Any:
    return json.loads(call.request.body)


def methods(rsps: responses.RequestsMock) -> list[str]:
    return [str(c.request.method) for c in rsps.calls]


def add_network(
    rsps: responses.RequestsMock, cidr: str, routers: str | None = None, *, found: bool = True
) -> None:
    options = [{"name": "routers", "num": 3, "use_option": True, "value": routers}]
    record = {
        "_ref": f"network/ZG5z:{cidr}/default",
        "network": cidr,
        "network_view": "default",
        "options": options if routers else [],
    }
    query = {
        "network": cidr,
        "network_view": "default",
        "_return_fields": "network,network_view,options",
    }
    rsps.get(
        f"{WAPI}/network",
        match=[matchers.query_param_matcher(query)],
        json=[record] if found else [],
    )


def host(name: str, *addresses: str, comment: str = "", ref: str | None = None) -> dict[str, Any]:
    ref = ref or f"record:host/ZG5zLmhvc3Q{name.encode().hex()}:{name}/%20"
    return {
        "_ref": ref,
        "name": name,
        "view": " ",
        "comment": comment,
        "ipv4addrs": [
            {
                "_ref": f"record:host_ipv4addr/ZG5z:{a}/{name}/%20",
                "configure_for_dhcp": False,
                "host": name,
                "ipv4addr": a,
            }
            for a in addresses
        ],
    }


def add_search(rsps: responses.RequestsMock, name: str, records: list[dict[str, Any]]) -> None:
    query = {"name": name, "network_view": "default", "_return_fields": HOST_FIELDS}
    rsps.get(f"{WAPI}/record:host", match=[matchers.query_param_matcher(query)], json=records)


def add_address_use(
    rsps: responses.RequestsMock,
    address: str,
    *,
    names: list[str] | None = None,
    objects: list[str] | None = None,
) -> None:
    query = {
        "ip_address": address,
        "network_view": "default",
        "_return_fields": "ip_address,status,names,objects,types",
    }
    used = bool(objects or names)
    item = {
        "_ref": f"ipv4address/Li5pcHY0X2FkZHJlc3Mk:{address}",
        "ip_address": address,
        "status": "USED" if used else "UNUSED",
        "names": names or [],
        "objects": objects or [],
        "types": ["HOST"] if used else [],
    }
    rsps.get(f"{WAPI}/ipv4address", match=[matchers.query_param_matcher(query)], json=[item])


def add_listing(rsps: responses.RequestsMock, cidr: str, pages: list[list[dict[str, Any]]]) -> None:
    """Answer the listing of ``cidr``'s host records: the used addresses, then each record.

    ``network`` is not a search field of record:host at WAPI 2.12: the client pages through
    ``ipv4address?network=<cidr>&status=USED`` and reads each host record its ``objects``
    name.
    """
    base = {
        "network": cidr,
        "network_view": "default",
        "status": "USED",
        "_return_fields": "ip_address,objects",
    } | PAGING
    network = ipaddress.ip_network(cidr)
    for number, page in enumerate(pages):
        query = base | ({"_page_id": f"789c:{cidr}:{number}"} if number else {})
        items = [
            {
                "_ref": f"ipv4address/x:{a['ipv4addr']}",
                "ip_address": a["ipv4addr"],
                "objects": [r["_ref"]],
            }
            for r in page
            for a in r["ipv4addrs"]
            if ipaddress.ip_address(a["ipv4addr"]) in network
        ]
        answer: dict[str, Any] = {"result": items}
        if number + 1 < len(pages):
            answer["next_page_id"] = f"789c:{cidr}:{number + 1}"
        rsps.get(f"{WAPI}/ipv4address", match=[matchers.query_param_matcher(query)], json=answer)
        for record in page:
            rsps.get(
                f"{WAPI}/{record['_ref']}",
                match=[matchers.query_param_matcher({"_return_fields": HOST_FIELDS})],
                json=record,
            )


# ------------------------------------------------------------------------------ config


def test_config_single_subnet_form_is_a_list_of_one() -> None:
    config = InfobloxConfig(
        endpoint=GM,
        subnet="10.20.0.0/24",
        gateway="10.20.0.254",
        prefix=22,
        username="u",
        password="p",
    )
    assert config.subnets == (SubnetRef(cidr=NET1, gateway="10.20.0.254", prefix=22),)
    assert config.subnet == NET1


def test_config_subnets_are_normalised_and_pool_overrides_fold_in() -> None:
    config = InfobloxConfig(
        endpoint=GM,
        subnets=(SubnetRef(cidr="2001:DB8:20::/64"), SubnetRef(cidr=NET1, gateway="10.20.0.9")),
        gateway=None,
        prefix=None,
        username="u",
        password="p",
    )
    assert [(s.cidr, s.gateway) for s in config.subnets] == [
        ("2001:db8:20::/64", None),
        (NET1, "10.20.0.9"),
    ]
    assert config.subnet == "2001:db8:20::/64"
    folded = InfobloxConfig(
        endpoint=GM,
        subnets=(SubnetRef(cidr=NET1), SubnetRef(cidr=NET2, prefix=27)),
        prefix=23,
        username="u",
        password="p",
    )
    assert [s.prefix for s in folded.subnets] == [23, 27]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of subnet"),
        ({"subnet": NET1, "subnets": SUBNETS}, "exactly one of subnet"),
        ({"subnets": tuple(SubnetRef(cidr=f"10.{i}.0.0/24") for i in range(33))}, "at most 32"),
        ({"subnets": (SubnetRef(subnet_id=7),)}, "named by its CIDR"),
        ({"subnets": (SubnetRef(cidr=NET1), SubnetRef(cidr="10.20.0.128/25"))}, "overlap"),
        ({"subnets": (SubnetRef(cidr=NET1, gateway="2001:db8::1"),)}, "address families"),
        ({"subnets": (SubnetRef(cidr=NET1, prefix=33),)}, "not in 0-32"),
    ],
)
def test_config_refuses_bad_subnets(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InfobloxConfig(endpoint=GM, username="u", password="p", **kwargs)


# ------------------------------------------------------------------------------ allocate


def test_allocate_skips_a_full_network_and_uses_the_next_ones_prefix_and_gateway(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    rsps.post(f"{WAPI}/record:host", status=400, json=EXHAUSTED)
    add_network(rsps, NET2, routers="10.30.0.1")
    created = host("m1.ns1", "10.30.0.2", comment="ipam-bridge ns1/m1")
    rsps.post(f"{WAPI}/record:host", status=201, json=created)

    allocation = make().allocate("m1.ns1", OWNER)

    assert allocation == Allocation(
        address="10.30.0.2",
        prefix=26,
        gateway="10.30.0.14",
        hostname="m1.ns1",
        ref=created["_ref"],
        subnet=NET2,
        description=COMMENT,
        owner=OWNER,
    )
    assert methods(rsps) == ["GET", "GET", "POST", "GET", "POST"]
    first, second = (body_of(c) for c in rsps.calls if c.request.method == "POST")
    params = [b["ipv4addrs"][0]["ipv4addr"]["_object_parameters"] for b in (first, second)]
    assert params == [
        {"network": NET1, "network_view": "default"},
        {"network": NET2, "network_view": "default"},
    ]
    # The second network excludes both its override and its routers option.
    assert second["ipv4addrs"][0]["ipv4addr"]["_parameters"]["exclude"] == [
        "10.30.0.1",
        "10.30.0.14",
    ]
    assert sleeps == []  # a full network is not retried


def test_allocate_exhausted_only_when_every_network_is_full(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1)
    rsps.post(f"{WAPI}/record:host", status=400, json=EXHAUSTED)
    add_network(rsps, NET2)
    rsps.post(f"{WAPI}/record:host", status=400, json=EXHAUSTED)

    with pytest.raises(SubnetExhaustedError) as info:
        make().allocate("m1.ns1", OWNER)

    assert NET1 in info.value.message and NET2 in info.value.message
    assert info.value.status == 400
    assert sleeps == []
    assert methods(rsps).count("POST") == 2


def test_allocate_missing_second_network_is_subnet_not_found(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1)
    rsps.post(f"{WAPI}/record:host", status=400, json=EXHAUSTED)
    add_network(rsps, NET2, found=False)
    with pytest.raises(SubnetNotFoundError, match=r"10\.30\.0\.0/28"):
        make().allocate("m1.ns1", OWNER)


# ------------------------------------------------------------------------------ find


def test_find_searches_once_across_networks_with_that_networks_facts(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host("m1.ns1", "192.0.2.5", "10.30.0.3", comment="ipam-bridge ns1/m1")
    add_search(rsps, "m1.ns1", [record])
    add_network(rsps, NET2, routers="10.30.0.1")

    found = make().find("m1.ns1")

    assert found == Allocation(
        address="10.30.0.3",
        prefix=26,
        gateway="10.30.0.14",
        hostname="m1.ns1",
        ref=record["_ref"],
        subnet=NET2,
        description="ipam-bridge ns1/m1",
        owner=PREVIOUS,
    )
    assert methods(rsps) == ["GET", "GET"]  # one search, one read of the network's routers


def test_find_prefers_the_first_network(rsps: responses.RequestsMock, make: Any) -> None:
    add_search(rsps, "m1.ns1", [host("m1.ns1", "10.30.0.2", "10.20.0.77")])
    add_network(rsps, NET2)
    add_network(rsps, NET1)
    found = make().find("m1.ns1")
    assert found is not None and (found.address, found.subnet) == ("10.20.0.77", NET1)


def test_find_ignores_a_quarantined_record(rsps: responses.RequestsMock, make: Any) -> None:
    marked = host("m1.ns1", "10.20.0.9", comment=quarantine_mark(UNTIL, "ipam-bridge ns1/m1"))
    add_search(rsps, "m1.ns1", [marked])
    assert make().find("m1.ns1") is None


# ------------------------------------------------------------------------------ requested


def test_requested_address_is_created_explicitly_and_checked(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET2, routers="10.30.0.1")
    add_address_use(rsps, "10.30.0.9")
    created = host("m1.ns1", "10.30.0.9", comment=COMMENT)
    rsps.post(f"{WAPI}/record:host", status=201, json=created)
    add_address_use(rsps, "10.30.0.9", names=["m1.ns1"], objects=[created["_ref"]])

    allocation = make(extensible_attributes={"Owner": "capi"}).allocate(
        "m1.ns1", OWNER, address="10.30.0.9"
    )

    assert (allocation.address, allocation.prefix, allocation.gateway, allocation.subnet) == (
        "10.30.0.9",
        26,
        "10.30.0.14",
        NET2,
    )
    (post,) = [c for c in rsps.calls if c.request.method == "POST"]
    assert body_of(post) == {
        "name": "m1.ns1",
        "comment": COMMENT,
        "ipv4addrs": [{"ipv4addr": "10.30.0.9", "configure_for_dhcp": False}],
        "configure_for_dns": False,
        "network_view": "default",
        "extattrs": {"Owner": {"value": "capi"}},
    }


def test_requested_address_held_names_the_holder_and_registers_nothing(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    add_address_use(rsps, "10.20.0.7", names=["printer.lab"], objects=["record:host/x:printer"])

    with pytest.raises(AddressUnavailableError) as info:
        make().allocate("m1.ns1", OWNER, address="10.20.0.7")

    assert (info.value.address, info.value.holder) == ("10.20.0.7", "printer.lab")
    assert "10.20.0.7" in info.value.message and "printer.lab" in info.value.message
    assert "POST" not in methods(rsps)


def test_requested_address_outside_the_pool_is_refused_without_a_request(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_search(rsps, "m1.ns1", [])
    with pytest.raises(AddressUnavailableError) as info:
        make().allocate("m1.ns1", OWNER, address="10.99.0.5")
    assert (info.value.address, info.value.holder) == ("10.99.0.5", None)
    assert "outside every network" in info.value.message
    assert methods(rsps) == ["GET"]


@pytest.mark.parametrize("address", ["10.20.0.1", "10.20.0.0", "10.20.0.255"])
def test_requested_gateway_network_or_broadcast_is_refused(
    rsps: responses.RequestsMock, make: Any, address: str
) -> None:
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    with pytest.raises(AddressUnavailableError, match="never handed out") as info:
        make().allocate("m1.ns1", OWNER, address=address)
    assert info.value.holder is None
    assert "POST" not in methods(rsps)


def test_requested_address_already_ours_is_returned(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host("m1.ns1", "10.20.0.7", comment=COMMENT)
    add_search(rsps, "m1.ns1", [record])
    add_network(rsps, NET1, routers="10.20.0.1")
    allocation = make().allocate("m1.ns1", OWNER, address="10.20.0.7")
    assert (allocation.address, allocation.ref) == ("10.20.0.7", record["_ref"])
    assert methods(rsps) == ["GET", "GET"]


def test_requested_address_when_hostname_holds_another_is_refused(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_search(rsps, "m1.ns1", [host("m1.ns1", "10.20.0.7")])
    add_network(rsps, NET1, routers="10.20.0.1")
    with pytest.raises(AddressUnavailableError, match=r"already holds 10\.20\.0\.7"):
        make().allocate("m1.ns1", OWNER, address="10.20.0.8")
    assert "POST" not in methods(rsps)


def test_requested_host_address_shared_after_create_is_given_back(
    rsps: responses.RequestsMock, make: Any
) -> None:
    """WAPI accepts a host record on a used address: a racing writer is caught afterwards."""
    add_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    add_address_use(rsps, "10.20.0.7")
    created = host("m1.ns1", "10.20.0.7")
    rsps.post(f"{WAPI}/record:host", status=201, json=created)
    add_address_use(
        rsps,
        "10.20.0.7",
        names=["other.lab", "m1.ns1"],
        objects=["record:host/b3RoZXI:other.lab/%20", created["_ref"]],
    )
    rsps.delete(f"{WAPI}/{created['_ref']}", json=created["_ref"])

    with pytest.raises(AddressUnavailableError) as info:
        make().allocate("m1.ns1", OWNER, address="10.20.0.7")

    assert info.value.holder == "other.lab"
    assert methods(rsps)[-1] == "DELETE"


def test_requested_fixed_address_conflict_names_the_holder(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_fixed_search(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    add_address_use(rsps, "10.20.0.7")
    conflict = {
        "Error": "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:Fixed address "
        "10.20.0.7 already exists in network view default.)",
        "code": "Client.Ibap.Data.Conflict",
        "text": "Fixed address 10.20.0.7 already exists in network view default.",
    }
    rsps.post(f"{WAPI}/fixedaddress", status=400, json=conflict)
    add_address_use(rsps, "10.20.0.7", names=["racer.lab"], objects=["fixedaddress/x:10.20.0.7"])

    with pytest.raises(AddressUnavailableError) as info:
        make(record_type="fixedaddress").allocate("m1.ns1", OWNER, address="10.20.0.7")

    assert info.value.holder == "racer.lab"
    (post,) = [c for c in rsps.calls if c.request.method == "POST"]
    assert body_of(post)["ipv4addr"] == "10.20.0.7"
    assert body_of(post)["mac"] == "00:00:00:00:00:00"


# ------------------------------------------------------------------------------ quarantine


def test_release_with_quarantine_renames_and_marks_the_record(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host("m1.ns1", "10.30.0.2", comment="ipam-bridge ns1/m1")
    add_search(rsps, "m1.ns1", [record])
    rsps.put(f"{WAPI}/{record['_ref']}", json="record:host/ZG5z:quarantined.m1.ns1/%20")

    assert make().release("m1.ns1", OWNER, quarantine_until=UNTIL) is True

    (put,) = [c for c in rsps.calls if c.request.method == "PUT"]
    assert body_of(put) == {
        "name": "quarantined.m1.ns1",
        "comment": "ipam-bridge quarantined until 2026-11-24T06:00:00Z: ipam-bridge ns1/m1",
    }
    assert quarantined_until(body_of(put)["comment"]) == UNTIL


def test_release_with_quarantine_in_a_dns_zone_keeps_the_zone(
    rsps: responses.RequestsMock, make: Any
) -> None:
    fqdn = "m1.ns1.k8s.example.com"
    record = host(fqdn, "10.20.0.5") | {"view": "internal"}
    query = {"name": fqdn, "view": "internal", "_return_fields": HOST_FIELDS}
    rsps.get(f"{WAPI}/record:host", match=[matchers.query_param_matcher(query)], json=[record])
    rsps.put(f"{WAPI}/{record['_ref']}", json=record["_ref"])

    backend = make(dns_zone="k8s.example.com", dns_view="internal")
    assert backend.release("m1.ns1", OWNER, quarantine_until=UNTIL) is True

    (put,) = [c for c in rsps.calls if c.request.method == "PUT"]
    assert body_of(put)["name"] == "quarantined.m1.ns1.k8s.example.com"


def test_release_with_quarantine_merges_into_an_existing_quarantined_record(
    rsps: responses.RequestsMock, make: Any
) -> None:
    """Host names are unique per view: a second quarantine of one hostname joins the first."""
    record = host("m1.ns1", "10.20.0.9", comment="ipam-bridge ns1/m1")
    older = host(
        "quarantined.m1.ns1",
        "10.20.0.4",
        comment=quarantine_mark(UNTIL + 600, "ipam-bridge ns1/m1"),
        ref="record:host/cXVhcmFudGluZWQ:quarantined.m1.ns1/%20",
    )
    add_search(rsps, "m1.ns1", [record])
    taken = {
        "Error": "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:The record "
        "'quarantined.m1.ns1' already exists.)",
        "code": "Client.Ibap.Data.Conflict",
        "text": "The record 'quarantined.m1.ns1' already exists.",
    }
    rsps.put(f"{WAPI}/{record['_ref']}", status=400, json=taken)
    query = {"name": "quarantined.m1.ns1", "network_view": "default", "_return_fields": HOST_FIELDS}
    rsps.get(f"{WAPI}/record:host", match=[matchers.query_param_matcher(query)], json=[older])
    rsps.put(f"{WAPI}/{older['_ref']}", json=older["_ref"])
    rsps.delete(f"{WAPI}/{record['_ref']}", json=record["_ref"])

    assert make().release("m1.ns1", OWNER, quarantine_until=UNTIL) is True

    merged = body_of(rsps.calls[3])
    assert [a["ipv4addr"] for a in merged["ipv4addrs"]] == ["10.20.0.4", "10.20.0.9"]
    assert all("_ref" not in a and "host" not in a for a in merged["ipv4addrs"])
    assert quarantined_until(merged["comment"]) == UNTIL + 600  # the later end wins
    assert methods(rsps) == ["GET", "PUT", "GET", "PUT", "DELETE"]


def test_quarantine_merge_repeated_after_a_lost_answer_adds_nothing_twice(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host("m1.ns1", "10.20.0.9")
    older = host(
        "quarantined.m1.ns1",
        "10.20.0.4",
        "10.20.0.9",  # the first merge went through, its DELETE's answer was lost
        comment=quarantine_mark(UNTIL),
        ref="record:host/cXVhcmFudGluZWQ:quarantined.m1.ns1/%20",
    )
    add_search(rsps, "m1.ns1", [record])
    taken = {
        "Error": "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:The record "
        "'quarantined.m1.ns1' already exists.)",
        "code": "Client.Ibap.Data.Conflict",
        "text": "The record 'quarantined.m1.ns1' already exists.",
    }
    rsps.put(f"{WAPI}/{record['_ref']}", status=400, json=taken)
    query = {"name": "quarantined.m1.ns1", "network_view": "default", "_return_fields": HOST_FIELDS}
    rsps.get(f"{WAPI}/record:host", match=[matchers.query_param_matcher(query)], json=[older])
    rsps.put(f"{WAPI}/{older['_ref']}", json=older["_ref"])
    rsps.delete(f"{WAPI}/{record['_ref']}", status=404, json={"code": "Client.Ibap.Data.NotFound"})

    assert make().release("m1.ns1", OWNER, quarantine_until=UNTIL) is True

    merged = body_of(rsps.calls[3])
    assert [a["ipv4addr"] for a in merged["ipv4addrs"]] == ["10.20.0.4", "10.20.0.9"]


def test_release_without_grace_still_deletes(rsps: responses.RequestsMock, make: Any) -> None:
    record = host("m1.ns1", "10.20.0.9")
    add_search(rsps, "m1.ns1", [record])
    rsps.delete(f"{WAPI}/{record['_ref']}", json=record["_ref"])
    assert make().release("m1.ns1", OWNER) is True


def test_purge_deletes_only_records_whose_quarantine_ended(
    rsps: responses.RequestsMock, make: Any
) -> None:
    ended = host("quarantined.a.ns1", "10.20.0.5", comment=quarantine_mark(UNTIL - 1))
    running = host("quarantined.b.ns1", "10.20.0.6", comment=quarantine_mark(UNTIL + 60))
    exact = host("quarantined.d.ns1", "10.30.0.2", comment=quarantine_mark(UNTIL))
    elsewhere = host("quarantined.e.ns1", "192.0.2.7", comment=quarantine_mark(UNTIL - 1))
    # One paged search for the view's quarantined host records (not one per live record).
    query = {
        "name~": "^quarantined[.]",
        "network_view": "default",
        "_return_fields": HOST_FIELDS,
    } | PAGING
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(query)],
        json={"result": [ended, running], "next_page_id": "789c:1"},
    )
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(query | {"_page_id": "789c:1"})],
        json={"result": [exact, elsewhere]},
    )
    rsps.delete(f"{WAPI}/{ended['_ref']}", json=ended["_ref"])
    rsps.delete(f"{WAPI}/{exact['_ref']}", json=exact["_ref"])

    assert make().purge_quarantined(UNTIL, CLUSTER) == ["10.20.0.5", "10.30.0.2"]
    assert methods(rsps) == ["GET", "GET", "DELETE", "DELETE"]


# ------------------------------------------------------------------------------ entries


def test_entries_lists_every_record_of_each_network_paged(
    rsps: responses.RequestsMock, make: Any
) -> None:
    ours = host("m1.ns1", "10.20.0.2", comment="ipam-bridge ns1/m1")
    printer = host("printer.lab", "10.20.0.40", "192.0.2.9", comment="")
    quarantined = host("quarantined.m2.ns1", "10.30.0.3", comment=quarantine_mark(UNTIL, "x"))
    add_listing(rsps, NET1, [[printer], [ours]])
    add_listing(rsps, NET2, [[quarantined]])
    add_network(rsps, NET1, routers="10.20.0.1")  # NET2 has a gateway override: not read

    entries = make().entries()

    assert entries == [
        Allocation(
            address="10.20.0.2",
            prefix=24,
            gateway="10.20.0.1",
            hostname="m1.ns1",
            ref=ours["_ref"],
            subnet=NET1,
            description="ipam-bridge ns1/m1",
            owner=PREVIOUS,
        ),
        Allocation(
            address="10.20.0.40",
            prefix=24,
            gateway="10.20.0.1",
            hostname="printer.lab",
            ref=printer["_ref"],
            subnet=NET1,
        ),
        Allocation(
            address="10.30.0.3",
            prefix=26,
            gateway="10.30.0.14",
            hostname="quarantined.m2.ns1",
            ref=quarantined["_ref"],
            subnet=NET2,
            description=quarantine_mark(UNTIL, "x"),
            quarantined_until=UNTIL,
        ),
    ]


def test_entries_strip_the_pool_zone_and_list_fixed_addresses(
    rsps: responses.RequestsMock, make: Any
) -> None:
    base = {"network": NET1, "network_view": "default"} | PAGING
    query = base | {"_return_fields": "name,comment,ipv4addr,network_view"}
    fixed = {
        "_ref": "fixedaddress/ZG5z:10.20.0.8/default",
        "ipv4addr": "10.20.0.8",
        "name": "m1.ns1",
        "comment": "ipam-bridge ns1/m1",
        "network_view": "default",
    }
    rsps.get(
        f"{WAPI}/fixedaddress",
        match=[matchers.query_param_matcher(query)],
        json={"result": [fixed]},
    )
    add_network(rsps, NET1)
    backend = make(record_type="fixedaddress", subnets=(SubnetRef(cidr=NET1),))
    (entry,) = backend.entries()
    assert (entry.hostname, entry.address, entry.description) == (
        "m1.ns1",
        "10.20.0.8",
        "ipam-bridge ns1/m1",
    )

    add_listing(rsps, NET1, [[host("m3.ns1.k8s.example.com", "10.20.0.3")]])
    add_network(rsps, NET1)
    zoned = make(dns_zone="k8s.example.com", subnets=(SubnetRef(cidr=NET1),))
    assert [e.hostname for e in zoned.entries()] == ["m3.ns1"]


# ------------------------------------------------------------------------------ describe


def test_describe_subnets_reports_each_network_with_its_overrides(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_network(rsps, NET1, routers="10.20.0.1")
    add_network(rsps, NET2, routers="10.30.0.1")
    for cidr, used in ((NET1, ["10.20.0.5"]), (NET2, ["10.30.0.2", "10.30.0.3"])):
        query = {
            "network": cidr,
            "network_view": "default",
            "status": "USED",
            "_return_fields": "ip_address,types",
        } | PAGING
        rsps.get(
            f"{WAPI}/ipv4address",
            match=[matchers.query_param_matcher(query)],
            json={"result": [{"_ref": f"ipv4address/x:{a}", "ip_address": a} for a in used]},
        )
    rsps.get(f"{WAPI}/range", json=[])

    infos = make().describe_subnets()

    assert infos == [
        SubnetInfo(cidr=NET1, prefix=24, gateway="10.20.0.1", total=254, used=2, free=252),
        # 10.30.0.1 (routers) and 10.30.0.14 (override) are both never handed out.
        SubnetInfo(cidr=NET2, prefix=26, gateway="10.30.0.14", total=14, used=4, free=10),
    ]


# ------------------------------------------------------------------------------ owners

OTHER = EntryOwner("a-second-cluster", "ns1/m1")
OTHER_COMMENT = "ipam-bridge a-second-cluster ns1/m1"
EA = "CAPI-Owner"
HOST_FIELDS_EA = HOST_FIELDS + ",extattrs"


def add_search_ea(rsps: responses.RequestsMock, name: str, records: list[dict[str, Any]]) -> None:
    query = {"name": name, "network_view": "default", "_return_fields": HOST_FIELDS_EA}
    rsps.get(f"{WAPI}/record:host", match=[matchers.query_param_matcher(query)], json=records)


@pytest.mark.parametrize("address", [None, "10.20.0.7"], ids=["next-available", "requested"])
def test_allocate_refuses_another_clusters_record_and_changes_nothing(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float], address: str | None
) -> None:
    add_search(rsps, "m1.ns1", [host("m1.ns1", "10.20.0.7", comment=OTHER_COMMENT)])
    add_network(rsps, NET1, routers="10.20.0.1")

    with pytest.raises(EntryOwnedError) as raised:
        make().allocate("m1.ns1", OWNER, address)

    assert (raised.value.hostname, raised.value.address, raised.value.owner) == (
        "m1.ns1",
        "10.20.0.7",
        OTHER,
    )
    assert "a-second-cluster" in raised.value.message
    assert set(methods(rsps)) == {"GET"}
    assert sleeps == []


@pytest.mark.parametrize(
    ("comment", "adopt"),
    [
        ("reserved for the mgmt VIP", None),  # a network team's reservation
        ("ipam-bridge ns1/m1", None),  # the previous release's
        (OTHER_COMMENT, "10.20.0.7"),  # moved here: the claim's IPAddress names the address
    ],
    ids=["reservation", "previous-release", "moved"],
)
def test_allocate_adopts_and_rewrites_the_comment_with_one_put(
    rsps: responses.RequestsMock, make: Any, comment: str, adopt: str | None
) -> None:
    record = host("m1.ns1", "10.20.0.7", comment=comment)
    add_search(rsps, "m1.ns1", [record])
    add_network(rsps, NET1, routers="10.20.0.1")
    rsps.put(
        f"{WAPI}/{record['_ref']}",
        match=[matchers.json_params_matcher({"comment": COMMENT})],
        json=record["_ref"],
    )

    allocation = make().allocate("m1.ns1", OWNER, adopt=adopt)

    assert (allocation.address, allocation.owner) == ("10.20.0.7", OWNER)
    assert methods(rsps) == ["GET", "GET", "PUT"]


def test_owner_extensible_attribute_is_written_read_and_kept_with_the_others(
    rsps: responses.RequestsMock, make: Any
) -> None:
    # Create: the owner EA next to the pool's EAs, and extattrs read back.
    add_search_ea(rsps, "m1.ns1", [])
    add_network(rsps, NET1, routers="10.20.0.1")
    created = host("m1.ns1", "10.20.0.2", comment=COMMENT)
    rsps.post(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher({"_return_fields": "name,comment,ipv4addrs,extattrs"})],
        status=201,
        json=created,
    )
    backend = make(owner_extensible_attribute=EA, extensible_attributes={"Site": "fra"})

    allocation = backend.allocate("m1.ns1", OWNER)

    assert allocation.owner == OWNER
    (post,) = [c for c in rsps.calls if c.request.method == "POST"]
    assert body_of(post)["extattrs"] == {
        "Site": {"value": "fra"},
        EA: {"value": f"{CLUSTER} ns1/m1"},
    }


def test_owner_extensible_attribute_decides_and_a_put_keeps_a_persons_eas(
    rsps: responses.RequestsMock, make: Any
) -> None:
    # A reservation with an EA a person set: adopted, the EAs kept (WAPI replaces them all).
    reservation = host("m1.ns1", "10.20.0.7", comment="for the VIP") | {
        "extattrs": {"Site": {"value": "fra"}, "Ticket": {"value": "NET-42"}}
    }
    taken = host("m2.ns1", "10.20.0.8", comment=COMMENT) | {
        "extattrs": {EA: {"value": "a-second-cluster ns1/m2"}}  # the EA wins over the comment
    }
    add_search_ea(rsps, "m1.ns1", [reservation])
    add_search_ea(rsps, "m2.ns1", [taken])
    add_network(rsps, NET1, routers="10.20.0.1")
    rsps.put(
        f"{WAPI}/{reservation['_ref']}",
        match=[
            matchers.json_params_matcher(
                {
                    "comment": COMMENT,
                    "extattrs": {
                        "Site": {"value": "fra"},
                        "Ticket": {"value": "NET-42"},
                        EA: {"value": f"{CLUSTER} ns1/m1"},
                    },
                }
            )
        ],
        json=reservation["_ref"],
    )
    backend = make(owner_extensible_attribute=EA)

    assert backend.allocate("m1.ns1", OWNER).owner == OWNER
    with pytest.raises(EntryOwnedError) as raised:
        backend.allocate("m2.ns1", EntryOwner(CLUSTER, "ns1/m2"))
    assert raised.value.owner == EntryOwner("a-second-cluster", "ns1/m2")


def test_release_removes_only_the_records_the_claim_owns(
    rsps: responses.RequestsMock, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = host("m1.ns1", "10.20.0.9", comment=OTHER_COMMENT)
    add_search(rsps, "m1.ns1", [theirs])

    with caplog.at_level(logging.INFO, logger="backends.infoblox"):
        assert make().release("m1.ns1", OWNER) is False
        assert make().release("m1.ns1", OWNER, quarantine_until=UNTIL) is False

    assert set(methods(rsps)) == {"GET"}
    assert "a-second-cluster" in caplog.text


def test_release_removes_another_owners_record_at_the_address_the_ipaddress_names(
    rsps: responses.RequestsMock, make: Any
) -> None:
    theirs = host("m1.ns1", "10.20.0.9", comment=OTHER_COMMENT)
    add_search(rsps, "m1.ns1", [theirs])
    rsps.delete(f"{WAPI}/{theirs['_ref']}", json=theirs["_ref"])

    assert make().release("m1.ns1", OWNER, address="10.20.0.9") is True


def test_purge_deletes_only_this_clusters_quarantined_records(
    rsps: responses.RequestsMock, make: Any
) -> None:
    ours = host("quarantined.a.ns1", "10.20.0.5", comment=quarantine_mark(UNTIL - 1, COMMENT))
    theirs = host(
        "quarantined.b.ns1", "10.20.0.6", comment=quarantine_mark(UNTIL - 1, OTHER_COMMENT)
    )
    query = {
        "name~": "^quarantined[.]",
        "network_view": "default",
        "_return_fields": HOST_FIELDS,
    } | PAGING
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(query)],
        json={"result": [ours, theirs]},
    )
    rsps.delete(f"{WAPI}/{ours['_ref']}", json=ours["_ref"])

    assert make().purge_quarantined(UNTIL, CLUSTER) == ["10.20.0.5"]
