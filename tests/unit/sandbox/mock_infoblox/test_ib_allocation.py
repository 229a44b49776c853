"""func:nextavailableip: what is skipped, exhaustion, atomicity under concurrency (B.5)."""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from ib_helpers import SEED, Wapi, host_body

from mock_infoblox import InfobloxStore

NODES = ipaddress.IPv4Network("10.20.0.0/24")
RANGE = (ipaddress.IPv4Address("10.20.0.200"), ipaddress.IPv4Address("10.20.0.250"))
SEEDED_USED = {ipaddress.ip_address(u["ip"]) for u in SEED["used"]}

EXHAUSTED = {
    "Error": "AdmConDataError: None (IBDataError: IB.Data:Cannot find 1 available IP "
    "address(es) in this network.)",
    "code": "Client.Ibap.Data",
    "text": "Cannot find 1 available IP address(es) in this network.",
}


def allocate(wapi: Wapi, name: str, cidr: str = "10.20.0.0/24") -> Any:
    response = wapi.post("record:host", host_body(name, cidr=cidr), _return_fields="ipv4addrs")
    return response


def address_of(response: Any) -> ipaddress.IPv4Address:
    assert response.status_code == 201, response.text
    return ipaddress.IPv4Address(response.json()["ipv4addrs"][0]["ipv4addr"])


def test_first_allocation_skips_network_and_used(wapi: Wapi) -> None:
    first = address_of(allocate(wapi, "m1.default"))
    assert first != NODES.network_address
    assert first not in SEEDED_USED
    assert first == min(h for h in NODES.hosts() if h not in SEEDED_USED)


def test_allocation_skips_fixed_addresses_and_hosts(wapi: Wapi) -> None:
    taken = ["10.20.0.2", "10.20.0.3"]
    wapi.post("fixedaddress", {"ipv4addr": taken[0], "mac": "00:00:00:00:00:00"})
    wapi.post("record:host", host_body("lit.default") | {"ipv4addrs": [{"ipv4addr": taken[1]}]})
    got = address_of(allocate(wapi, "m1.default"))
    assert str(got) not in taken
    assert got == ipaddress.ip_address("10.20.0.4")


def test_exhaustion_never_hands_out_range_network_or_broadcast(wapi: Wapi) -> None:
    free = [h for h in NODES.hosts() if h not in SEEDED_USED and not RANGE[0] <= h <= RANGE[1]]
    got = [address_of(allocate(wapi, f"m{i}.default")) for i in range(len(free))]
    assert sorted(got) == free  # exactly the free ones, each once
    full = allocate(wapi, "one-too-many.default")
    assert full.status_code == 400
    assert full.json() == EXHAUSTED
    assert wapi.get("record:host", name="one-too-many.default").json() == []


def test_delete_frees_the_address(wapi: Wapi) -> None:
    response = wapi.post("record:host", host_body("m1.default"), _return_fields="ipv4addrs")
    first = address_of(response)
    wapi.delete(quote(response.json()["_ref"], safe="/:"))
    assert address_of(allocate(wapi, "m2.default")) == first


def test_network_not_found(wapi: Wapi) -> None:
    response = allocate(wapi, "m1.default", cidr="10.99.0.0/24")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "Client.Ibap.Data"
    assert "10.99.0.0/24" in body["text"]
    assert "Cannot find 1 available" not in body["text"]


def test_network_in_other_view_is_not_found(wapi: Wapi) -> None:
    body = host_body("m1.default")
    body["ipv4addrs"] = [{"ipv4addr": "func:nextavailableip:10.30.0.0/29,default"}]
    response = wapi.post("record:host", body)
    assert response.status_code == 400
    assert "10.30.0.0/29" in response.json()["text"]


def test_fixedaddress_allocation_and_literal_conflict(wapi: Wapi) -> None:
    body = {
        "name": "m1.default",
        "ipv4addr": "func:nextavailableip:10.20.0.0/24,default",
        "mac": "00:00:00:00:00:00",
        "network_view": "default",
    }
    created = wapi.post("fixedaddress", body, _return_fields="name,ipv4addr,network,network_view")
    assert created.status_code == 201
    record = created.json()
    assert record["network"] == "10.20.0.0/24"
    assert record["_ref"].endswith(f":{record['ipv4addr']}/default")
    # fixedaddress names are not unique (B.4): a second one with the same name is fine.
    second = wapi.post("fixedaddress", body, _return_fields="ipv4addr")
    assert second.json()["ipv4addr"] != record["ipv4addr"]
    clash = wapi.post("fixedaddress", {**body, "ipv4addr": record["ipv4addr"]})
    assert clash.status_code == 400
    assert clash.json()["code"] == "Client.Ibap.Data.Conflict"


