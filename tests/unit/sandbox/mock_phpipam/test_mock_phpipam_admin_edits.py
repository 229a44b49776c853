"""Edits behind the operator's back (``/_mock/addresses`` and the `Store` methods), and the
API calls of multi-subnet pools, requested addresses and quarantine on the mock.

Sources: phpipam-api.md 2c/2m (a subnet's address list, empty = 404), 4a/4b (search_hostname
across subnets, decimal ip from the 2nd row), 5a/5b (explicit ip, 409 duplicate), 10c (PATCH
hostname and description).
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
from phpipam_mock_helpers import Api

from mock_phpipam import MockPhpipamServer, Store


def admin(server: MockPhpipamServer, method: str, path: str, **kwargs: Any) -> requests.Response:
    """Call the mock's admin API (``/_mock...``): no token, never faulted, not journaled."""
    return requests.request(method, f"{server.base_url}/_mock{path}", timeout=5, **kwargs)


# ---------------------------------------------------------------- the API for pools


def test_search_hostname_spans_subnets_with_decimal_ip_from_the_second_row(api: Api) -> None:
    api.call("POST", "/addresses/first_free/9/", json={"hostname": "default.claim-1"})
    api.call("POST", "/addresses/first_free/7/", json={"hostname": "default.claim-1"})

    found = api.call("GET", "/addresses/search_hostname/default.claim-1/").json()["data"]

    assert [(r["subnetId"], r["ip"]) for r in found] == [(9, "10.20.1.1"), (7, "169082882")]


def test_explicit_ip_create_then_duplicate_in_any_notation(api: Api) -> None:
    body = {"subnetId": 8, "ip": "2001:db8:20::50", "hostname": "v6.static-50"}
    created = api.call("POST", "/addresses/", json=body)
    again = api.call(
        "POST",
        "/addresses/",
        json={**body, "ip": "2001:0db8:0020:0000:0000:0000:0000:0050", "hostname": "x"},
    )

    assert created.status_code == 201 and "data" not in created.json()
    assert created.headers["Location"] == f"/api/capi/addresses/{created.json()['id']}/"
    assert (again.status_code, again.json()["message"]) == (409, "IP address already exists")


def test_quarantine_patch_keeps_the_row_out_of_first_free_and_search(api: Api) -> None:
    claim = api.call("POST", "/addresses/first_free/7/", json={"hostname": "default.claim-1"})
    address_id = claim.json()["id"]
    mark = "ipam-bridge quarantined until 2027-01-15T08:00:00Z: ipam-bridge default/claim-1"

    patched = api.call(
        "PATCH",
        f"/addresses/{address_id}/",
        json={"hostname": "quarantined.default.claim-1", "description": mark[:64]},
    )
    old = api.call("GET", "/addresses/search_hostname/default.claim-1/")
    listed = api.call("GET", "/subnets/7/addresses/").json()["data"]
    next_free = api.call("POST", "/addresses/first_free/7/", json={"hostname": "default.c2"})

    assert patched.json()["message"] == "Address updated"
    assert (old.status_code, old.json()["message"]) == (404, "Hostname not found")
    assert [(r["ip"], r["hostname"], r["description"]) for r in listed][1] == (
        "10.20.0.2",
        "quarantined.default.claim-1",
        mark[:64],
    )
    assert next_free.json()["data"] == "10.20.0.3"


def test_empty_subnet_lists_no_addresses(api: Api) -> None:
    answer = api.call("GET", "/subnets/9/addresses/")
    assert (answer.status_code, answer.json()["message"]) == (404, "No addresses found")


# ---------------------------------------------------------------- admin over HTTP


