"""The Infoblox client against answers a real WAPI 2.12 grid gives (`responses`).

Each test is one way a real grid differs from what the client once assumed: the search
fields of the WAPI 2.12 schema, lower-case DNS names, the texts of
``Client.Ibap.Data.Conflict``, 404 on an unknown view, the record's own network view,
account lockout, DHCP ranges and the IPv6 subnet-router anycast address. Shapes are those of
the schema and of grid answers quoted in public issue threads of Infoblox's clients. Every
request the client sends is also checked against the schema (`wapi_requests`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import responses
from responses import matchers
from wapi_requests import add_fixed_search, assert_grid_accepts

from backends.base import EntryOwner, SubnetInfo
from backends.errors import AuthenticationFailedError, InvalidRequestError
from backends.flowcontrol import FlowControl
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy

#: This management cluster (the uid of its kube-system namespace) and a claim of it.
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "ns1/m1")

GM = "https://gm.example.com"
WAPI = f"{GM}/wapi/v2.12"
HOST_FIELDS = "name,view,comment,ipv4addrs,ipv6addrs"
PAGING = {"_paging": "1", "_max_results": "1000", "_return_as_object": "1"}


def wapi_error(kind: str, code: str, text: str) -> dict[str, str]:
    """A WAPI error body: ``{"Error": "<kind>: ... <text>", "code", "text"}``."""
    return {"Error": f"{kind}: {text}", "code": code, "text": text}


def not_searchable(field: str) -> dict[str, str]:
    """What a grid answers a search on a field that is not searchable."""
    return wapi_error("AdmConProtoError", "Client.Ibap.Proto", f"Field is not searchable: {field}")


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def grid() -> Iterator[responses.RequestsMock]:
    """`responses` answering as a grid; every request sent must be one the schema accepts.

    Answers to requests a grid refuses may be registered without being sent (the client
    this suite checks must not send them).
    """
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock
        assert_grid_accepts(mock.calls)


@pytest.fixture
def make(sleeps: list[float]) -> Iterator[Any]:
    made: list[InfobloxBackend] = []

    def factory(**overrides: Any) -> InfobloxBackend:
        endpoints = overrides.pop("endpoints", None)
        values: dict[str, Any] = {
            "endpoint": GM,
            "subnet": "10.20.0.0/24",
            "username": "capi",
            "password": "s3cr3t",
            "retry": RetryPolicy(attempts=3, initial_delay_seconds=0.01, sleep=sleeps.append),
        }
        values.update(overrides)
        backend = InfobloxBackend(
            InfobloxConfig(**values), session=requests.Session(), endpoints=endpoints
        )
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend._session.close()


def network(cidr: str = "10.20.0.0/24", view: str = "default") -> dict[str, Any]:
    return {"_ref": f"network/ZG5z:{cidr}/{view}", "network": cidr, "network_view": view}


def host(name: str, address: str, *, comment: str = "", view: str = " ") -> dict[str, Any]:
    return {
        "_ref": f"record:host/ZG5zLmhvc3Q:{name}/{view.replace(' ', '%20')}",
        "name": name,
        "view": view,
        "comment": comment,
        "ipv4addrs": [{"ipv4addr": address, "configure_for_dhcp": False, "host": name}],
    }


# 1. fixed addresses: ``name`` is not a search field of fixedaddress / ipv6fixedaddress.
def test_fixed_address_is_found_without_searching_the_name(
    grid: responses.RequestsMock, make: Any
) -> None:
    grid.get(f"{WAPI}/fixedaddress", status=400, json=not_searchable("name"))
    record = {
        "_ref": "fixedaddress/ZG5z:10.20.0.9/default",
        "ipv4addr": "10.20.0.9",
        "name": "m1.ns1",
        "comment": "ipam-bridge ns1/m1",
        "network_view": "default",
    }
    add_fixed_search(grid, "m1.ns1", [record])
    grid.get(f"{WAPI}/network", json=[network()])

    found = make(record_type="fixedaddress").find("m1.ns1")

    assert found is not None
    assert (found.address, found.ref) == ("10.20.0.9", record["_ref"])


# 2. host listing: ``network`` is not a search field of record:host at WAPI 2.12.
def test_host_records_of_a_network_are_listed_without_a_network_search(
    grid: responses.RequestsMock, make: Any
) -> None:
    grid.get(f"{WAPI}/record:host", status=400, json=not_searchable("network"))
    record = host("m1.ns1", "10.20.0.5", comment="ipam-bridge ns1/m1")
    query = {
        "network": "10.20.0.0/24",
        "network_view": "default",
        "status": "USED",
        "_return_fields": "ip_address,objects",
    } | PAGING
    grid.get(
        f"{WAPI}/ipv4address",
        match=[matchers.query_param_matcher(query)],
        json={
            "result": [
                {
                    "_ref": "ipv4address/x:10.20.0.5",
                    "ip_address": "10.20.0.5",
                    "objects": [record["_ref"]],
                }
            ]
        },
    )
    grid.get(f"{WAPI}/{record['_ref']}", json=record)
    grid.get(f"{WAPI}/network", json=[network()])

    (entry,) = make().entries()

    assert (entry.hostname, entry.address, entry.ref) == ("m1.ns1", "10.20.0.5", record["_ref"])


# 3. case: NIOS stores DNS names in lower case; an exact search in upper case misses.
def test_an_upper_case_dns_zone_finds_and_releases_its_record(
    grid: responses.RequestsMock, make: Any
) -> None:
    stored = "m1.ns1.k8s.example.com"
    record = host(stored, "10.20.0.7", view="default")
    grid.get(
        f"{WAPI}/record:host",
        match=[
            matchers.query_param_matcher(
                {"name": stored, "view": "default", "_return_fields": HOST_FIELDS}
            )
        ],
        json=[record],
    )
    grid.get(f"{WAPI}/record:host", json=[])  # any other spelling misses
    grid.delete(f"{WAPI}/{record['_ref']}", json=record["_ref"])

    assert make(dns_zone="K8S.Example.COM").release("m1.ns1", OWNER) is True

    assert [c.request.method for c in grid.calls] == ["GET", "DELETE"]


# 4. Client.Ibap.Data.Conflict is not always a lost race.
@pytest.mark.parametrize(
    "text",
    [
        "Extensible attribute 'Owner' is not allowed for this operation",
        "Only superusers can manage extensible attribute definition",
        "Member gm.example.com is assigned to another network view 'prod'",
    ],
)
def test_a_conflict_that_is_no_race_is_a_refusal_not_retried(
    grid: responses.RequestsMock, make: Any, sleeps: list[float], text: str
) -> None:
    grid.get(f"{WAPI}/record:host", json=[])
    grid.get(f"{WAPI}/network", json=[network()])
    grid.post(
        f"{WAPI}/record:host",
        status=400,
        json=wapi_error(
            "AdmConDataError: None (IBDataConflictError", "Client.Ibap.Data.Conflict", text
        ),
    )

    with pytest.raises(InvalidRequestError) as info:
        make(extensible_attributes={"Owner": "capi"}).allocate("m1.ns1", OWNER)

    assert text in info.value.message
    assert sleeps == []
    assert sum(c.request.method == "POST" for c in grid.calls) == 1


# 5. the network view of func:nextavailableip does not place the record.
def test_a_dns_host_record_carries_its_network_view(
    grid: responses.RequestsMock, make: Any
) -> None:
    grid.get(f"{WAPI}/record:host", json=[])
    grid.get(f"{WAPI}/network", json=[network(view="prod")])
    grid.post(
        f"{WAPI}/record:host",
        status=201,
        json=host("m1.ns1.k8s.example.com", "10.20.0.3", view="internal"),
    )

    make(network_view="prod", dns_view="internal", dns_zone="k8s.example.com").allocate(
        "m1.ns1", OWNER
    )

    (post,) = [c for c in grid.calls if c.request.method == "POST"]
    body = post.request.body
    assert b'"network_view": "prod"' in body
    assert b'"view": "internal"' in body


# 6. lock-out: NIOS locks a local user after 5 failed logins (default).
def test_refused_logins_stay_below_the_nios_lockout(
    grid: responses.RequestsMock, make: Any
) -> None:
    grid.get(f"{WAPI}/record:host", status=401, body="<h1>Authorization Required</h1>")
    endpoints = FlowControl()
    for attempt in range(5):
        backend = make(password=f"wrong-{attempt}", endpoints=endpoints)
        with pytest.raises(AuthenticationFailedError):
            backend.find("m1.ns1")

    assert len(grid.calls) == 3  # the 4th and 5th logins were held back, never sent


def test_a_locked_account_fails_with_the_grids_message_and_is_not_tried_again(
    grid: responses.RequestsMock, make: Any
) -> None:
    locked = "<html><body><p>Account is locked. Contact your administrator.</p></body></html>"
    grid.get(f"{WAPI}/record:host", status=401, body=locked, content_type="text/html")
    endpoints = FlowControl()

    with pytest.raises(AuthenticationFailedError) as info:
        make(endpoints=endpoints).find("m1.ns1")
    with pytest.raises(AuthenticationFailedError):
        make(password="another", endpoints=endpoints).find("m1.ns1")

    assert "Account is locked. Contact your administrator." in info.value.message
    assert "locked" in info.value.message
    assert len(grid.calls) == 1  # nothing is sent to a grid that locked the account


# 7. a 404 on an object type is an unknown view, not a ref that is gone.
def test_an_unknown_dns_view_is_named_not_taken_for_a_vanished_record(
    grid: responses.RequestsMock, make: Any
) -> None:
    grid.get(f"{WAPI}/record:host", json=[])
    grid.get(f"{WAPI}/network", json=[network()])
    grid.post(
        f"{WAPI}/record:host",
        status=404,
        json=wapi_error(
            "AdmConDataNotFoundError", "Client.Ibap.Data.NotFound", "View internal not found"
        ),
    )

    with pytest.raises(InvalidRequestError) as info:
        make(dns_view="internal", dns_zone="k8s.example.com").allocate("m1.ns1", OWNER)

    assert type(info.value) is InvalidRequestError
    assert "does not know a view, network view or zone" in info.value.message
    assert "View internal not found" in info.value.message


# 8. usage: DHCP ranges are never handed out; nor is the IPv6 ``prefix::``.
def test_free_addresses_exclude_dhcp_ranges(grid: responses.RequestsMock, make: Any) -> None:
    grid.get(f"{WAPI}/network", json=[network()])
    grid.get(
        f"{WAPI}/ipv4address",
        json={
            "result": [
                {"_ref": "ipv4address/x:10.20.0.5", "ip_address": "10.20.0.5", "types": ["HOST"]},
                {
                    "_ref": "ipv4address/x:10.20.0.120",
                    "ip_address": "10.20.0.120",
                    "types": ["LEASE"],
                },
            ]
        },
    )
    grid.get(
        f"{WAPI}/range",
        match=[
            matchers.query_param_matcher(
                {
                    "network": "10.20.0.0/24",
                    "network_view": "default",
                    "_return_fields": "start_addr,end_addr",
                }
            )
        ],
        json=[{"_ref": "range/x", "start_addr": "10.20.0.100", "end_addr": "10.20.0.199"}],
    )

    (info,) = make().describe_subnets()

    # 100 range addresses (one leased) and one host record
    assert info == SubnetInfo(
        cidr="10.20.0.0/24", prefix=24, gateway=None, total=254, used=101, free=153
    )


def test_the_ipv6_subnet_router_anycast_address_is_never_free(
    grid: responses.RequestsMock, make: Any
) -> None:
    cidr = "2001:db8:20::/120"
    grid.get(f"{WAPI}/ipv6network", json=[{"_ref": "ipv6network/x", "network": cidr}])
    grid.get(f"{WAPI}/ipv6address", json={"result": []})
    grid.get(f"{WAPI}/ipv6range", json=[])

    (info,) = make(subnet=cidr).describe_subnets()

    assert (info.total, info.used, info.free) == (255, 0, 255)
