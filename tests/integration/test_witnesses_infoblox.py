"""A witness nobody here wrote: Infoblox's own Python client against the mock grid.

``infoblox-client`` 0.6.2 (infobloxopen/infoblox-client, pinned in the ``test`` extra) drives
`mock_infoblox` over HTTPS, through its ``InfobloxObjectManager`` as its users do. Each test
asserts what a grid answers the same calls (WAPI 2.12; ../shared/reference/wapi-2.12/README.md
and reference/backends.md): a client and a mock written together could agree on a mistake,
Infoblox's client cannot. The search-only fields it sends (``record:host?ipv4addr=``,
``ipv6addr=``, ``mac=``; ``network?contains_address=``) are accepted; what a grid refuses
(``fixedaddress?name=``, ``record:host?network=`` at 2.12) is still refused.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import trustme
from infoblox_client import connector, exceptions, object_manager, objects

from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore

V4 = "10.40.0.0/24"
V6 = "2001:db8:40::/64"
ZONE = "witness.example"
SEED: dict[str, Any] = {
    "extensible_attributes": [{"name": "Owner", "type": "STRING"}],
    "zones": [{"fqdn": ZONE, "view": "default"}],
    "networks": [{"network": V4, "gateway": "10.40.0.1"}, {"network": V6}],
    "ranges": [{"start_addr": "10.40.0.100", "end_addr": "10.40.0.110", "network_view": "default"}],
}
ZERO_MAC = "00:00:00:00:00:00"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """The CA that signs the mock grid's certificate."""
    return trustme.CA()


@pytest.fixture
def grid(ca: trustme.CA) -> Iterator[MockInfobloxServer]:
    """A fresh mock grid over HTTPS (infoblox-client speaks only HTTPS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    store = InfobloxStore.from_seed(SEED)
    with MockInfobloxServer(store, ssl_context=context) as server:
        yield server


@pytest.fixture
def cafile(ca: trustme.CA) -> Iterator[str]:
    """The CA bundle as a file, for infoblox-client's ``ssl_verify``."""
    with ca.cert_pem.tempfile() as path:
        yield path


@pytest.fixture
def conn(grid: MockInfobloxServer, cafile: str) -> connector.Connector:
    """infoblox-client's connector on the mock grid (certificate verified, no retries)."""
    return connector.Connector(
        {
            "host": grid.url.split("://", 1)[1],
            "username": "admin",
            "password": "infoblox",
            "ssl_verify": cafile,
            "wapi_version": "2.12",
            "max_retries": 0,
        }
    )


@pytest.fixture
def om(conn: connector.Connector) -> object_manager.InfobloxObjectManager:
    """infoblox-client's object manager, the API its users call."""
    return object_manager.InfobloxObjectManager(conn)


def _host_from_range(om: object_manager.InfobloxObjectManager, name: str) -> Any:
    return om.create_host_record_from_range(
        "default", "default", ZONE, name, ZERO_MAC, "10.40.0.100", "10.40.0.110", None, False
    )


def test_networks_v4_and_v6_are_found(om: object_manager.InfobloxObjectManager) -> None:
    v4 = om.get_network("default", V4)
    v6 = om.get_network("default", V6)
    assert (v4.network, v4.network_view) == (V4, "default")
    assert v6.network == V6
    assert om.get_network("default", "10.99.0.0/24") is None


def test_next_available_fixed_addresses_v4_and_v6(
    om: object_manager.InfobloxObjectManager,
) -> None:
    # A grid's next-available-IP skips only used addresses and ranges: the routers option
    # reserves nothing, so the first address is the gateway's .1.
    v4 = om.create_fixed_address_from_cidr("default", ZERO_MAC, V4, None)
    v6 = om.create_fixed_address_from_cidr("default", "00:00:00:00:00:01", V6, None)
    assert v4.ip == "10.40.0.1" and v4.mac == ZERO_MAC
    assert v6.ip == "2001:db8:40::1" and v6.duid
    again = om.create_fixed_address_from_cidr("default", ZERO_MAC, V4, None)
    assert again.ip == "10.40.0.2"


def test_a_taken_ip_is_refused_as_a_conflict(om: object_manager.InfobloxObjectManager) -> None:
    om.create_fixed_address_for_given_ip("default", ZERO_MAC, "10.40.0.50", None)
    with pytest.raises(exceptions.InfobloxCannotCreateObject) as caught:
        om.create_fixed_address_for_given_ip("default", "00:00:00:00:00:03", "10.40.0.50", None)
    assert "Client.Ibap.Data.Conflict" in str(caught.value)