def test_admin_adds_renames_and_deletes_entries_unseen_by_the_journal(
    server: MockPhpipamServer, store: Store, api: Api
) -> None:
    store.clear_journal()

    added = admin(
        server,
        "POST",
        "/addresses",
        json={"subnet": "10.20.0.0/24", "ip": "10.20.0.77", "hostname": "printer-3", "note": "x"},
    )
    renamed = admin(server, "PATCH", "/addresses/10.20.0.77", json={"hostname": "printer-4"})
    via_api = api.call("GET", "/addresses/search/10.20.0.77/").json()["data"]
    deleted = admin(server, "DELETE", "/addresses/10.20.0.77?subnetId=7")
    gone = api.call("GET", "/addresses/search/10.20.0.77/")

    assert added.status_code == 201
    assert (added.json()["subnetId"], added.json()["hostname"]) == (7, "printer-3")
    assert renamed.status_code == 200 and renamed.json()["editDate"] is not None
    assert [r["hostname"] for r in via_api] == ["printer-4"]
    assert deleted.json()["hostname"] == "printer-4"
    assert gone.status_code == 404
    assert [e.path for e in store.requests()] == [
        "/api/capi/addresses/search/10.20.0.77/",
        "/api/capi/addresses/search/10.20.0.77/",
    ]


def test_admin_lists_rows_per_subnet(server: MockPhpipamServer, store: Store) -> None:
    store.add_address(9, "10.20.1.2", hostname="tiny")

    everything = admin(server, "GET", "/addresses").json()["addresses"]
    tiny = admin(server, "GET", "/addresses?subnet=10.20.1.0/30").json()["addresses"]

    assert [r["ip"] for r in everything] == ["10.20.0.1", "10.20.1.2"]
    assert [(r["ip"], r["hostname"]) for r in tiny] == [("10.20.1.2", "tiny")]


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/addresses", {"subnetId": 7, "ip": "10.20.0.1"}, 409),  # the gateway row
        ("POST", "/addresses", {"subnetId": 99, "ip": "10.20.0.5"}, 400),
        ("POST", "/addresses", {"subnetId": 7, "ip": "10.30.0.5"}, 400),  # outside
        ("POST", "/addresses", {"subnetId": 7, "ip": "10.20.0.5", "bogus": 1}, 400),
        ("POST", "/addresses", {"ip": "10.20.0.5"}, 400),
        ("PATCH", "/addresses/10.20.0.99", {"hostname": "x"}, 404),
        ("PATCH", "/addresses/10.20.0.1", {"ip": "10.20.0.2"}, 400),
        ("PATCH", "/addresses/10.20.0.1", {"mac": "nope"}, 400),
        ("PATCH", "/addresses/not-an-ip", {"hostname": "x"}, 400),
        ("DELETE", "/addresses/10.20.0.99", None, 404),
    ],
)
def test_admin_refuses_what_cannot_be_done(
    server: MockPhpipamServer, method: str, path: str, body: object, status: int
) -> None:
    answer = admin(server, method, path, json=body)
    assert answer.status_code == status
    assert answer.json()["error"]


def test_admin_needs_the_subnet_of_an_address_held_twice(
    server: MockPhpipamServer, store: Store
) -> None:
    other = store.add_subnet("10.20.0.0/24", section_id=1, description="same CIDR, other section")
    store.add_address(other.id, "10.20.0.1", hostname="elsewhere")

    ambiguous = admin(server, "DELETE", "/addresses/10.20.0.1")
    chosen = admin(server, "DELETE", f"/addresses/10.20.0.1?subnetId={other.id}")

    assert ambiguous.status_code == 400
    assert chosen.json()["hostname"] == "elsewhere"
    assert store.locate("10.20.0.1").hostname == "gw.capi-test"


def test_admin_works_while_the_api_is_down(server: MockPhpipamServer, api: Api) -> None:
    server.faults.update(down=True, down_mode="503")

    added = admin(server, "POST", "/addresses", json={"subnetId": 7, "ip": "10.20.0.9"})
    refused = api.call("GET", "/subnets/7/")

    assert (added.status_code, refused.status_code) == (201, 503)


def test_store_edits_match_the_http_ones(store: Store) -> None:
    store.add_address(8, "2001:db8:20::5", hostname="v6")
    renamed = store.edit_address("2001:0db8:20::0005", {"hostname": "v6-renamed"})
    assert (renamed.hostname, str(renamed.ip)) == ("v6-renamed", "2001:db8:20::5")
    assert store.remove_address("2001:db8:20::5").hostname == "v6-renamed"
    with pytest.raises(LookupError):
        store.locate("2001:db8:20::5")
    with pytest.raises(ValueError, match="cannot set"):
        store.edit_address("10.20.0.1", {"subnetId": 8})
