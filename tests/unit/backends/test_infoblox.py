"""Unit tests of the Infoblox WAPI client against `responses` (shapes: reference/backends.md B)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import responses
from responses import matchers
from wapi_requests import add_fixed_search, assert_grid_accepts

from backends.base import Allocation, EntryOwner, IPAMBackend, SubnetInfo
from backends.errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    ConflictError,
    InvalidRequestError,
    SubnetExhaustedError,
    SubnetNotFoundError,
)
from backends.infoblox import InfobloxBackend, InfobloxConfig, _capacity, _duid_for
from backends.retry import RetryPolicy

#: This management cluster (the uid of its kube-system namespace) and a claim of it.
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "ns1/m1")
#: The comment OWNER's entries carry (`backends.base.owner_text`).
COMMENT = f"ipam-bridge {CLUSTER} ns1/m1"

GM = "https://gm.example.com"
WAPI = f"{GM}/wapi/v2.12"
PASSWORD = "s3cr3t-Pa55"
COOKIE = 'ibapauth="ip=10.0.0.9,client=API,group=admin-group,ctime=1700000000,timeout=600,mtime=1700000000,su=1,auth=LOCAL,user=capi,AbCdEf"'  # noqa: E501
SET_COOKIE = {"Set-Cookie": f"{COOKIE}; httponly; Path=/"}
HTML_401 = (
    '<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">\n<html><head>\n'
    "<title>401 Authorization Required</title>\n</head><body>\n"
    "<h1>Authorization Required</h1>\n</body></html>\n"
)
HTML_403 = (
    "<html><head><title>403 Forbidden</title></head><body><h1>Forbidden</h1>"
    "<p>You don't have permission to access /wapi/v2.12/record:host on this server.</p>"
    "</body></html>"
)
NEXT_V4 = "func:nextavailableip:10.20.0.0/24,default"
NEXT_V6 = "func:nextavailableip:2001:db8:20::/64,default"


def next_excluding(*exclude: str, cidr: str = "10.20.0.0/24", network: str = "network") -> Any:
    """The object-function form of next-available-IP that excludes addresses (B.5 form 2)."""
    return {
        "_object_function": "next_available_ip",
        "_object": network,
        "_object_parameters": {"network": cidr, "network_view": "default"},
        "_result_field": "ips",
        "_parameters": {"num": 1, "exclude": list(exclude)},
    }


#: What allocations in 10.20.0.0/24 send: the routers option 10.20.0.1 is excluded.
NEXT_V4_NO_GW = next_excluding("10.20.0.1")
HOST_REF = "record:host/ZG5zLmhvc3QkLl9kZWZhdWx0LmgxMA:m1.ns1/%20"
FIXED_REF = "fixedaddress/ZG5zLmZpeGVkX2FkZHJlc3MkMTAuMjAuMC4xMC4wLi4:10.20.0.10/default"
NETWORK_REF = "network/ZG5zLm5ldHdvcmskMTAuMjAuMC4wLzI0LzA:10.20.0.0/24/default"


def wapi_error(error: str, code: str, text: str) -> dict[str, str]:
    return {"Error": error, "code": code, "text": text}


EXHAUSTED = wapi_error(
    "AdmConDataError: None (IBDataError: IB.Data:Cannot find 1 available IP address(es) in "
    "this network.)",
    "Client.Ibap.Data",
    "Cannot find 1 available IP address(es) in this network.",
)
NOT_FOUND = wapi_error(
    f"AdmConDataNotFoundError: Reference {HOST_REF} not found",
    "Client.Ibap.Data.NotFound",
    f"Reference {HOST_REF} not found",
)


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
            "subnet": "10.20.0.0/24",
            "username": "capi",
            "password": PASSWORD,
            "timeout_seconds": 7.5,
            "retry": RetryPolicy(attempts=3, initial_delay_seconds=0.01, sleep=sleeps.append),
        }
        values.update(overrides)
        backend = InfobloxBackend(InfobloxConfig(**values), session=requests.Session())
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend._session.close()


def host_query(name: str, **scope: str) -> dict[str, str]:
    return {"name": name, **scope, "_return_fields": "name,view,comment,ipv4addrs,ipv6addrs"}


def network_query(cidr: str = "10.20.0.0/24", view: str = "default") -> dict[str, str]:
    return {"network": cidr, "network_view": view, "_return_fields": "network,network_view,options"}


def network_record(cidr: str = "10.20.0.0/24", routers: str | None = "10.20.0.1") -> dict[str, Any]:
    options: list[dict[str, Any]] = [
        {
            "name": "dhcp-lease-time",
            "num": 51,
            "use_option": False,
            "value": "43200",
            "vendor_class": "DHCP",
        },
    ]
    if routers is not None:
        options.append(
            {
                "name": "routers",
                "num": 3,
                "use_option": True,
                "value": routers,
                "vendor_class": "DHCP",
            }
        )
    return {"_ref": NETWORK_REF, "network": cidr, "network_view": "default", "options": options}


def add_network(rsps: responses.RequestsMock, **kwargs: Any) -> None:
    rsps.get(
        f"{WAPI}/network",
        match=[matchers.query_param_matcher(network_query())],
        json=[network_record(**kwargs)],
    )


def host_v4(
    address: str, *, name: str = "m1.ns1", ref: str = HOST_REF, comment: str | None = COMMENT
) -> dict[str, Any]:
    """A host record as WAPI returns it; ``comment`` None leaves the field out (none set)."""
    return {
        "_ref": ref,
        "name": name,
        "view": " ",
        **({"comment": comment} if comment is not None else {}),
        "ipv4addrs": [
            {
                "_ref": f"record:host_ipv4addr/ZG5zLmhvc3RfYWRkcmVzcyQ:{address}/{name}/%20",
                "configure_for_dhcp": False,
                "host": name,
                "ipv4addr": address,
            }
        ],
    }


def ref_url(ref: str) -> str:
    """URL of a WAPI ``_ref``: the ref is already URL-encoded by WAPI and sent as it is."""
    return f"{WAPI}/{ref}"


def url_of(call: Any) -> str:
    return str(call.request.url)


def kwargs_of(call: Any) -> dict[str, Any]:
    """The keyword arguments requests passed to the adapter (timeout, verify, ...)."""
    kwargs: dict[str, Any] = call.request.req_kwargs
    return kwargs


def body_of(call: Any) -> Any:
    return json.loads(call.request.body)


def post_body(rsps: responses.RequestsMock) -> Any:
    """The body of the one POST (the create) among the calls."""
    (post,) = [c for c in rsps.calls if c.request.method == "POST"]
    return body_of(post)


# ------------------------------------------------------------------------------ config


def test_config_defaults_and_repr_hide_password() -> None:
    config = InfobloxConfig(
        endpoint=f"{GM}/", subnet="2001:DB8:20::/64", username="capi", password=PASSWORD
    )
    assert config.verify is True
    assert config.wapi_version == "2.12"
    assert config.network_view == "default"
    assert config.record_type == "host"
    assert config.subnet == "2001:db8:20::/64"
    assert config.endpoint == GM
    assert PASSWORD not in repr(config)
    backend = InfobloxBackend(config)
    assert PASSWORD not in repr(backend)
    assert isinstance(backend, IPAMBackend)
    backend.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"subnet": "10.20.0.1/24"},
        {"subnet": "not-a-cidr"},
        {"record_type": "record:a"},
        {"record_type": "fixedaddress", "dns_zone": "example.com"},
        {"timeout_seconds": 0},
    ],
)
def test_config_rejects_invalid_values(overrides: dict[str, Any]) -> None:
    values: dict[str, Any] = {
        "endpoint": GM,
        "subnet": "10.20.0.0/24",
        "username": "u",
        "password": "p",
    }
    with pytest.raises(ValueError):
        InfobloxConfig(**(values | overrides))


def test_config_extensible_attributes_are_read_only() -> None:
    eas = {"Owner": "capi"}
    config = InfobloxConfig(
        endpoint=GM, subnet="10.20.0.0/24", username="u", password="p", extensible_attributes=eas
    )
    eas["Owner"] = "changed"
    assert config.extensible_attributes["Owner"] == "capi"
    with pytest.raises(TypeError):
        config.extensible_attributes["Site"] = "x"  # type: ignore[index]


# ------------------------------------------------------------------------------ find


def test_find_host_without_dns_searches_network_view_and_filters_subnet(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host_v4("10.99.0.7", comment=None)
    record["ipv4addrs"].append({"ipv4addr": "10.20.0.12", "host": "m1.ns1"})
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(host_query("m1.ns1", network_view="default"))],
        json=[record],
    )
    add_network(rsps)

    found = make().find("m1.ns1")

    assert found == Allocation(
        address="10.20.0.12",
        prefix=24,
        gateway="10.20.0.1",
        hostname="m1.ns1",
        ref=HOST_REF,
        subnet="10.20.0.0/24",
    )


def test_find_host_with_dns_zone_searches_fqdn_in_dns_view(
    rsps: responses.RequestsMock, make: Any
) -> None:
    ref = "record:host/ZG5zLmhvc3Q:m1.ns1.k8s.example.com/internal"
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(host_query("m1.ns1.k8s.example.com", view="internal"))],
        json=[host_v4("10.20.0.5", name="m1.ns1.k8s.example.com", ref=ref)],
    )
    add_network(rsps, routers="10.20.0.254, 10.20.0.253")

    found = make(dns_zone="k8s.example.com.", dns_view="internal").find("m1.ns1")

    assert found is not None
    assert (found.address, found.gateway, found.ref) == ("10.20.0.5", "10.20.0.254", ref)


def test_find_ignores_records_outside_subnet_and_returns_none(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.99.0.7")])
    assert make().find("m1.ns1") is None


def test_find_fixedaddress_filters_network_and_picks_lowest(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_fixed_search(
        rsps,
        "m1.ns1",
        [
            {"_ref": "fixedaddress/b:10.20.0.30/prod", "ipv4addr": "10.20.0.30", "name": "m1.ns1"},
            {"_ref": "fixedaddress/a:10.20.0.9/prod", "ipv4addr": "10.20.0.9", "name": "m1.ns1"},
        ],
        view="prod",
    )
    rsps.get(
        f"{WAPI}/network",
        match=[matchers.query_param_matcher(network_query(view="prod"))],
        json=[network_record(routers=None)],
    )

    found = make(record_type="fixedaddress", network_view="prod").find("m1.ns1")

    assert found is not None
    assert (found.address, found.ref, found.gateway) == (
        "10.20.0.9",
        "fixedaddress/a:10.20.0.9/prod",
        None,
    )


def test_gateway_is_read_once_and_cached(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.12")])
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.12")])
    add_network(rsps)
    backend = make()
    first, second = backend.find("m1.ns1"), backend.find("m1.ns1")
    assert first == second
    assert first is not None and first.gateway == "10.20.0.1"
    assert sum(1 for c in rsps.calls if "/network?" in url_of(c)) == 1


# ------------------------------------------------------------------------------ allocate


def test_allocate_host_v4_without_dns_is_one_create_excluding_the_gateway(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher({"_return_fields": "name,comment,ipv4addrs"})],
        status=201,
        json=host_v4("10.20.0.2"),
    )
    add_network(rsps)

    allocation = make().allocate("m1.ns1", OWNER)

    assert allocation == Allocation(
        address="10.20.0.2",
        prefix=24,
        gateway="10.20.0.1",
        hostname="m1.ns1",
        ref=HOST_REF,
        subnet="10.20.0.0/24",
        description=COMMENT,
        owner=OWNER,
    )
    posts = [c for c in rsps.calls if c.request.method == "POST"]
    assert len(posts) == 1
    assert body_of(posts[0]) == {
        "name": "m1.ns1",
        "comment": COMMENT,
        "ipv4addrs": [{"ipv4addr": NEXT_V4_NO_GW, "configure_for_dhcp": False}],
        "configure_for_dns": False,
        "network_view": "default",
    }
    assert not any("_function" in url_of(c) for c in rsps.calls)


def test_allocate_host_with_dns_zone_and_extensible_attributes(
    rsps: responses.RequestsMock, make: Any
) -> None:
    fqdn = "m1.ns1.k8s.example.com"
    ref = f"record:host/ZG5z:{fqdn}/internal"
    rsps.get(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher(host_query(fqdn, view="internal"))],
        json=[],
    )
    rsps.post(f"{WAPI}/record:host", status=201, json=host_v4("10.20.0.3", name=fqdn, ref=ref))
    add_network(rsps)
    backend = make(
        dns_zone="k8s.example.com",
        dns_view="internal",
        extensible_attributes={"Owner": "capi", "Cluster": "c1"},
    )

    long_owner = EntryOwner(CLUSTER, "ns1/" + "m" * 253)
    allocation = backend.allocate("m1.ns1", long_owner)

    assert (allocation.address, allocation.ref, allocation.hostname) == ("10.20.0.3", ref, "m1.ns1")
    body = post_body(rsps)
    assert body["name"] == fqdn
    assert body["configure_for_dns"] is True
    assert body["view"] == "internal"
    assert body["network_view"] == "default"  # the record's own network view places it
    assert body["extattrs"] == {"Owner": {"value": "capi"}, "Cluster": {"value": "c1"}}
    assert body["comment"] == f"ipam-bridge {CLUSTER} ns1/{'m' * 253}"[:256]  # WAPI's limit


def test_allocate_host_v6(rsps: responses.RequestsMock, make: Any) -> None:
    ref = "record:host/ZG5z:m6.ns1/%20"
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(
        f"{WAPI}/record:host",
        match=[matchers.query_param_matcher({"_return_fields": "name,comment,ipv6addrs"})],
        status=201,
        json={
            "_ref": ref,
            "name": "m6.ns1",
            "ipv6addrs": [{"ipv6addr": "2001:DB8:20:0::2", "host": "m6.ns1"}],
        },
    )
    rsps.get(
        f"{WAPI}/ipv6network",
        match=[matchers.query_param_matcher(network_query("2001:db8:20::/64"))],
        json=[{"_ref": "ipv6network/x", "network": "2001:db8:20::/64", "network_view": "default"}],
    )

    allocation = make(subnet="2001:db8:20::/64").allocate("m6.ns1", OWNER)

    assert allocation == Allocation(
        address="2001:db8:20::2",
        prefix=64,
        gateway=None,
        hostname="m6.ns1",
        ref=ref,
        subnet="2001:db8:20::/64",
        description=COMMENT,
        owner=OWNER,
    )
    assert post_body(rsps)["ipv6addrs"] == [{"ipv6addr": NEXT_V6, "configure_for_dhcp": False}]


def test_allocate_fixedaddress_v4(rsps: responses.RequestsMock, make: Any) -> None:
    add_fixed_search(rsps, "m1.ns1", [])
    rsps.post(
        f"{WAPI}/fixedaddress",
        match=[
            matchers.query_param_matcher({"_return_fields": "name,comment,ipv4addr,network_view"})
        ],
        status=201,
        json={
            "_ref": FIXED_REF,
            "ipv4addr": "10.20.0.10",
            "name": "m1.ns1",
            "network_view": "default",
        },
    )
    add_network(rsps)

    backend = make(record_type="fixedaddress", extensible_attributes={"Owner": "capi"})
    allocation = backend.allocate("m1.ns1", OWNER)

    assert (allocation.address, allocation.ref) == ("10.20.0.10", FIXED_REF)
    assert post_body(rsps) == {
        "name": "m1.ns1",
        "comment": COMMENT,
        "network_view": "default",
        "ipv4addr": NEXT_V4_NO_GW,
        "mac": "00:00:00:00:00:00",
        "extattrs": {"Owner": {"value": "capi"}},
    }


def test_allocate_fixedaddress_v6_sends_deterministic_duid(
    rsps: responses.RequestsMock, make: Any
) -> None:
    ref = "ipv6fixedaddress/ZG5z:2001%3Adb8%3A20%3A%3A5/default"
    add_fixed_search(rsps, "m6.ns1", [], v6=True)
    rsps.post(
        f"{WAPI}/ipv6fixedaddress",
        status=201,
        json={"_ref": ref, "ipv6addr": "2001:db8:20::5", "name": "m6.ns1"},
    )
    rsps.get(f"{WAPI}/ipv6network", json=[{"_ref": "ipv6network/x", "options": []}])

    allocation = make(subnet="2001:db8:20::/64", record_type="fixedaddress").allocate(
        "m6.ns1", OWNER
    )

    assert allocation.address == "2001:db8:20::5"
    body = post_body(rsps)
    assert body["ipv6addr"] == NEXT_V6
    assert "mac" not in body
    assert body["duid"] == _duid_for("m6.ns1")
    octets = body["duid"].split(":")
    assert octets[:2] == ["00", "04"] and len(octets) == 18  # DUID-UUID, RFC 6355
    assert _duid_for("m6.ns1") != _duid_for("m7.ns1")


def test_allocate_adopts_existing_record_without_create(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.77")])
    add_network(rsps)
    allocation = make().allocate("m1.ns1", OWNER)
    assert allocation.address == "10.20.0.77"
    assert all(c.request.method == "GET" for c in rsps.calls)


def test_allocate_reads_back_when_grid_returns_only_ref(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_fixed_search(rsps, "m1.ns1", [])
    rsps.post(f"{WAPI}/fixedaddress", status=201, json=FIXED_REF)
    rsps.get(
        ref_url(FIXED_REF),
        match=[
            matchers.query_param_matcher({"_return_fields": "name,comment,ipv4addr,network_view"})
        ],
        json={"_ref": FIXED_REF, "ipv4addr": "10.20.0.10", "name": "m1.ns1"},
    )
    add_network(rsps)
    allocation = make(record_type="fixedaddress").allocate("m1.ns1", OWNER)
    assert (allocation.address, allocation.ref) == ("10.20.0.10", FIXED_REF)


def test_allocate_exhausted_is_not_retried(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps)
    rsps.post(f"{WAPI}/record:host", status=400, json=EXHAUSTED)
    with pytest.raises(SubnetExhaustedError) as info:
        make().allocate("m1.ns1", OWNER)
    assert info.value.status == 400
    assert "Cannot find 1 available IP" in info.value.message
    assert sleeps == []
    assert len(rsps.calls) == 3


def test_allocate_host_name_used_by_foreign_record_is_invalid_request(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    conflict = wapi_error(
        "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:The record 'm1.ns1' "
        "already exists.)",
        "Client.Ibap.Data.Conflict",
        "The record 'm1.ns1' already exists.",
    )
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.99.0.7")])  # only another subnet
    add_network(rsps)
    rsps.post(f"{WAPI}/record:host", status=400, json=conflict)
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.99.0.7")])
    with pytest.raises(InvalidRequestError) as info:
        make().allocate("m1.ns1", OWNER)
    assert not isinstance(info.value, ConflictError)
    assert "m1.ns1" in info.value.message and "10.20.0.0/24" in info.value.message
    assert sleeps == []


def test_allocate_host_conflict_from_concurrent_writer_adopts_record(
    rsps: responses.RequestsMock, make: Any
) -> None:
    conflict = wapi_error(
        "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:The record 'm1.ns1' "
        "already exists.)",
        "Client.Ibap.Data.Conflict",
        "The record 'm1.ns1' already exists.",
    )
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(f"{WAPI}/record:host", status=400, json=conflict)
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.8")])
    add_network(rsps)
    assert make().allocate("m1.ns1", OWNER).address == "10.20.0.8"
    assert sum(1 for c in rsps.calls if c.request.method == "POST") == 1


def test_allocate_fixedaddress_lost_race_is_retried_with_a_new_lookup(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    conflict = wapi_error(
        "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:Fixed address "
        "10.20.0.10 already exists in network view default.)",
        "Client.Ibap.Data.Conflict",
        "Fixed address 10.20.0.10 already exists in network view default.",
    )
    add_fixed_search(rsps, "m1.ns1", [])
    rsps.post(f"{WAPI}/fixedaddress", status=400, json=conflict)
    add_fixed_search(rsps, "m1.ns1", [])
    rsps.post(
        f"{WAPI}/fixedaddress",
        status=201,
        json={"_ref": FIXED_REF, "ipv4addr": "10.20.0.11", "name": "m1.ns1"},
    )
    add_network(rsps)

    allocation = make(record_type="fixedaddress").allocate("m1.ns1", OWNER)

    assert allocation.address == "10.20.0.11"
    assert len(sleeps) == 1
    methods = [c.request.method for c in rsps.calls]
    # search, gateway, create; search, gateway (read again before every create), create
    assert methods == ["GET", "GET", "POST", "GET", "GET", "POST"]


def test_allocate_conflict_race_exhausts_attempts_as_conflict_error(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    conflict = wapi_error(
        "AdmConDataError: x", "Client.Ibap.Data.Conflict", "Fixed address x already exists."
    )
    add_network(rsps)
    for _ in range(3):
        add_fixed_search(rsps, "m1.ns1", [])
        rsps.post(f"{WAPI}/fixedaddress", status=400, json=conflict)
    with pytest.raises(ConflictError):
        make(record_type="fixedaddress").allocate("m1.ns1", OWNER)
    assert len(sleeps) == 2


def test_allocate_unknown_extensible_attribute(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps)
    rsps.post(
        f"{WAPI}/record:host",
        status=400,
        json=wapi_error(
            "AdmConProtoError: Unknown extensible attribute: Tenant",
            "Client.Ibap.Proto",
            "Unknown extensible attribute: Tenant",
        ),
    )
    with pytest.raises(InvalidRequestError) as info:
        make(extensible_attributes={"Tenant": "a"}).allocate("m1.ns1", OWNER)
    assert "'Tenant'" in info.value.message
    assert sleeps == []
    assert len(rsps.calls) == 3  # the gateway read, and no network probe for an EA error


@pytest.mark.parametrize(
    "text",
    [
        "Cannot find network 10.20.0.0/24 in network view default",
        "Network 10.20.0.0/24 not found in network view default.",
    ],
)
def test_allocate_unknown_network_by_error_text(
    rsps: responses.RequestsMock, make: Any, text: str
) -> None:
    add_fixed_search(rsps, "m1.ns1", [])
    add_network(rsps)  # the gateway read: the network was still there
    rsps.post(
        f"{WAPI}/fixedaddress",
        status=400,
        json=wapi_error(
            f"AdmConDataError: None (IBDataError: IB.Data:{text})", "Client.Ibap.Data", text
        ),
    )
    with pytest.raises(SubnetNotFoundError):
        make(record_type="fixedaddress").allocate("m1.ns1", OWNER)
    assert len(rsps.calls) == 3  # classified by text: no network probe after the create


def test_allocate_unknown_network_by_probe_after_unclassified_error(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps)  # the gateway read; the network goes before the create
    rsps.post(
        f"{WAPI}/record:host",
        status=400,
        json=wapi_error("AdmConProtoError: Invalid value", "Client.Ibap.Proto", "Invalid value"),
    )
    rsps.get(f"{WAPI}/network", match=[matchers.query_param_matcher(network_query())], json=[])
    with pytest.raises(SubnetNotFoundError) as info:
        make().allocate("m1.ns1", OWNER)
    assert "10.20.0.0/24" in info.value.message


def test_allocate_other_bad_request_stays_invalid_request(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(
        f"{WAPI}/record:host",
        status=400,
        json=wapi_error("AdmConProtoError: Invalid value", "Client.Ibap.Proto", "Invalid value"),
    )
    add_network(rsps)
    with pytest.raises(InvalidRequestError) as info:
        make().allocate("m1.ns1", OWNER)
    assert not isinstance(info.value, SubnetNotFoundError)
    assert "Invalid value" in info.value.message


def test_allocate_lost_answer_is_retried_and_adopts(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(f"{WAPI}/record:host", body=requests.ReadTimeout("read timed out"))
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2")])
    add_network(rsps)
    allocation = make().allocate("m1.ns1", OWNER)
    assert allocation.address == "10.20.0.2"
    assert len(sleeps) == 1
    assert sum(1 for c in rsps.calls if c.request.method == "POST") == 1


# ------------------------------------------------------------------------------ release


def test_release_host_deletes_record(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2")])
    rsps.delete(ref_url(HOST_REF), json=HOST_REF)
    assert make().release("m1.ns1", OWNER) is True
    assert rsps.calls[1].request.method == "DELETE"
    assert url_of(rsps.calls[1]).endswith("/record:host/ZG5zLmhvc3QkLl9kZWZhdWx0LmgxMA:m1.ns1/%20")


#: Ref formats of the WAPI documentation: the part after the colon is URL-encoded by WAPI.
IPV6_FIXED_REF = (
    "ipv6fixedaddress/ZG5zLmZpeGVkX2FkZHJlc3MkMjAwMTpkYjg6OjEwLjAuLg:2001%3Adb8%3A%3A10/default"
)
HOST_SPACES_REF = (
    "record:host/ZG5zLmhvc3QkLl9kZWZhdWx0LmNvbS5leGFtcGxl:my%20host.example.com/default"
)


def test_release_sends_an_ipv6_fixedaddress_ref_as_it_is(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_fixed_search(
        rsps,
        "m1.ns1",
        [{"_ref": IPV6_FIXED_REF, "ipv6addr": "2001:db8::10", "name": "m1.ns1"}],
        v6=True,
    )
    rsps.delete(f"{WAPI}/{IPV6_FIXED_REF}", json=IPV6_FIXED_REF)
    backend = make(subnet="2001:db8::/64", record_type="fixedaddress")
    assert backend.release("m1.ns1", OWNER) is True
    assert url_of(rsps.calls[2]) == f"{WAPI}/{IPV6_FIXED_REF}"  # %3A not encoded again


def test_release_sends_a_host_ref_with_a_space_as_it_is(
    rsps: responses.RequestsMock, make: Any
) -> None:
    name = "my host.example.com"
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2", name=name, ref=HOST_SPACES_REF)])
    rsps.delete(f"{WAPI}/{HOST_SPACES_REF}", json=HOST_SPACES_REF)
    assert make().release(name, OWNER) is True
    assert url_of(rsps.calls[1]) == f"{WAPI}/{HOST_SPACES_REF}"  # %20, never %2520


def test_a_ref_404_on_delete_is_already_gone_only_for_the_ref_sent(
    rsps: responses.RequestsMock, make: Any
) -> None:
    """The 404 that means "already gone" comes for the very ref WAPI gave, not a mangled one."""
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2", ref=HOST_SPACES_REF)])
    rsps.delete(f"{WAPI}/{HOST_SPACES_REF}", status=404, json=NOT_FOUND)
    assert make().release("m1.ns1", OWNER) is True
    assert [c.request.method for c in rsps.calls] == ["GET", "DELETE"]
    assert "%25" not in url_of(rsps.calls[1])


def test_release_is_idempotent_on_404(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2")])
    rsps.delete(ref_url(HOST_REF), status=404, json=NOT_FOUND)
    assert make().release("m1.ns1", OWNER) is True


def test_release_nothing_registered_returns_false(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.99.0.7")])
    assert make().release("m1.ns1", OWNER) is False
    assert [c.request.method for c in rsps.calls] == ["GET"]


def test_release_host_with_foreign_addresses_only_removes_ours(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = host_v4("10.20.0.2")
    record["ipv4addrs"].append(
        {
            "_ref": "record:host_ipv4addr/x",
            "ipv4addr": "10.99.0.7",
            "host": "m1.ns1",
            "configure_for_dhcp": True,
            "mac": "aa:bb:cc:dd:ee:ff",
        }
    )
    rsps.get(f"{WAPI}/record:host", json=[record])
    rsps.put(ref_url(HOST_REF), json=HOST_REF)
    assert make().release("m1.ns1", OWNER) is True
    assert body_of(rsps.calls[1]) == {
        "ipv4addrs": [
            {"ipv4addr": "10.99.0.7", "configure_for_dhcp": True, "mac": "aa:bb:cc:dd:ee:ff"}
        ]
    }


def test_release_fixedaddress_deletes_every_match(rsps: responses.RequestsMock, make: Any) -> None:
    refs = ["fixedaddress/a:10.20.0.9/default", "fixedaddress/b:10.20.0.30/default"]
    add_fixed_search(
        rsps,
        "m1.ns1",
        [
            {"_ref": refs[0], "ipv4addr": "10.20.0.9", "name": "m1.ns1"},
            {"_ref": refs[1], "ipv4addr": "10.20.0.30", "name": "m1.ns1"},
        ],
    )
    for ref in refs:
        rsps.delete(ref_url(ref), json=ref)
    assert make(record_type="fixedaddress").release("m1.ns1", OWNER) is True
    methods = sorted(str(c.request.method) for c in rsps.calls)
    assert methods == ["DELETE", "DELETE", "GET", "GET", "GET"]


# ------------------------------------------------------------------------------ describe


def test_describe_subnet_v4_pages_and_gateway_from_routers(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_network(rsps, routers="10.20.0.1,10.20.0.2")
    base = {
        "network": "10.20.0.0/24",
        "network_view": "default",
        "status": "USED",
        "_return_fields": "ip_address,types",
        "_paging": "1",
        "_max_results": "1000",
        "_return_as_object": "1",
    }

    def item(address: str, *types: str) -> dict[str, Any]:
        return {"_ref": f"ipv4address/x:{address}", "ip_address": address, "types": list(types)}

    rsps.get(
        f"{WAPI}/ipv4address",
        match=[matchers.query_param_matcher(base)],
        json={
            "result": [
                item("10.20.0.0", "NETWORK"),
                item("10.20.0.1", "HOST"),
                item("10.20.0.2", "FA"),
            ],
            "next_page_id": "789c:page2",
        },
    )
    rsps.get(
        f"{WAPI}/ipv4address",
        match=[matchers.query_param_matcher(base | {"_page_id": "789c:page2"})],
        json={"result": [item("10.20.0.3", "HOST", "A"), item("10.20.0.255", "BROADCAST")]},
    )
    rsps.get(f"{WAPI}/range", json=[])

    info = make().describe_subnets()[0]

    assert info == SubnetInfo(
        cidr="10.20.0.0/24", prefix=24, gateway="10.20.0.1", total=254, used=3, free=251
    )


def test_describe_subnet_v6_without_routers(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(
        f"{WAPI}/ipv6network",
        match=[matchers.query_param_matcher(network_query("2001:db8:20::/64", view="lab"))],
        json=[{"_ref": "ipv6network/x", "network": "2001:db8:20::/64", "network_view": "lab"}],
    )
    rsps.get(
        f"{WAPI}/ipv6address",
        json={
            "result": [{"_ref": "ipv6address/x", "ip_address": "2001:db8:20::2", "types": ["HOST"]}]
        },
    )
    rsps.get(f"{WAPI}/ipv6range", json=[])
    info = make(subnet="2001:db8:20::/64", network_view="lab").describe_subnets()[0]
    # prefix:: (the subnet-router anycast address) is never handed out
    assert info == SubnetInfo(
        cidr="2001:db8:20::/64", prefix=64, gateway=None, total=2**64 - 1, used=1, free=2**64 - 2
    )


def test_describe_subnet_not_found(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/network", json=[])
    with pytest.raises(SubnetNotFoundError) as info:
        make().describe_subnets()[0]
    assert "10.20.0.0/24" in info.value.message


def test_routers_option_not_in_use_gives_no_gateway(
    rsps: responses.RequestsMock, make: Any
) -> None:
    record = network_record()
    record["options"][1]["use_option"] = False
    rsps.get(f"{WAPI}/network", json=[record])
    rsps.get(f"{WAPI}/ipv4address", json={"result": []})
    rsps.get(f"{WAPI}/range", json=[])
    assert make().describe_subnets()[0].gateway is None


@pytest.mark.parametrize(
    ("cidr", "total"),
    [
        ("10.0.0.0/24", 254),
        ("10.0.0.0/30", 2),
        ("10.0.0.0/31", 2),
        ("10.0.0.1/32", 1),
        ("2001:db8::/127", 2),
        ("2001:db8::/120", 255),  # prefix:: is never handed out
    ],
)
def test_capacity(cidr: str, total: int) -> None:
    import ipaddress

    assert _capacity(ipaddress.ip_network(cidr)) == total


# ------------------------------------------------------------------------------ auth


def test_basic_auth_first_then_cookie(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", json=[], headers=SET_COOKIE)
    rsps.get(f"{WAPI}/record:host", json=[])
    backend = make()
    backend.find("a.ns")
    backend.find("b.ns")
    first, second = rsps.calls[0].request, rsps.calls[1].request
    expected = "Basic " + base64.b64encode(f"capi:{PASSWORD}".encode()).decode()
    assert first.headers["Authorization"] == expected
    assert "Cookie" not in first.headers
    assert "Authorization" not in second.headers
    assert second.headers["Cookie"] == COOKIE


def test_expired_cookie_html_401_reauthenticates_once(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[], headers=SET_COOKIE)
    rsps.get(f"{WAPI}/record:host", status=401, body=HTML_401, content_type="text/html")
    rsps.get(f"{WAPI}/record:host", json=[], headers=SET_COOKIE)
    backend = make()
    backend.find("a.ns")
    assert backend.find("b.ns") is None
    expired, retried = rsps.calls[1].request, rsps.calls[2].request
    assert "Cookie" in expired.headers and "Authorization" not in expired.headers
    assert retried.headers["Authorization"].startswith("Basic ")
    assert "Cookie" not in retried.headers  # the stale cookie was dropped
    assert sleeps == []


def test_401_twice_is_authentication_failure_without_retries(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rsps.get(f"{WAPI}/record:host", status=401, body=HTML_401, content_type="text/html")
    with pytest.raises(AuthenticationFailedError) as info:
        make().find("a.ns")
    assert info.value.status == 401
    assert len(rsps.calls) == 1  # a 401 to Basic auth is a refused login: not sent again
    assert sleeps == []
    token = base64.b64encode(f"capi:{PASSWORD}".encode()).decode()
    for text in (caplog.text, str(info.value), repr(info.value)):
        assert PASSWORD not in text
        assert token not in text


def test_403_html_is_authentication_failure(rsps: responses.RequestsMock, make: Any) -> None:
    rsps.get(f"{WAPI}/record:host", status=403, body=HTML_403, content_type="text/html")
    with pytest.raises(AuthenticationFailedError) as info:
        make().find("a.ns")
    assert info.value.status == 403


def test_unsupported_wapi_version_plain_text(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    rsps.get(
        f"{GM}/wapi/v2.99/record:host",
        status=400,
        body="Version 2.99 not supported",
        content_type="text/plain",
    )
    with pytest.raises(InvalidRequestError) as info:
        make(wapi_version="2.99").find("a.ns")
    assert "2.99" in info.value.message
    assert sleeps == []


# ------------------------------------------------------------------------------ transient


@pytest.mark.parametrize("first", [502, 503, 429])
def test_transient_errors_are_retried(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float], first: int
) -> None:
    rsps.get(f"{WAPI}/record:host", status=first, body="<html>Bad Gateway</html>")
    rsps.get(f"{WAPI}/record:host", status=503, json=wapi_error("x", "Server", "busy"))
    rsps.get(f"{WAPI}/record:host", json=[])
    assert make().find("a.ns") is None
    assert len(sleeps) == 2


def test_timeouts_exhaust_attempts_as_unavailable(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        rsps.get(f"{WAPI}/network", body=requests.ConnectTimeout("connect timed out"))
    with pytest.raises(BackendUnavailableError) as info:
        make().describe_subnets()[0]
    assert info.value.status is None
    assert "7.5s" in info.value.message
    assert len(sleeps) == 2
    assert PASSWORD not in caplog.text


def test_connection_error_is_unavailable(rsps: responses.RequestsMock, make: Any) -> None:
    for _ in range(3):
        rsps.get(f"{WAPI}/record:host", body=requests.ConnectionError("refused"))
    with pytest.raises(BackendUnavailableError):
        make().find("a.ns")


def test_success_with_non_json_body_is_unavailable(rsps: responses.RequestsMock, make: Any) -> None:
    for _ in range(3):
        rsps.get(f"{WAPI}/record:host", body="<html>proxy login</html>", content_type="text/html")
    with pytest.raises(BackendUnavailableError):
        make().find("a.ns")


# ------------------------------------------------------------------------------ transport


def test_every_request_has_timeout_and_tls_verification(
    rsps: responses.RequestsMock, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    rsps.get(f"{WAPI}/record:host", json=[])
    rsps.post(f"{WAPI}/record:host", status=201, json=host_v4("10.20.0.2"))
    add_network(rsps)
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.2")])
    rsps.delete(ref_url(HOST_REF), json=HOST_REF)
    backend = make()
    backend.allocate("m1.ns1", OWNER)
    backend.release("m1.ns1", OWNER)
    assert len(rsps.calls) == 5
    for call in rsps.calls:
        assert kwargs_of(call)["timeout"] == (7.5, 7.5)
        assert kwargs_of(call)["verify"] is True


def test_invalid_ca_bundle_is_a_config_error() -> None:
    config = InfobloxConfig(
        endpoint=GM,
        subnet="10.20.0.0/24",
        username="capi",
        password=PASSWORD,
        ca_pem="-----BEGIN CERTIFICATE-----\n",
    )
    with pytest.raises(ValueError, match="CA bundle"):
        InfobloxBackend(config)


def test_close_logs_out_when_a_session_cookie_exists(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[], headers=SET_COOKIE)
    rsps.post(f"{WAPI}/logout", json="")
    backend = make()
    backend.find("a.ns")
    backend.close()
    logout = rsps.calls[1].request
    assert logout.headers["Cookie"] == COOKIE
    assert "Authorization" not in logout.headers


def test_close_without_session_sends_nothing(rsps: responses.RequestsMock, make: Any) -> None:
    make().close()
    assert len(rsps.calls) == 0


# ------------------------------------------------------------------------------ the gateway


def add_create(rsps: responses.RequestsMock, address: str) -> None:
    rsps.post(f"{WAPI}/record:host", status=201, json=host_v4(address))


def test_network_without_gateway_keeps_the_function_string(
    rsps: responses.RequestsMock, make: Any
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps, routers=None)
    add_create(rsps, "10.20.0.1")

    allocation = make().allocate("m1.ns1", OWNER)

    assert (allocation.address, allocation.gateway) == ("10.20.0.1", None)
    assert post_body(rsps)["ipv4addrs"][0]["ipv4addr"] == NEXT_V4


@pytest.mark.parametrize(
    ("override", "routers", "excluded", "reported"),
    [
        ("10.20.0.254", "10.20.0.1", ["10.20.0.1", "10.20.0.254"], "10.20.0.254"),
        ("10.20.0.254", None, ["10.20.0.254"], "10.20.0.254"),
        ("10.20.0.1", "10.20.0.1", ["10.20.0.1"], "10.20.0.1"),
        ("10.99.0.1", "10.20.0.1", ["10.20.0.1"], "10.99.0.1"),  # outside: never offered
        ("10.20.0.255", "10.20.0.1", ["10.20.0.1"], "10.20.0.255"),  # broadcast: never offered
    ],
    ids=["override-and-routers", "override-only", "same", "outside", "broadcast"],
)
def test_gateway_override_is_excluded_with_the_routers_option(
    rsps: responses.RequestsMock,
    make: Any,
    override: str,
    routers: str | None,
    excluded: list[str],
    reported: str,
) -> None:
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps, routers=routers)
    add_create(rsps, "10.20.0.2")

    allocation = make(gateway=override).allocate("m1.ns1", OWNER)

    assert (allocation.address, allocation.gateway) == ("10.20.0.2", reported)
    assert post_body(rsps)["ipv4addrs"][0]["ipv4addr"] == next_excluding(*excluded)


@pytest.mark.parametrize("record_type", ["host", "fixedaddress"])
def test_ipv6_gateway_override_is_excluded_on_the_ipv6network(
    rsps: responses.RequestsMock, make: Any, record_type: str
) -> None:
    cidr = "2001:db8:20::/64"
    obj = "record:host" if record_type == "host" else "ipv6fixedaddress"
    if record_type == "host":
        rsps.get(f"{WAPI}/record:host", json=[])
    else:
        add_fixed_search(rsps, "m6.ns1", [], v6=True)
    rsps.get(
        f"{WAPI}/ipv6network",
        match=[matchers.query_param_matcher(network_query(cidr))],
        json=[{"_ref": "ipv6network/x", "network": cidr, "network_view": "default"}],
    )
    created: dict[str, Any] = {"_ref": f"{obj}/x:m6.ns1", "name": "m6.ns1"}
    if record_type == "host":
        created["ipv6addrs"] = [{"ipv6addr": "2001:db8:20::2", "host": "m6.ns1"}]
    else:
        created["ipv6addr"] = "2001:db8:20::2"
    rsps.post(f"{WAPI}/{obj}", status=201, json=created)

    backend = make(subnet=cidr, gateway="2001:DB8:20::1", record_type=record_type)
    allocation = backend.allocate("m6.ns1", OWNER)

    assert (allocation.address, allocation.gateway) == ("2001:db8:20::2", "2001:db8:20::1")
    body = post_body(rsps)
    sent = body["ipv6addrs"][0]["ipv6addr"] if record_type == "host" else body["ipv6addr"]
    assert sent == next_excluding("2001:db8:20::1", cidr=cidr, network="ipv6network")


def test_gateway_handed_out_anyway_is_removed_and_retried(
    rsps: responses.RequestsMock, make: Any, sleeps: list[float]
) -> None:
    """An excluded address coming back (a grid that ignored the exclusion) is never kept."""
    rsps.get(f"{WAPI}/record:host", json=[])
    add_network(rsps, routers="10.20.0.1")
    rsps.post(f"{WAPI}/record:host", status=201, json=host_v4("10.20.0.5"))
    rsps.delete(ref_url(HOST_REF), json=HOST_REF)
    rsps.post(f"{WAPI}/record:host", status=201, json=host_v4("10.20.0.2"))

    allocation = make(gateway="10.20.0.5").allocate("m1.ns1", OWNER)

    assert allocation.address == "10.20.0.2"
    methods = [c.request.method for c in rsps.calls]
    assert methods == ["GET", "GET", "POST", "DELETE", "GET", "GET", "POST"]
    assert len(sleeps) == 1  # a failed attempt of the retry policy


def test_record_of_the_hostname_at_the_gateway_is_replaced_not_adopted(
    rsps: responses.RequestsMock, make: Any
) -> None:
    """Left by an older version that did not exclude the routers option."""
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.1")])
    add_network(rsps, routers="10.20.0.1")

    backend = make()
    assert backend.find("m1.ns1") is None

    rsps.delete(ref_url(HOST_REF), json=HOST_REF)
    rsps.get(f"{WAPI}/record:host", json=[host_v4("10.20.0.1")])
    add_create(rsps, "10.20.0.2")
    allocation = backend.allocate("m1.ns1", OWNER)

    assert allocation.address == "10.20.0.2"
    assert [c.request.method for c in rsps.calls].count("DELETE") == 1
    assert post_body(rsps)["ipv4addrs"][0]["ipv4addr"] == NEXT_V4_NO_GW


def test_describe_counts_an_unregistered_gateway_as_used(
    rsps: responses.RequestsMock, make: Any
) -> None:
    add_network(rsps, routers="10.20.0.1")
    rsps.get(
        f"{WAPI}/ipv4address",
        json={
            "result": [
                {
                    "_ref": "ipv4address/x:10.20.0.0",
                    "ip_address": "10.20.0.0",
                    "types": ["NETWORK"],
                },
                {"_ref": "ipv4address/x:10.20.0.7", "ip_address": "10.20.0.7", "types": ["HOST"]},
            ]
        },
    )
    rsps.get(f"{WAPI}/range", json=[])

    plain = make().describe_subnets()[0]
    overridden = make(gateway="10.20.0.254").describe_subnets()[0]

    assert plain == SubnetInfo(
        cidr="10.20.0.0/24", prefix=24, gateway="10.20.0.1", total=254, used=2, free=252
    )
    assert (overridden.gateway, overridden.used, overridden.free) == ("10.20.0.254", 3, 251)


@pytest.mark.parametrize(
    ("subnet", "gateway"),
    [("10.20.0.0/24", "10.20.0.300"), ("10.20.0.0/24", "2001:db8::1"), ("2001:db8::/64", "gw")],
)
def test_config_rejects_a_bad_gateway(subnet: str, gateway: str) -> None:
    with pytest.raises(ValueError, match="gateway"):
        InfobloxConfig(endpoint=GM, subnet=subnet, username="u", password="p", gateway=gateway)


def test_config_normalises_the_gateway() -> None:
    config = InfobloxConfig(
        endpoint=GM, subnet="2001:db8::/64", username="u", password="p", gateway=" 2001:DB8::1 "
    )
    assert config.gateway == "2001:db8::1"