def test_ipv6_host_and_fixed_address(wapi: Wapi) -> None:
    body = {
        "name": "v6.default",
        "configure_for_dns": False,
        "ipv6addrs": [{"ipv6addr": "func:nextavailableip:2001:db8:20::/64,default"}],
    }
    host = wapi.post("record:host", body, _return_fields="ipv6addrs").json()
    assert host["ipv6addrs"][0]["ipv6addr"] == "2001:db8:20::1"  # never the anycast prefix::
    fixed = wapi.post(
        "ipv6fixedaddress",
        {"ipv6addr": "func:nextavailableip:2001:db8:20::/64,default", "duid": "00:01"},
        _return_fields="ipv6addr,duid",
    ).json()
    assert fixed["ipv6addr"] == "2001:db8:20::2"
    used = wapi.get("ipv6address", network="2001:db8:20::/64", status="USED").json()
    assert [u["ip_address"] for u in used] == ["2001:db8:20::1", "2001:db8:20::2"]
    assert [u["types"] for u in used] == [["HOST"], ["FA"]]


def test_object_function_struct_with_exclude(wapi: Wapi) -> None:
    body = host_body("m1.default")
    body["ipv4addrs"] = [
        {
            "ipv4addr": {
                "_object_function": "next_available_ip",
                "_result_field": "ips",
                "_object": "network",
                "_object_parameters": {"network": "10.20.0.0/24", "network_view": "default"},
                "_parameters": {"exclude": ["10.20.0.2", "10.20.0.3"]},
            }
        }
    ]
    got = address_of(wapi.post("record:host", body, _return_fields="ipv4addrs"))
    assert got == ipaddress.ip_address("10.20.0.4")


def test_object_function_selects_network_by_ea(wapi: Wapi) -> None:
    body = {
        "ipv4addr": {
            "_object_function": "next_available_ip",
            "_result_field": "ips",
            "_object": "network",
            "_object_parameters": {"*Site": "dc1", "network_view": "default"},
        },
        "mac": "00:00:00:00:00:00",
    }
    created = wapi.post("fixedaddress", body, _return_fields="ipv4addr,network")
    assert created.json()["network"] == "10.20.0.0/24"


def test_range_form(wapi: Wapi) -> None:
    body = host_body("m1.default")
    body["ipv4addrs"] = [{"ipv4addr": "func:nextavailableip:10.20.0.10-10.20.0.11,default"}]
    assert address_of(wapi.post("record:host", body, _return_fields="ipv4addrs")) == (
        ipaddress.ip_address("10.20.0.10")
    )
    body["name"] = "m2.default"
    assert address_of(wapi.post("record:host", body, _return_fields="ipv4addrs")) == (
        ipaddress.ip_address("10.20.0.11")
    )
    body["name"] = "m3.default"
    full = wapi.post("record:host", body)
    assert full.status_code == 400
    assert full.json()["code"] == "Client.Ibap.Data"


def test_next_available_ip_function_reserves_nothing(wapi: Wapi) -> None:
    ref = wapi.get("network", network="10.20.0.0/24").json()[0]["_ref"]
    path = quote(ref, safe="/:")
    first = wapi.post(path, {"num": 3}, _function="next_available_ip")
    assert first.status_code == 200
    assert first.json() == {"ips": ["10.20.0.2", "10.20.0.3", "10.20.0.4"]}
    again = wapi.post(path, {"num": 1, "exclude": ["10.20.0.2"]}, _function="next_available_ip")
    assert again.json() == {"ips": ["10.20.0.3"]}
    illegal = wapi.get(path, _function="next_available_ip")
    assert illegal.status_code == 400
    assert illegal.json()["text"] == "Function next_available_ip illegal with this method"


def test_parallel_creates_never_share_an_address(wapi: Wapi, store: InfobloxStore) -> None:
    def create(i: int) -> tuple[int, str]:
        client = Wapi(wapi.base)
        try:
            response = allocate(client, f"par-{i}.default")
            return response.status_code, response.json()["ipv4addrs"][0]["ipv4addr"]
        finally:
            client.session.close()

    with ThreadPoolExecutor(max_workers=25) as pool:
        results = list(pool.map(create, range(100)))
    assert {status for status, _ in results} == {201}
    addresses = [ipaddress.IPv4Address(a) for _, a in results]
    assert len(set(addresses)) == 100
    assert not any(RANGE[0] <= a <= RANGE[1] for a in addresses)
    assert not SEEDED_USED & set(addresses)
    assert NODES.network_address not in addresses
    assert NODES.broadcast_address not in addresses
    hosts = store.dump()["objects"]["record:host"]
    assert len(hosts) == 100


