"""ipv4address views, _max_results (-1000 default), paging with next_page_id (B.3, B.4, B.7)."""

from __future__ import annotations

import ipaddress

from ib_helpers import Wapi, host_body

from mock_infoblox import InfobloxStore


def test_ipv4address_used_view(wapi: Wapi) -> None:
    ref = wapi.post("record:host", host_body("m1.default")).json()
    used = wapi.get("ipv4address", network="10.20.0.0/24", status="USED").json()
    by_ip = {u["ip_address"]: u for u in used}
    assert set(by_ip) == {"10.20.0.0", "10.20.0.1", "10.20.0.2", "10.20.0.255"}
    assert by_ip["10.20.0.0"]["types"] == ["NETWORK"]
    assert by_ip["10.20.0.255"]["types"] == ["BROADCAST"]
    assert by_ip["10.20.0.1"]["types"] == ["A"]
    assert by_ip["10.20.0.1"]["names"] == ["gw.cluster.example.com"]
    host = by_ip["10.20.0.2"]
    assert host["types"] == ["HOST"]
    assert host["names"] == ["m1.default"]
    assert host["objects"] == [ref]
    assert host["status"] == "USED"
    assert host["network"] == "10.20.0.0/24"
    assert host["network_view"] == "default"
    assert host["_ref"].startswith("ipv4address/") and host["_ref"].endswith(":10.20.0.2")


def test_ipv4address_unused_and_range_types(wapi: Wapi) -> None:
    item = wapi.get("ipv4address", ip_address="10.20.0.201").json()
    assert len(item) == 1
    assert item[0]["status"] == "UNUSED"
    assert item[0]["types"] == ["RESERVED_RANGE"]
    plain = wapi.get("ipv4address", ip_address="10.20.0.7").json()[0]
    assert plain["status"] == "UNUSED"
    assert plain["types"] == []


def test_ipv4address_unused_count(wapi: Wapi) -> None:
    unused = wapi.get("ipv4address", network="10.20.0.0/24", status="UNUSED").json()
    assert len(unused) == 256 - 3  # network, broadcast, the seeded gateway


def test_default_max_results_is_an_error_above_1000(wapi: Wapi, store: InfobloxStore) -> None:
    store.create("network", {"network": "10.40.0.0/22"})
    response = wapi.get("ipv4address", network="10.40.0.0/22")
    assert response.status_code == 400
    assert response.json() == {
        "Error": "AdmConProtoError: Result set too large (> 1000)",
        "code": "Client.Ibap.Proto",
        "text": "Result set too large (> 1000)",
    }


def test_max_results_positive_truncates_negative_errors(wapi: Wapi) -> None:
    truncated = wapi.get("ipv4address", network="10.20.0.0/24", _max_results="10").json()
    assert [t["ip_address"] for t in truncated] == [f"10.20.0.{i}" for i in range(10)]
    too_many = wapi.get("ipv4address", network="10.20.0.0/24", _max_results="-10")
    assert too_many.status_code == 400
    assert too_many.json()["text"] == "Result set too large (> 10)"
    enough = wapi.get("ipv4address", network="10.20.0.0/24", _max_results="-256")
    assert len(enough.json()) == 256


def test_paging_walks_every_result_once(wapi: Wapi) -> None:
    seen: list[str] = []
    pages = 0
    params = {
        "network": "10.20.0.0/24",
        "_paging": "1",
        "_return_as_object": "1",
        "_max_results": "100",
        "_return_fields": "ip_address",
    }
    response = wapi.get("ipv4address", **params).json()
    while True:
        pages += 1
        assert set(response) <= {"result", "next_page_id"}
        seen.extend(item["ip_address"] for item in response["result"])
        if "next_page_id" not in response:
            break
        response = wapi.get(
            "ipv4address", _page_id=response["next_page_id"], _return_as_object="1"
        ).json()
    assert pages == 3
    assert seen == [str(ip) for ip in ipaddress.ip_network("10.20.0.0/24")]


def test_paging_of_objects(wapi: Wapi) -> None:
    for i in range(5):
        wapi.post("record:host", host_body(f"p{i}.default"))
    first = wapi.get("record:host", _paging="1", _return_as_object="1", _max_results="2").json()
    assert len(first["result"]) == 2
    second = wapi.get("record:host", _page_id=first["next_page_id"], _return_as_object="1").json()
    third = wapi.get("record:host", _page_id=second["next_page_id"], _return_as_object="1").json()
    assert "next_page_id" not in third
    names = [r["name"] for page in (first, second, third) for r in page["result"]]
    assert names == [f"p{i}.default" for i in range(5)]


def test_paging_needs_return_as_object(wapi: Wapi) -> None:
    response = wapi.get("record:host", _paging="1", _max_results="10")
    assert response.status_code == 400
    assert response.json() == {
        "Error": "AdmConProtoError: _return_as_object needs to be enabled for paging requests.",
        "code": "Client.Ibap.Proto",
        "text": "_return_as_object needs to be enabled for paging requests.",
    }


def test_unknown_page_id(wapi: Wapi) -> None:
    response = wapi.get("record:host", _page_id="789cdeadbeef", _return_as_object="1")
    assert response.status_code == 400
    assert response.json()["code"] == "Client.Ibap.Proto"


def test_unknown_control_argument(wapi: Wapi) -> None:
    response = wapi.get("record:host", _bogus="1")
    assert response.status_code == 400
    assert response.json()["text"] == "Unknown argument/field: '_bogus'"


def test_network_utilization_follows_usage(wapi: Wapi) -> None:
    def utilization() -> int:
        item = wapi.get("network", network="10.30.0.0/29", network_view="lab",
                        _return_fields="utilization,total_hosts").json()[0]  # fmt: skip
        return int(item["utilization"])

    assert utilization() == 0
    body = host_body("u.default", cidr="10.30.0.0/29", network_view="lab")
    body["ipv4addrs"] = [{"ipv4addr": "func:nextavailableip:10.30.0.0/29,lab"}]
    wapi.post("record:host", body)
    assert utilization() == 100 // 6
