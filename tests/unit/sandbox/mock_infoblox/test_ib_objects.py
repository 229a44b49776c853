"""WAPI objects: search, _return_fields, create/read/update/delete, EAs, views, error bodies."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from ib_helpers import Wapi, host_body

from mock_infoblox import InfobloxStore


def assert_wapi_error(body: dict[str, Any], code: str, text: str) -> None:
    assert set(body) == {"Error", "code", "text"}
    assert body["code"] == code
    assert body["text"] == text
    assert body["Error"].endswith(text) or body["Error"].endswith(text + ")")


def test_network_basic_fields_and_options(wapi: Wapi) -> None:
    basic = wapi.get("network", network="10.20.0.0/24").json()
    assert len(basic) == 1
    assert set(basic[0]) == {"_ref", "comment", "network", "network_view"}
    assert basic[0]["_ref"].startswith("network/")
    assert basic[0]["_ref"].endswith(":10.20.0.0/24/default")

    full = wapi.get(
        "network", network="10.20.0.0/24", **{"_return_fields+": "options,netmask,extattrs"}
    ).json()[0]
    routers = [o for o in full["options"] if o["name"] == "routers"]
    assert routers == [
        {"name": "routers", "num": 3, "value": "10.20.0.1", "vendor_class": "DHCP",
         "use_option": True}
    ]  # fmt: skip
    assert full["netmask"] == 24
    assert full["extattrs"] == {"Site": {"value": "dc1"}}


def test_return_fields_replaces_basic_fields(wapi: Wapi) -> None:
    item = wapi.get("network", network="10.20.0.0/24", _return_fields="network").json()[0]
    assert set(item) == {"_ref", "network"}


def test_unknown_return_field_is_proto_error(wapi: Wapi) -> None:
    response = wapi.get("network", _return_fields="nosuchfield")
    assert response.status_code == 400
    assert_wapi_error(response.json(), "Client.Ibap.Proto", "Unknown argument/field: 'nosuchfield'")


def test_search_without_hits_is_empty_list(wapi: Wapi) -> None:
    response = wapi.get("network", network="192.0.2.0/24")
    assert response.status_code == 200
    assert response.json() == []


def test_ipv6network_ref_quotes_colons(wapi: Wapi) -> None:
    items = wapi.get("ipv6network", network="2001:db8:20::/64").json()
    assert [i["network"] for i in items] == ["2001:db8:20::/64"]
    assert items[0]["_ref"].endswith(":2001%3Adb8%3A20%3A%3A/64/default")


def test_network_view_filter(wapi: Wapi) -> None:
    lab = wapi.get("network", network_view="lab").json()
    assert [n["network"] for n in lab] == ["10.30.0.0/29"]


def test_unknown_object_type(wapi: Wapi) -> None:
    response = wapi.get("record:nope")
    assert response.status_code == 400
    assert_wapi_error(response.json(), "Client.Ibap.Proto", "Unknown object type (record:nope)")


def test_create_returns_ref_string_and_get_by_ref(wapi: Wapi) -> None:
    created = wapi.post("record:host", host_body("m1.default", comment="ipam-bridge default/m1"))
    assert created.status_code == 201
    ref = created.json()
    assert isinstance(ref, str)
    assert ref.startswith("record:host/") and ref.endswith(":m1.default/%20")

    record = wapi.get(quote(ref, safe="/:"), _return_fields="name,comment,view,ipv4addrs").json()
    assert record["_ref"] == ref
    assert record["name"] == "m1.default"
    assert record["comment"] == "ipam-bridge default/m1"
    assert record["view"] == " "  # outside DNS
    [addr] = record["ipv4addrs"]
    assert addr["host"] == "m1.default"
    assert addr["configure_for_dhcp"] is False
    assert addr["_ref"].startswith("record:host_ipv4addr/")


def test_create_with_return_fields_returns_object(wapi: Wapi) -> None:
    response = wapi.post("record:host", host_body("m2.default"), _return_fields="name,ipv4addrs")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"_ref", "name", "ipv4addrs"}
    assert body["ipv4addrs"][0]["ipv4addr"] == "10.20.0.2"


def test_return_as_object_wraps_results(wapi: Wapi) -> None:
    created = wapi.post("record:host", host_body("m3.default"), _return_as_object="1")
    assert set(created.json()) == {"result"}
    assert created.json()["result"].startswith("record:host/")
    found = wapi.get("record:host", name="m3.default", _return_as_object="1").json()
    assert [r["name"] for r in found["result"]] == ["m3.default"]


def test_search_by_name_and_network_view(wapi: Wapi) -> None:
    wapi.post("record:host", host_body("a.default"))
    wapi.post("record:host", host_body("b.default"))
    found = wapi.get("record:host", name="b.default", network_view="default").json()
    assert [r["name"] for r in found] == ["b.default"]
    assert wapi.get("record:host", name="b.default", network_view="lab").json() == []


def test_search_modifiers_regex_and_case_insensitive(wapi: Wapi) -> None:
    for name in ("web-1.default", "web-2.default", "db-1.default"):
        wapi.post("record:host", host_body(name))
    regex = wapi.get("record:host", **{"name~": "^web-"}).json()
    assert sorted(r["name"] for r in regex) == ["web-1.default", "web-2.default"]
    ci = wapi.get("record:host", **{"name:": "DB-1.DEFAULT"}).json()
    assert [r["name"] for r in ci] == ["db-1.default"]
    assert wapi.get("record:host", name="DB-1.DEFAULT").json() == []


def test_record_host_refuses_what_wapi_2_12_does_not_search(wapi: Wapi) -> None:
    """record:host has no ``network`` search at WAPI 2.12; ``ipv4addr`` is search-only."""
    wapi.post("record:host", host_body("addr.default"))
    answer = wapi.get("record:host", network="10.20.0.0/24")
    assert answer.status_code == 400
    assert answer.json()["code"] == "Client.Ibap.Proto"
    # A grid accepts the search-only ipv4addr (infoblox-client's get_host_record sends it).
    found = wapi.get("record:host", ipv4addr="10.20.0.2")
    assert found.status_code == 200
    assert [r["name"] for r in found.json()] == ["addr.default"]


def test_extensible_attribute_body_and_search(wapi: Wapi) -> None:
    eas = {"Owner": {"value": "cluster-a"}}
    wapi.post("record:host", host_body("ea1.default", extattrs=eas))
    wapi.post("record:host", host_body("ea2.default", extattrs={"Owner": {"value": "other"}}))
    found = wapi.get("record:host", **{"*Owner": "cluster-a", "_return_fields+": "extattrs"})
    assert [r["name"] for r in found.json()] == ["ea1.default"]
    assert found.json()[0]["extattrs"] == eas
    # A repeated EA key matches any of its values.
    both = wapi.session.get(
        f"{wapi.url}/record:host", params=[("*Owner", "cluster-a"), ("*Owner", "other")]
    )
    assert sorted(r["name"] for r in both.json()) == ["ea1.default", "ea2.default"]


@pytest.mark.parametrize("where", ["body", "search"])
def test_unknown_extensible_attribute_is_400(wapi: Wapi, where: str) -> None:
    if where == "body":
        response = wapi.post(
            "record:host", host_body("x.default", extattrs={"Tenant": {"value": "a"}})
        )
    else:
        response = wapi.get("record:host", **{"*Tenant": "a"})
    assert response.status_code == 400
    assert_wapi_error(response.json(), "Client.Ibap.Proto", "Unknown extensible attribute: Tenant")
    assert wapi.get("record:host").json() == []  # nothing was created


def test_a_put_keeps_comment_and_extattrs_and_refuses_an_undefined_ea(wapi: Wapi) -> None:
    # The owner written on an adopted entry: one PUT with comment and extattrs (replaced whole).
    made = wapi.post(
        "record:host",
        host_body("own.default", comment="for the VIP", extattrs={"Site": {"value": "fra"}}),
    )
    ref = made.json()
    eas = {"Site": {"value": "fra"}, "Owner": {"value": "3f0c ns/own"}}
    updated = wapi.put(ref, {"comment": "ipam-bridge 3f0c ns/own", "extattrs": eas})
    assert updated.status_code == 200
    read = wapi.get(ref, _return_fields="name,comment,extattrs").json()
    assert (read["comment"], read["extattrs"]) == ("ipam-bridge 3f0c ns/own", eas)

    refused = wapi.put(ref, {"comment": "x", "extattrs": {"Tenant": {"value": "a"}}})
    assert refused.status_code == 400
    assert_wapi_error(refused.json(), "Client.Ibap.Proto", "Unknown extensible attribute: Tenant")
    again = wapi.get(ref, _return_fields="comment,extattrs").json()
    assert (again["comment"], again["extattrs"]) == ("ipam-bridge 3f0c ns/own", eas)  # unchanged


def test_extensibleattributedef_lists_defined_names(wapi: Wapi) -> None:
    names = [d["name"] for d in wapi.get("extensibleattributedef").json()]
    assert sorted(names) == ["Owner", "Site"]


def test_unknown_body_field_is_proto_error(wapi: Wapi) -> None:
    response = wapi.post("record:host", host_body("f.default", colour="blue"))
    assert response.status_code == 400
    assert_wapi_error(response.json(), "Client.Ibap.Proto", "Unknown argument/field: 'colour'")


def test_not_searchable_field(wapi: Wapi) -> None:
    response = wapi.get("record:host", configure_for_dns="false")
    assert response.status_code == 400
    assert response.json()["code"] == "Client.Ibap.Proto"


def test_host_name_unique_per_dns_view(wapi: Wapi) -> None:
    body = {
        "name": "node.cluster.example.com",
        "view": "default",
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.20.0.0/24,default"}],
    }
    assert wapi.post("record:host", body).status_code == 201
    duplicate = wapi.post("record:host", body)
    assert duplicate.status_code == 400
    assert_wapi_error(
        duplicate.json(),
        "Client.Ibap.Data.Conflict",
        "The record 'node.cluster.example.com' already exists.",
    )
    assert duplicate.json()["Error"].startswith("AdmConDataError: None (IBDataConflictError:")
    # Same name, upper case: DNS names compare case-insensitively.
    upper = wapi.post("record:host", {**body, "name": "NODE.cluster.example.com"})
    assert upper.status_code == 400


def test_same_name_outside_dns_per_network_view(wapi: Wapi, store: InfobloxStore) -> None:
    assert wapi.post("record:host", host_body("n.default")).status_code == 201
    assert wapi.post("record:host", host_body("n.default")).status_code == 400
    lab = host_body("n.default", cidr="10.30.0.0/29", network_view="lab")
    lab["ipv4addrs"] = [{"ipv4addr": "func:nextavailableip:10.30.0.0/29,lab"}]
    assert wapi.post("record:host", lab).status_code == 201


def test_dns_host_gets_zone_and_needs_parent_zone(wapi: Wapi) -> None:
    body = {
        "name": "m1.cluster.example.com",
        "configure_for_dns": True,
        "view": "default",
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.20.0.0/24,default"}],
    }
    ref = wapi.post("record:host", body).json()
    assert ref.endswith(":m1.cluster.example.com/default")
    record = wapi.get(quote(ref, safe="/:"), _return_fields="zone,view,configure_for_dns").json()
    assert record["zone"] == "cluster.example.com"
    assert record["view"] == "default"
    assert record["configure_for_dns"] is True

    orphan = wapi.post("record:host", {**body, "name": "m1.elsewhere.org"})
    assert orphan.status_code == 400
    assert_wapi_error(
        orphan.json(),
        "Client.Ibap.Data.Conflict",
        "The action is not allowed. A parent was not found.",
    )


def test_unknown_dns_view_is_404(wapi: Wapi) -> None:
    body = {
        "name": "x.cluster.example.com",
        "view": "nope",
        "ipv4addrs": [{"ipv4addr": "10.20.0.9"}],
    }
    response = wapi.post("record:host", body)
    assert response.status_code == 404
    assert_wapi_error(response.json(), "Client.Ibap.Data.NotFound", "View nope not found")


def test_delete_returns_ref_then_404(wapi: Wapi) -> None:
    ref = wapi.post("record:host", host_body("gone.default")).json()
    deleted = wapi.delete(quote(ref, safe="/:"))
    assert deleted.status_code == 200
    assert deleted.json() == ref
    again = wapi.delete(quote(ref, safe="/:"))
    assert again.status_code == 404
    assert_wapi_error(again.json(), "Client.Ibap.Data.NotFound", f"Reference {ref} not found")
    assert wapi.get(quote(ref, safe="/:")).status_code == 404
    assert wapi.get("record:host", name="gone.default").json() == []


def test_put_updates_comment_and_adds_address(wapi: Wapi) -> None:
    ref = wapi.post("record:host", host_body("upd.default")).json()
    record = wapi.get(quote(ref, safe="/:"), _return_fields="ipv4addrs").json()
    addrs = [{"ipv4addr": a["ipv4addr"]} for a in record["ipv4addrs"]]
    addrs.append({"ipv4addr": "func:nextavailableip:10.20.0.0/24,default"})
    updated = wapi.put(quote(ref, safe="/:"), {"comment": "two", "ipv4addrs": addrs})
    assert updated.status_code == 200
    assert updated.json() == ref
    after = wapi.get(quote(ref, safe="/:"), _return_fields="comment,ipv4addrs").json()
    assert after["comment"] == "two"
    assert [a["ipv4addr"] for a in after["ipv4addrs"]] == ["10.20.0.2", "10.20.0.3"]


def test_invalid_json_body(wapi: Wapi) -> None:
    response = wapi.session.post(
        f"{wapi.url}/record:host", data="{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "Client.Ibap.Proto"


def test_range_objects_are_searchable(wapi: Wapi) -> None:
    ranges = wapi.get("range", network="10.20.0.0/24").json()
    assert [(r["start_addr"], r["end_addr"]) for r in ranges] == [("10.20.0.200", "10.20.0.250")]
    assert ranges[0]["_ref"].startswith("range/")