def test_host_record_from_a_range_then_a_taken_name_is_refused(
    om: object_manager.InfobloxObjectManager,
) -> None:
    host = _host_from_range(om, "node-1")
    assert host.name == f"node-1.{ZONE}"
    assert host.ip[0].ip == "10.40.0.100"  # the first address of the range
    with pytest.raises(exceptions.InfobloxCannotCreateObject) as caught:
        _host_from_range(om, "node-1")
    assert "already exists" in str(caught.value)


def test_host_record_by_address_the_search_only_ipv4addr(
    om: object_manager.InfobloxObjectManager,
) -> None:
    _host_from_range(om, "node-2")
    found = om.get_host_record("default", "10.40.0.100")
    assert found is not None and found.name == f"node-2.{ZONE}"
    named = om.find_hostname("default", f"node-2.{ZONE}", "10.40.0.100")
    assert named is not None and named.name == f"node-2.{ZONE}"
    assert om.get_host_record("default", "10.40.0.101") is None
    assert om.find_hostname("default", f"other.{ZONE}", "10.40.0.100") is None


def test_host_record_by_ipv6addr_and_mac(
    om: object_manager.InfobloxObjectManager, conn: connector.Connector
) -> None:
    om.create_host_record_for_given_ip(
        "default", ZONE, "v6-node", "aa:bb:cc:dd:ee:01", "2001:db8:40::5", None, False
    )
    om.create_host_record_for_given_ip(
        "default", ZONE, "v4-node", "aa:bb:cc:dd:ee:02", "10.40.0.60", None, False
    )
    by_v6 = conn.get_object("record:host", {"ipv6addr": "2001:db8:40::5"})
    by_mac = conn.get_object("record:host", {"mac": "aa:bb:cc:dd:ee:02"})
    assert [h["name"] for h in by_v6] == [f"v6-node.{ZONE}"]
    assert [h["name"] for h in by_mac] == [f"v4-node.{ZONE}"]
    assert not conn.get_object("record:host", {"ipv6addr": "2001:db8:40::6"})


def test_extensible_attributes_updated_are_read_back(
    om: object_manager.InfobloxObjectManager,
) -> None:
    _host_from_range(om, "node-3")
    om.update_host_record_eas("default", "10.40.0.100", objects.EA({"Owner": "platform"}))
    om.create_fixed_address_for_given_ip("default", ZERO_MAC, "10.40.0.50", None)
    om.update_fixed_address_eas("default", "10.40.0.50", objects.EA({"Owner": "network"}))
    assert om.get_host_record("default", "10.40.0.100").extattrs.get("Owner") == "platform"
    fixed = om.get_fixed_addresses_by_mac("default", ZERO_MAC)
    assert [f.extattrs.get("Owner") for f in fixed] == ["network"]


def test_deletes_by_address(om: object_manager.InfobloxObjectManager) -> None:
    _host_from_range(om, "node-4")
    om.create_fixed_address_for_given_ip("default", ZERO_MAC, "10.40.0.50", None)
    om.delete_host_record("default", "10.40.0.100")
    om.delete_fixed_address("default", "10.40.0.50")
    assert om.get_host_record("default", "10.40.0.100") is None
    assert om.get_fixed_addresses_by_mac("default", ZERO_MAC) == []
    # The address is free again: next-available hands it out.
    assert _host_from_range(om, "node-5").ip[0].ip == "10.40.0.100"


def test_an_unknown_network_view_finds_nothing_and_creates_nothing(
    om: object_manager.InfobloxObjectManager,
) -> None:
    assert om.get_network("no-such-view", V4) is None
    with pytest.raises(exceptions.InfobloxCannotCreateObject):
        om.create_fixed_address_for_given_ip("no-such-view", ZERO_MAC, "10.40.0.51", None)


def test_network_by_contains_address(conn: connector.Connector) -> None:
    found = conn.get_object("network", {"contains_address": "10.40.0.7"})
    assert [n["network"] for n in found] == [V4]
    assert not conn.get_object("network", {"contains_address": "10.41.0.7"})


@pytest.mark.parametrize(
    ("obj_type", "field", "value"),
    [("fixedaddress", "name", "printer"), ("record:host", "network", V4)],
)
def test_what_a_grid_refuses_is_still_refused(
    grid: MockInfobloxServer, cafile: str, obj_type: str, field: str, value: str
) -> None:
    answer = requests.get(
        f"{grid.url}/wapi/v2.12/{obj_type}",
        params={field: value},
        auth=("admin", "infoblox"),
        verify=cafile,
        timeout=10,
    )
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "Client.Ibap.Proto"
    assert field in body["text"]  # "Field is not searchable: name" (a field of the object)