def test_store_allocation_is_atomic_across_threads(store: InfobloxStore) -> None:
    def create(i: int) -> str:
        record = store.create("record:host", host_body(f"t-{i}.default"))
        return str(record["ipv4addrs"][0]["ipv4addr"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        addresses = list(pool.map(create, range(100)))
    assert len(set(addresses)) == 100


def next_excluding(cidr: str, exclude: list[str], network: str = "network") -> dict[str, Any]:
    """The object-function value ipam-bridge sends to skip the gateway (B.5 form 2)."""
    return {
        "_object_function": "next_available_ip",
        "_object": network,
        "_object_parameters": {"network": cidr, "network_view": "default"},
        "_result_field": "ips",
        "_parameters": {"num": 1, "exclude": exclude},
    }


def test_routers_option_is_not_skipped_but_exclude_is(wapi: Wapi, store: InfobloxStore) -> None:
    """next-available-IP knows used addresses, not DHCP option 3: the gap the client closes."""
    store.seed({"networks": [{"network": "10.40.0.0/29", "gateway": "10.40.0.1"}]})
    network = wapi.get("network", network="10.40.0.0/29", _return_fields="options").json()[0]
    assert {"name": "routers", "num": 3, "value": "10.40.0.1"}.items() <= next(
        o for o in network["options"] if o["name"] == "routers"
    ).items()

    plain = allocate(wapi, "plain.default", cidr="10.40.0.0/29")
    assert address_of(plain) == ipaddress.ip_address("10.40.0.1")  # the gateway, handed out

    for name, expected in (("a.default", "10.40.0.2"), ("b.default", "10.40.0.3")):
        body = host_body(name)
        body["ipv4addrs"] = [{"ipv4addr": next_excluding("10.40.0.0/29", ["10.40.0.4"])}]
        created = wapi.post("record:host", body, _return_fields="ipv4addrs")
        assert address_of(created) == ipaddress.ip_address(expected)
    body = host_body("c.default")
    body["ipv4addrs"] = [{"ipv4addr": next_excluding("10.40.0.0/29", ["10.40.0.4"])}]
    assert address_of(wapi.post("record:host", body, _return_fields="ipv4addrs")) == (
        ipaddress.ip_address("10.40.0.5")  # .4 skipped, nothing recorded for it
    )
    assert wapi.get("ipv4address", network="10.40.0.0/29", ip_address="10.40.0.4").json()[0][
        "status"
    ] == ("UNUSED")


def test_exclude_of_the_only_free_address_is_exhaustion(wapi: Wapi, store: InfobloxStore) -> None:
    store.seed({"networks": [{"network": "10.40.1.0/30", "gateway": "10.40.1.1"}]})
    first = wapi.post(
        "fixedaddress",
        {"ipv4addr": next_excluding("10.40.1.0/30", ["10.40.1.1"]), "mac": "00:00:00:00:00:00"},
        _return_fields="ipv4addr",
    )
    assert (first.status_code, first.json()["ipv4addr"]) == (201, "10.40.1.2")
    second = wapi.post(
        "fixedaddress",
        {"ipv4addr": next_excluding("10.40.1.0/30", ["10.40.1.1"]), "mac": "00:00:00:00:00:00"},
    )
    assert (second.status_code, second.json()) == (400, EXHAUSTED)


def test_ipv6_object_function_with_exclude(wapi: Wapi) -> None:
    value = next_excluding("2001:db8:20::/64", ["2001:db8:20::1"], network="ipv6network")
    host = wapi.post(
        "record:host",
        {"name": "v6.default", "configure_for_dns": False, "ipv6addrs": [{"ipv6addr": value}]},
        _return_fields="ipv6addrs",
    )
    assert host.json()["ipv6addrs"][0]["ipv6addr"] == "2001:db8:20::2"
    fixed = wapi.post(
        "ipv6fixedaddress", {"ipv6addr": value, "duid": "00:04"}, _return_fields="ipv6addr"
    )
    assert fixed.json()["ipv6addr"] == "2001:db8:20::3"
    wrong = wapi.post(
        "ipv6fixedaddress",
        {"ipv6addr": next_excluding("2001:db8:20::/64", []), "duid": "00:05"},
    )
    assert wrong.status_code == 400
    assert wrong.json()["code"] == "Client.Ibap.Proto"
