"""A witness nobody here wrote: phpypam against the mock phpIPAM.

``phpypam`` 1.0.3 (the client of the codeaffen phpIPAM Ansible collection, pinned in the ``test``
extra) sends form-encoded bodies and raises its own exceptions by its own not-found rules. Run
step by step against a real phpIPAM 1.8.2 and against the mock, on the same /28 with a gateway
row, all 18 steps ended the same way (issue 31). These tests keep it so: each asserts what the
real server answered (../shared/reference/phpipam-api.md, cited by transcript number).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import phpypam
import pytest
from phpypam.core.exceptions import (
    PHPyPAMEntityNotFoundException,
    PHPyPAMException,
    PHPyPAMInvalidCredentials,
    PHPyPAMInvalidSyntax,
)

from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

USER, PASSWORD, APP = "ipam-bridge", "s3cret-pass", "capi"
SUBNET = 10
SEED: dict[str, Any] = {
    "users": [{"username": USER, "password": PASSWORD}],
    "apps": [{"id": APP, "permissions": 2, "security": "none"}],
    "sections": [
        {
            "id": 3,
            "name": "capi-test",
            "subnets": [{"id": SUBNET, "cidr": "10.20.2.0/28", "gateway": "10.20.2.1"}],
        }
    ],
}


@pytest.fixture
def server() -> Iterator[MockPhpipamServer]:
    """A fresh mock phpIPAM: one /28 whose gateway row is 10.20.2.1."""
    with MockPhpipamServer(Store(SEED)) as srv:
        yield srv


@pytest.fixture
def api(server: MockPhpipamServer) -> Any:
    """phpypam logged in (it logs in when built: ``POST /api/<app>/user/`` with Basic auth)."""
    return phpypam.api(url=server.base_url, app_id=APP, username=USER, password=PASSWORD)


def test_a_wrong_password_is_invalid_credentials(server: MockPhpipamServer) -> None:
    # 1b: HTTP 500 "Invalid username or password", which phpypam turns into this exception.
    with pytest.raises(PHPyPAMInvalidCredentials, match="Invalid username or password"):
        phpypam.api(url=server.base_url, app_id=APP, username=USER, password="wrong")


def test_subnet_usage_and_first_free(api: Any) -> None:
    subnet = api.get_entity("subnets", f"{SUBNET}/")
    assert (subnet["subnet"], subnet["mask"]) == ("10.20.2.0", "28")  # mask is a string (2d)
    assert subnet["gateway"]["ip_addr"] == "10.20.2.1"
    usage = api.get_entity("subnets", f"{SUBNET}/usage/")
    assert (usage["used"], usage["freehosts"], usage["maxhosts"]) == ("1", "13", "14")
    # 2b: a bare string; a GET takes nothing, so the POST gets the same address (3a).
    assert api.get_entity("subnets", f"{SUBNET}/first_free/") == "10.20.2.2"
    created = api.create_entity(
        "addresses", f"first_free/{SUBNET}/", data={"hostname": "a.ns1", "description": "d"}
    )
    assert created == "10.20.2.2"
    assert api.get_entity("subnets", f"{SUBNET}/first_free/") == "10.20.2.3"


def test_search_by_hostname_finds_the_form_encoded_row(api: Any) -> None:
    api.create_entity("addresses", f"first_free/{SUBNET}/", data={"hostname": "a.ns1"})
    rows = api.get_entity("addresses", "search_hostname/A.NS1/")  # 4e: case-insensitive
    assert [(r["ip"], r["hostname"], r["subnetId"]) for r in rows] == [
        ("10.20.2.2", "a.ns1", SUBNET)
    ]
    # 4c: 404 "Hostname not found", one of phpypam's not-found messages.
    with pytest.raises(PHPyPAMEntityNotFoundException, match="Hostname not found"):
        api.get_entity("addresses", "search_hostname/missing.ns1/")


def test_a_taken_ip_is_refused_and_a_given_ip_is_created(api: Any) -> None:
    # 5b: 409 "IP address already exists": phpypam maps no subclass to 409.
    taken = {"subnetId": SUBNET, "ip": "10.20.2.1", "hostname": "x"}
    with pytest.raises(PHPyPAMException) as caught:
        api.create_entity("addresses", data=taken)
    assert type(caught.value) is PHPyPAMException
    # 5a: 201 without data, which phpypam returns as None.
    given = {"subnetId": SUBNET, "ip": "10.20.2.9", "hostname": "b.ns1"}
    assert api.create_entity("addresses", data=given) is None
    rows = api.get_entity("addresses", "search/10.20.2.9/")
    assert [(r["hostname"], r["subnetId"]) for r in rows] == [("b.ns1", SUBNET)]
    listing = api.get_entity("subnets", f"{SUBNET}/addresses/")
    assert sorted(r["ip"] for r in listing) == ["10.20.2.1", "10.20.2.9"]
    assert [r["hostname"] for r in listing if r["ip"] == "10.20.2.1"] != ["x"]


def test_update_then_delete_by_id_and_by_ip(api: Any) -> None:
    api.create_entity("addresses", data={"subnetId": SUBNET, "ip": "10.20.2.9", "hostname": "b"})
    api.create_entity("addresses", f"first_free/{SUBNET}/", data={"hostname": "a"})
    row = api.get_entity("addresses", "search/10.20.2.9/")[0]
    assert api.update_entity("addresses", f"{row['id']}/", data={"description": "new"}) is None
    assert api.get_entity("addresses", f"{row['id']}/")["description"] == "new"
    assert api.delete_entity("addresses", f"{row['id']}/") is None  # 6a
    with pytest.raises(PHPyPAMEntityNotFoundException, match="Address does not exist"):
        api.delete_entity("addresses", f"{row['id']}/")  # 6b: 404
    assert api.delete_entity("addresses", f"10.20.2.2/{SUBNET}/") is None  # 6d
    with pytest.raises(PHPyPAMEntityNotFoundException, match="Address not found"):
        api.get_entity("addresses", "search/10.20.2.2/")  # 6j
    listing = api.get_entity("subnets", f"{SUBNET}/addresses/")
    assert [r["ip"] for r in listing] == ["10.20.2.1"]  # the gateway row stays


def test_unknown_subnet_and_unknown_id(api: Any) -> None:
    # 2f: 400 on /subnets/{id}/ (phpypam: invalid syntax), 2g: 404 on /usage/ (not found).
    with pytest.raises(PHPyPAMInvalidSyntax, match=r"Invalid subnet Id \(9999\)"):
        api.get_entity("subnets", "9999/")
    with pytest.raises(PHPyPAMEntityNotFoundException, match=r"Invalid subnet Id \(9999\)"):
        api.get_entity("subnets", "9999/usage/")
    with pytest.raises(PHPyPAMEntityNotFoundException, match="Invalid Id"):
        api.get_entity("addresses", "99999/")  # 4g
    with pytest.raises(PHPyPAMEntityNotFoundException, match="No subnets found"):
        api.get_entity("subnets", "cidr/10.99.0.0/24/")  # 2e
    assert [s["id"] for s in api.get_entity("subnets", "cidr/10.20.2.0/28/")] == [SUBNET]
