"""The mock answers as a WAPI 2.12 grid: schema-driven fields, names, views, lockout, GMC."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from ib_helpers import PASSWORD, USER, Wapi, host_body

from backends.base import EntryOwner
from backends.errors import AuthenticationFailedError, InvalidRequestError
from backends.flowcontrol import FlowControl
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy
from mock_infoblox import InfobloxStore, MockInfobloxServer
from mock_infoblox.schema import OBJECT_TYPES, SEARCH_ONLY, WAPI_SCHEMA

#: This management cluster and a claim of it (the owner written on the entries).
CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OWNER = EntryOwner(CLUSTER, "default/c")


def test_search_fields_are_the_schemas_and_the_search_only_ones() -> None:
    for name, data in WAPI_SCHEMA["objects"].items():
        if name in OBJECT_TYPES:
            only = frozenset(SEARCH_ONLY.get(name, ()))
            assert OBJECT_TYPES[name].searchable == frozenset(data["search"]) | only, name
    assert set(SEARCH_ONLY["record:host"]) == {"ipv4addr", "ipv6addr", "mac"}
    assert set(SEARCH_ONLY["network"]) == {"contains_address"}
    assert "name" not in OBJECT_TYPES["fixedaddress"].searchable
    assert "network" not in OBJECT_TYPES["record:host"].searchable


def test_search_only_fields_are_searched_as_a_grid_does(wapi: Wapi) -> None:
    created = wapi.post("record:host", host_body("s1.ns1"), _return_fields="ipv4addrs")
    assert created.status_code == 201, created.text
    address = created.json()["ipv4addrs"][0]["ipv4addr"]
    by_address = wapi.get("record:host", ipv4addr=address, network_view="default")
    assert [h["name"] for h in by_address.json()] == ["s1.ns1"]
    assert wapi.get("record:host", ipv4addr="10.20.0.254").json() == []
    assert wapi.get("record:host", ipv6addr="2001:db8::99").json() == []
    network = wapi.get("network", contains_address=address, network_view="default")
    assert [n["network"] for n in network.json()] == ["10.20.0.0/24"]
    assert wapi.get("network", contains_address="192.0.2.1").json() == []
    # Not a field of ipv6network (infoblox-client #372): refused as an unknown argument.
    refused = wapi.get("ipv6network", contains_address="2001:db8::1")
    assert refused.status_code == 400
    assert refused.json()["code"] == "Client.Ibap.Proto"


def test_a_search_on_a_field_that_is_not_searchable_is_refused_as_a_grid_does(
    wapi: Wapi,
) -> None:
    answer = wapi.get("fixedaddress", name="m1.ns1")
    assert answer.status_code == 400
    assert answer.json() == {
        "Error": "AdmConProtoError: Field is not searchable: name",
        "code": "Client.Ibap.Proto",
        "text": "Field is not searchable: name",
    }


def test_unknown_body_and_return_fields_are_refused(wapi: Wapi) -> None:
    body = host_body("x.default", colour="blue")
    assert wapi.post("record:host", body).status_code == 400
    ref = wapi.post("record:host", host_body("y.default")).json()
    assert wapi.get("record:host", _return_fields="name,colour").status_code == 400
    # network_view is a create field of record:host, not an update field (schema).
    assert wapi.put(ref, {"network_view": "lab"}).status_code == 400


def test_dns_names_are_stored_and_matched_in_lower_case(wapi: Wapi) -> None:
    body = {
        "name": "M1.NS1.Cluster.Example.COM",
        "view": "default",
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.20.0.0/24,default"}],
    }
    assert wapi.post("record:host", body).status_code == 201
    assert wapi.get("record:host", name="M1.NS1.Cluster.Example.COM").json() == []
    (found,) = wapi.get("record:host", name="m1.ns1.cluster.example.com").json()
    assert found["name"] == "m1.ns1.cluster.example.com"


def test_the_records_own_network_view_places_it(wapi: Wapi) -> None:
    func = {"ipv4addr": "func:nextavailableip:10.30.0.0/29,lab"}
    body = {"name": "h.default", "configure_for_dns": False, "ipv4addrs": [func]}
    refused = wapi.post("record:host", body)
    assert refused.status_code == 400  # placed in "default", the address picked in "lab"
    placed = wapi.post("record:host", {**body, "network_view": "lab"}, _return_fields="name")
    assert placed.status_code == 201
    (record,) = wapi.get("record:host", name="h.default", _return_fields="network_view").json()
    assert record["network_view"] == "lab"


def test_an_unknown_view_is_404_not_found(wapi: Wapi) -> None:
    body = {**host_body("v.cluster.example.com"), "configure_for_dns": True, "view": "nope"}
    answer = wapi.post("record:host", body)
    assert answer.status_code == 404
    assert answer.json()["code"] == "Client.Ibap.Data.NotFound"


def test_an_ea_not_allowed_for_the_object_is_a_conflict_that_is_no_race(
    wapi: Wapi, store: InfobloxStore
) -> None:
    store.create(
        "extensibleattributedef",
        {"name": "Rack", "type": "STRING", "allowed_object_types": ["Network"]},
    )
    answer = wapi.post("record:host", host_body("r.default", extattrs={"Rack": {"value": "7"}}))
    assert answer.status_code == 400
    assert answer.json()["code"] == "Client.Ibap.Data.Conflict"
    assert answer.json()["text"] == "Extensible attribute 'Rack' is not allowed for this operation"


def test_five_refused_logins_lock_the_account(
    server: MockInfobloxServer, store: InfobloxStore
) -> None:
    url = f"{server.url}/wapi/v2.12/networkview"
    for _ in range(5):
        assert requests.get(url, auth=(USER, "wrong"), timeout=10).status_code == 401
    locked = requests.get(url, auth=(USER, PASSWORD), timeout=10)
    assert locked.status_code == 401
    assert "locked" in locked.text
    assert store.is_locked(USER)


def test_a_grid_master_candidate_refuses_writes(wapi: Wapi, store: InfobloxStore) -> None:
    ref = wapi.post("record:host", host_body("gmc.default")).json()
    store.read_only = True
    assert wapi.get("record:host", name="gmc.default").status_code == 200
    for answer in (
        wapi.post("record:host", host_body("gmc2.default")),
        wapi.put(ref, {"comment": "x"}),
        wapi.delete(ref),
    ):
        assert answer.status_code == 403
    store.read_only = False


def test_ipv6_ranges_are_ipv6range_objects(wapi: Wapi, store: InfobloxStore) -> None:
    store.seed({"ranges": [{"start_addr": "2001:db8:20::100", "end_addr": "2001:db8:20::1ff"}]})
    (found,) = wapi.get("ipv6range", network="2001:db8:20::/64").json()
    assert (found["start_addr"], found["end_addr"]) == ("2001:db8:20::100", "2001:db8:20::1ff")
    assert wapi.get("range", network="2001:db8:20::/64").json() == []


def backend(
    server: MockInfobloxServer, endpoints: FlowControl | None = None, **overrides: Any
) -> InfobloxBackend:
    """The ipam-bridge client for the mock's 10.20.0.0/24 (no waits between tries)."""
    values: dict[str, Any] = {
        "endpoint": server.url,
        "subnet": "10.20.0.0/24",
        "username": USER,
        "password": PASSWORD,
        "retry": RetryPolicy(attempts=3, initial_delay_seconds=0.0, sleep=lambda _: None),
    }
    values.update(overrides)
    return InfobloxBackend(InfobloxConfig(**values), endpoints=endpoints)


