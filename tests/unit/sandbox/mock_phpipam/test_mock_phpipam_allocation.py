"""First-free semantics beyond the transcripts, concurrency, value types and legacy modes.

Sources: phpipam-api.md sections 3, 8 and 10b; backends.md A.5 (first free skips every row;
IPv4 below /31 and not a pool skips network and broadcast; full or parent subnets hand out
nothing) and A.3 (<= 1.4 answers "not found" as 200 with success false).
"""

from __future__ import annotations

import ipaddress
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from phpipam_mock_helpers import Api

from mock_phpipam import Store


def claim(api: Api, subnet_id: int, hostname: str) -> requests.Response:
    return api.call("POST", f"/addresses/first_free/{subnet_id}/", json={"hostname": hostname})


def test_parallel_claims_get_distinct_addresses(api: Api, store: Store) -> None:
    with ThreadPoolExecutor(25) as pool:
        answers = list(pool.map(lambda i: claim(api, 7, f"conc.claim-{i}"), range(50)))
    assert {a.status_code for a in answers} == {201}
    ips = [a.json()["data"] for a in answers]
    assert len(set(ips)) == 50
    rows = [a for a in store.subnet_addresses(7) if (a.hostname or "").startswith("conc.")]
    assert sorted(str(r.ip) for r in rows) == sorted(ips)
    # Serialised like phpIPAM's File lock: together they fill .2 .. .51 without holes.
    assert {int(ipaddress.ip_address(ip)) & 0xFF for ip in ips} == set(range(2, 52))


def test_parallel_claims_exhaust_a_small_subnet(api: Api) -> None:
    with ThreadPoolExecutor(20) as pool:  # 8d: /28 has 14 hosts
        answers = list(pool.map(lambda i: claim(api, 12, f"ex.claim-{i}"), range(20)))
    created = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 404]
    assert (len(created), len(refused)) == (14, 6)
    assert {a.json()["message"] for a in refused} == {"No free addresses found"}
    assert len({a.json()["data"] for a in created}) == 14


def test_slash_31_and_32_use_every_address(api: Api, store: Store) -> None:
    p2p = store.add_subnet("10.30.0.0/31", section_id=3)
    host = store.add_subnet("10.30.1.7/32", section_id=3)
    got = [claim(api, p2p.id, f"p2p-{i}").json().get("data") for i in range(3)]
    assert got == ["10.30.0.0", "10.30.0.1", None]
    assert claim(api, host.id, "h").json()["data"] == "10.30.1.7"


def test_pool_subnet_hands_out_network_and_broadcast(api: Api, store: Store) -> None:
    pool = store.add_subnet("10.30.2.0/30", section_id=3, is_pool=True)
    got = [claim(api, pool.id, f"p-{i}").json()["data"] for i in range(4)]
    assert got == ["10.30.2.0", "10.30.2.1", "10.30.2.2", "10.30.2.3"]


def test_full_subnet_and_parent_subnet(api: Api, store: Store) -> None:
    full = store.add_subnet("10.30.3.0/24", section_id=3, is_full=True)
    parent = store.add_subnet("10.31.0.0/16", section_id=3)
    store.add_subnet("10.31.1.0/24", section_id=3, master_subnet_id=parent.id)
    response = claim(api, full.id, "x")
    assert (response.status_code, response.json()["message"]) == (
        404,
        "No free addresses found (subnet is full)",
    )
    child_first = api.call("GET", f"/subnets/{parent.id}/first_free/")
    assert (child_first.status_code, child_first.json()["message"]) == (
        409,
        "Subnet contains subnets",
    )
    assert claim(api, parent.id, "x").json()["message"] == "No free addresses found"


def test_every_existing_row_is_taken_whatever_its_tag(api: Api, store: Store) -> None:
    store.add_address(7, "10.20.0.2", tag=3, hostname="reserved")
    store.add_address(7, "10.20.0.3", tag=4, hostname="dhcp")
    assert claim(api, 7, "a").json()["data"] == "10.20.0.4"
    usage = api.call("GET", "/subnets/7/usage/").json()["data"]
    assert (usage["Used"], usage["Reserved"], usage["DHCP"], usage["used"]) == (2, 1, 1, "4")
    assert usage["freehosts"] == "250"


def test_gateway_is_reported_only_when_a_gateway_row_exists(api: Api) -> None:
    v4 = api.call("GET", "/subnets/7/").json()["data"]
    v6 = api.call("GET", "/subnets/8/").json()["data"]
    assert v4["gateway"] == {"ip_addr": "10.20.0.1", "id": 11} and v4["gatewayId"] == 11
    assert "gateway" not in v6 and "gatewayId" not in v6
    created = api.call(
        "POST", "/addresses/", json={"subnetId": 8, "ip": "2001:db8:20::1", "is_gateway": 1}
    )
    assert created.status_code == 201
    assert api.call("GET", "/subnets/8/").json()["data"]["gateway"]["ip_addr"] == "2001:db8:20::1"


