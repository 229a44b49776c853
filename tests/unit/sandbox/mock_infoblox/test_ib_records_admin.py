"""The admin surface /_mock/records and the WAPI behaviour pools of several networks use."""

from __future__ import annotations

import requests
from ib_helpers import Wapi, host_body

from mock_infoblox import InfobloxStore, MockInfobloxServer

PAGED = {"_paging": "1", "_return_as_object": "1", "_max_results": "2"}


def admin(server: MockInfobloxServer) -> str:
    return f"{server.url}/_mock/records"


def test_add_short_form_host_and_fixed_address(
    server: MockInfobloxServer, store: InfobloxStore, wapi: Wapi
) -> None:
    host = requests.post(
        admin(server),
        json={"name": "printer.lab", "address": "10.20.0.7", "comment": "by hand"},
        timeout=5,
    )
    fixed = requests.post(
        admin(server),
        json={"type": "fixedaddress", "name": "ups", "network": "10.20.0.0/24"},
        timeout=5,
    )
    v6 = requests.post(
        admin(server),
        json={"type": "ipv6fixedaddress", "name": "cam", "address": "2001:db8:20::9"},
        timeout=5,
    )
    assert (host.status_code, fixed.status_code, v6.status_code) == (201, 201, 201)
    assert host.json()["configure_for_dns"] is False
    assert fixed.json()["ipv4addr"] == "10.20.0.2"  # next available: .1 is used
    found = wapi.get("record:host", name="printer.lab", _return_fields="comment").json()
    assert found[0]["comment"] == "by hand"
    cam = wapi.get("ipv6fixedaddress", ipv6addr="2001:db8:20::9", _return_fields="name,duid")
    assert cam.json()[0]["duid"].startswith("00:04:")


def test_add_with_a_wapi_body_and_its_errors(server: MockInfobloxServer, wapi: Wapi) -> None:
    body = host_body("m1.default", extattrs={"Owner": "capi"})
    made = requests.post(admin(server), json={"type": "record:host", "body": body}, timeout=5)
    assert made.status_code == 201
    assert made.json()["extattrs"] == {"Owner": {"value": "capi"}}
    again = requests.post(admin(server), json={"body": body}, timeout=5)
    assert again.status_code == 400
    assert again.json()["code"] == "Client.Ibap.Data.Conflict"
    bad = requests.post(admin(server), json={"type": "network", "name": "x"}, timeout=5)
    assert bad.status_code == 400 and "type must be one of" in bad.json()["error"]


def test_rename_and_delete_behind_the_back(server: MockInfobloxServer, wapi: Wapi) -> None:
    ref = wapi.post("record:host", host_body("m1.default")).json()
    patch = {"match": {"ref": ref}, "set": {"name": "printer-7", "comment": "mine now"}}
    renamed = requests.patch(admin(server), json=patch, timeout=5)
    assert renamed.status_code == 200
    assert renamed.json()["name"] == "printer-7"
    assert renamed.json()["_ref"] != ref
    assert wapi.get("record:host", name="m1.default").json() == []
    assert wapi.get(ref).status_code == 404  # a rename makes the old ref stale

    missing = requests.patch(admin(server), json={"match": {"name": "nope"}, "set": {}}, timeout=5)
    assert missing.status_code == 404
    listed = requests.get(admin(server), params={"address": "10.20.0.2"}, timeout=5).json()
    assert [r["name"] for r in listed["records"]] == ["printer-7"]

    deleted = requests.delete(admin(server), params={"address": "10.20.0.2"}, timeout=5)
    assert deleted.status_code == 200 and len(deleted.json()["deleted"]) == 1
    assert (
        requests.delete(admin(server), params={"name": "printer-7"}, timeout=5).status_code == 404
    )
    assert requests.delete(admin(server), timeout=5).status_code == 400  # never "delete all"


def test_put_renames_and_comments_a_host_outside_dns(wapi: Wapi) -> None:
    ref = wapi.post("record:host", host_body("m1.default", comment="ipam-bridge ns/m1")).json()
    put = wapi.put(ref, {"name": "quarantined.m1.default", "comment": "ipam-bridge quarantined"})
    assert put.status_code == 200
    (found,) = wapi.get(
        "record:host", name="quarantined.m1.default", _return_fields="name,comment,ipv4addrs"
    ).json()
    assert found["comment"] == "ipam-bridge quarantined"
    assert found["ipv4addrs"][0]["ipv4addr"] == "10.20.0.2"  # the address is kept
    assert found["_ref"] == put.json()


def test_explicit_address_creates(wapi: Wapi) -> None:
    host = {
        "name": "a.default",
        "configure_for_dns": False,
        "ipv4addrs": [{"ipv4addr": "10.20.0.9"}],
    }
    assert wapi.post("record:host", host).status_code == 201
    # Like NIOS with configure_for_dhcp false, a second host on the same address is accepted
    # (terraform-provider-infoblox#235); the ipv4address view shows both objects.
    twin = {
        "name": "b.default",
        "configure_for_dns": False,
        "ipv4addrs": [{"ipv4addr": "10.20.0.9"}],
    }
    assert wapi.post("record:host", twin).status_code == 201
    (view,) = wapi.get("ipv4address", ip_address="10.20.0.9", network_view="default").json()
    assert (view["status"], sorted(view["names"]), len(view["objects"])) == (
        "USED",
        ["a.default", "b.default"],
        2,
    )
    # A fixed address on a used literal address is refused.
    fixed = {"ipv4addr": "10.20.0.10", "mac": "00:00:00:00:00:00"}
    assert wapi.post("fixedaddress", fixed).status_code == 201
    clash = wapi.post("fixedaddress", fixed | {"name": "other"})
    assert clash.status_code == 400
    assert clash.json()["code"] == "Client.Ibap.Data.Conflict"


def test_host_records_of_a_network_are_listed_through_the_address_view(wapi: Wapi) -> None:
    """``network`` is not a search field of record:host at WAPI 2.12; ipv4address is."""
    for i in range(3):
        wapi.post("record:host", host_body(f"m{i}.default"))
    refused = wapi.get("record:host", network="10.20.0.0/24", network_view="default")
    assert refused.status_code == 400
    assert refused.json()["code"] == "Client.Ibap.Proto"
    assert "network" in refused.json()["text"]
    used = wapi.get(
        "ipv4address",
        network="10.20.0.0/24",
        network_view="default",
        status="USED",
        _return_fields="ip_address,objects",
    ).json()
    hosts = [o for item in used for o in item["objects"] if o.startswith("record:host/")]
    names = sorted(wapi.get(ref, _return_fields="name").json()["name"] for ref in hosts)
    assert names == ["m0.default", "m1.default", "m2.default"]