def test_the_client_never_locks_the_account(
    server: MockInfobloxServer, store: InfobloxStore
) -> None:
    endpoints = FlowControl()
    for attempt in range(6):
        client = backend(server, endpoints, password=f"wrong-{attempt}")
        with pytest.raises(AuthenticationFailedError):
            client.find("m1.ns1")
        client.close()
    assert not store.is_locked(USER)
    assert backend(server).find("m1.ns1") is None  # the right password still works


def test_the_client_reports_a_locked_account_with_the_grids_message(
    server: MockInfobloxServer, store: InfobloxStore
) -> None:
    for _ in range(5):
        store.login(USER, "wrong")
    with pytest.raises(AuthenticationFailedError) as info:
        backend(server).find("m1.ns1")
    assert "Account is locked" in info.value.message


def test_the_client_takes_a_non_race_conflict_as_a_refusal(
    server: MockInfobloxServer, store: InfobloxStore
) -> None:
    store.create(
        "extensibleattributedef",
        {"name": "Rack", "type": "STRING", "allowed_object_types": ["Network"]},
    )
    client = backend(server, extensible_attributes={"Rack": "7"})
    with pytest.raises(InvalidRequestError) as info:
        client.allocate("m1.ns1", OWNER)
    assert "Extensible attribute 'Rack' is not allowed for this operation" in info.value.message
    assert store.records(type_name="record:host") == []


def test_the_client_reports_a_read_only_member(
    server: MockInfobloxServer, store: InfobloxStore
) -> None:
    store.read_only = True
    with pytest.raises(AuthenticationFailedError) as info:
        backend(server).allocate("m1.ns1", OWNER)
    store.read_only = False
    assert "read-only" in info.value.message