def test_one_gateway_per_subnet(api: Api) -> None:
    created = api.call(
        "POST", "/addresses/", json={"subnetId": 7, "ip": "10.20.0.254", "is_gateway": "1"}
    )
    assert created.status_code == 201
    data = api.call("GET", "/subnets/7/").json()["data"]
    assert data["gateway"] == {"ip_addr": "10.20.0.254", "id": int(created.json()["id"])}
    assert api.call("GET", "/addresses/11/").json()["data"]["is_gateway"] == 0


def test_stringify_header_off_and_server_default_on(api: Api, store: Store) -> None:
    store.settings.stringify_results = True
    as_strings = api.call("GET", "/subnets/7/usage/").json()["data"]
    as_numbers = api.call(
        "GET", "/subnets/7/usage/", headers={"Api-Stringify-Results": "0"}
    ).json()["data"]
    assert as_strings["Used"] == "1" and as_strings["freehosts_percent"] == "99.61"
    assert as_numbers["Used"] == 1 and as_numbers["freehosts_percent"] == 99.61
    subnet = api.call("GET", "/subnets/7/").json()["data"]
    assert subnet["gateway"] == {"ip_addr": "10.20.0.1", "id": "11"} and subnet["vrfId"] is None


def test_legacy_not_found_is_200_with_success_false(api: Api, store: Store) -> None:
    store.settings.legacy_not_found = True
    response = api.call("GET", "/addresses/search_hostname/nobody/")
    assert response.status_code == 200
    body = json.loads(response.content)
    assert list(body) == ["code", "success", "message", "time"]
    assert (body["code"], body["success"], body["message"]) == (200, False, "Hostname not found")


def test_patch_rules(api: Api) -> None:
    created = claim(api, 7, "p")
    aid = created.json()["id"]
    subnet_change = api.call("PATCH", f"/addresses/{aid}/", json={"subnetId": 9})
    empty = api.call("PATCH", f"/addresses/{aid}/", json={})
    missing = api.call("PATCH", "/addresses/99999/", json={"hostname": "x"})
    bad_key = api.call("PATCH", f"/addresses/{aid}/", json={"nope": 1})
    ok = api.call("PATCH", f"/addresses/{aid}/", json={"note": "n", "tag": "3"})
    assert (subnet_change.status_code, subnet_change.json()["message"]) == (
        400,
        "Subnet cannot be changed",
    )
    assert (empty.status_code, empty.json()["message"]) == (400, "No data provided")
    assert (missing.status_code, missing.json()["message"]) == (404, "Address does not exist")
    assert (bad_key.status_code, bad_key.json()["message"]) == (400, "Invalid request key nope")
    assert ok.json()["message"] == "Address updated"
    row = api.call("GET", f"/addresses/{aid}/").json()["data"]
    assert (row["hostname"], row["note"], row["tag"]) == ("p", "n", 3)
    assert row["editDate"] is not None


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"mac": "zz"}, 400, "Invalid MAC address"),
        ({"tag": 9}, 400, "Tag does not exist"),
        ({"tag": "x"}, 400, "Invalid state"),
        ({"deviceId": 5}, 400, "Device does not exist"),
    ],
)
def test_value_validation(api: Api, body: dict[str, object], status: int, message: str) -> None:
    response = api.call("POST", "/addresses/first_free/7/", json={"hostname": "v", **body})
    assert (response.status_code, response.json()["message"]) == (status, message)
    assert api.call("GET", "/addresses/search_hostname/v/").status_code == 404


def test_long_strings_are_cut_to_their_column_or_refused_under_strict_mode(
    api: Api, store: Store
) -> None:
    # Section 12: description varchar(64), owner varchar(128), note text.
    long = {"description": "d" * 65, "owner": "o" * 129, "note": "n" * 1000}
    cut = api.call("POST", "/addresses/first_free/7/", json={"hostname": "cut", **long})
    assert cut.status_code == 201
    [row] = api.call("GET", "/addresses/search_hostname/cut/").json()["data"]
    assert (row["description"], row["owner"], row["note"]) == ("d" * 64, "o" * 128, "n" * 1000)

    store.settings.strict_sql_mode = True
    refused = api.call("POST", "/addresses/first_free/7/", json={"hostname": "v", **long})
    assert (refused.status_code, refused.json()["message"]) == (
        500,
        "Error: SQLSTATE[22001]: String data, right truncated: 1406 Data too long for "
        "column 'description' at row 1",
    )
    assert api.call("GET", "/addresses/search_hostname/v/").status_code == 404


def test_owner_and_note_are_kept_returned_by_every_read_and_patched(api: Api) -> None:
    # Section 12: the API takes owner and note on create and returns them on every read.
    owner = "ipam-bridge 3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f ns/claim"
    note = "ipam-bridge cluster=3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f claim=ns/claim"
    body = {"hostname": "owner-probe.test", "description": "ipam-bridge ns/claim"}
    created = api.call(
        "POST", "/addresses/first_free/7/", json={**body, "owner": owner, "note": note}
    )
    aid = created.json()["id"]
    by_id = api.call("GET", f"/addresses/{aid}/").json()["data"]
    [found] = api.call("GET", "/addresses/search_hostname/owner-probe.test/").json()["data"]
    [listed] = [
        r for r in api.call("GET", "/subnets/7/addresses/").json()["data"] if str(r["id"]) == aid
    ]
    for row in (by_id, found, listed):
        assert (row["owner"], row["note"]) == (owner, note)

    moved = {
        "owner": "ipam-bridge other ns/claim",
        "note": "ipam-bridge cluster=other claim=ns/claim",
    }
    patched = api.call("PATCH", f"/addresses/{aid}/", json=moved)
    assert (patched.status_code, patched.json()["message"]) == (200, "Address updated")
    row = api.call("GET", f"/addresses/{aid}/").json()["data"]
    assert (row["owner"], row["note"], row["description"]) == (
        moved["owner"],
        moved["note"],
        "ipam-bridge ns/claim",  # untouched
    )


def test_mac_is_normalised(api: Api) -> None:
    created = api.call(
        "POST", "/addresses/first_free/7/", json={"hostname": "m", "mac": "AA-BB-CC-DD-EE-0F"}
    )
    row = api.call("GET", f"/addresses/{created.json()['id']}/").json()["data"]
    assert row["mac"] == "aa:bb:cc:dd:ee:0f"


def test_unsupported_content_type_and_method(api: Api) -> None:
    xml = api.call(
        "POST", "/addresses/first_free/7/", data=b"x", headers={"Content-Type": "text/plain"}
    )
    subnet_post = api.call("POST", "/subnets/", json={"subnet": "10.9.0.0"})
    assert xml.status_code == 415
    assert (subnet_post.status_code, subnet_post.json()["message"]) == (
        501,
        "Method not implemented",
    )


def test_sections(api: Api) -> None:
    sections = api.call("GET", "/sections/").json()["data"]
    by_name = api.call("GET", "/sections/capi-test/").json()["data"]
    subnets = api.call("GET", "/sections/3/subnets/").json()["data"]
    assert [s["id"] for s in sections] == [3] and by_name["id"] == 3
    assert [s["id"] for s in subnets] == [7, 8, 9, 10, 11, 12]
    assert api.call("GET", "/sections/99/").status_code == 404


def test_gateway_without_a_row_is_handed_out_until_registered(api: Api, store: Store) -> None:
    """first_free knows no gateway but a row (A.5): what ipam-bridge's reservation relies on."""
    bare = store.add_subnet("10.30.4.0/29", section_id=3)  # no gateway row
    assert "gateway" not in api.call("GET", f"/subnets/{bare.id}/").json()["data"]
    assert api.call("GET", f"/subnets/{bare.id}/first_free/").json()["data"] == "10.30.4.1"

    body = {
        "subnetId": bare.id,
        "ip": "10.30.4.1",
        "hostname": "ipam-bridge-reserved-gateway",
        "description": "ipam-bridge: the subnet's gateway, never assign",
    }
    registered = api.call("POST", "/addresses/", json=body)
    assert registered.status_code == 201
    assert registered.json()["message"] == "Address created"
    assert "data" not in registered.json()  # 5a: no data, the id only
    again = api.call("POST", "/addresses/", json=body)  # a second operator: 5b
    assert (again.status_code, again.json()["message"]) == (409, "IP address already exists")

    assert claim(api, bare.id, "node-1").json()["data"] == "10.30.4.2"
    # Still no gateway as phpIPAM reports it: the row is a plain address (is_gateway 0).
    assert "gateway" not in api.call("GET", f"/subnets/{bare.id}/").json()["data"]
    found = api.call("GET", "/addresses/search/10.30.4.1/").json()["data"]
    assert [(r["subnetId"], r["hostname"], r["is_gateway"]) for r in found] == [
        (bare.id, "ipam-bridge-reserved-gateway", 0)
    ]
    usage = api.call("GET", f"/subnets/{bare.id}/usage/").json()["data"]
    assert (usage["used"], usage["freehosts"], usage["maxhosts"]) == ("2", "4", "6")


@pytest.mark.parametrize("address", ["10.30.5.0", "10.30.5.7"], ids=["network", "broadcast"])
def test_network_and_broadcast_cannot_be_registered_below_31(
    api: Api, store: Store, address: str
) -> None:
    """5d / 5e: only first_free of an "is pool" subnet ever hands them out."""
    subnet = store.add_subnet("10.30.5.0/29", section_id=3)
    answer = api.call("POST", "/addresses/", json={"subnetId": subnet.id, "ip": address})
    assert answer.status_code == 500
    assert answer.json()["message"] == f"{address} is not a valid address for subnet 10.30.5.0/29"
