"""The schema check of the unit tests' requests refuses what a WAPI 2.12 grid refuses."""

from __future__ import annotations

import json

import pytest
from wapi_requests import refusals

WAPI = "https://gm.example.com/wapi/v2.12"


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("GET", f"{WAPI}/fixedaddress?name=m1&network_view=default", None),
        ("GET", f"{WAPI}/ipv6fixedaddress?name=m1", None),
        ("GET", f"{WAPI}/record:host?network=10.0.0.0%2F24", None),
        ("GET", f"{WAPI}/record:host?name=a&_return_fields=name,colour", None),
        ("POST", f"{WAPI}/record:host", {"name": "a", "colour": "blue"}),
        ("PUT", f"{WAPI}/record:host/ZG5z:a/default", {"network_view": "lab"}),
        ("POST", f"{WAPI}/fixedaddress", {"ipv4addr": "func:nextavailablenetwork:10.0.0.0/8"}),
        (
            "POST",
            f"{WAPI}/record:host",
            {
                "name": "a",
                "ipv4addrs": [
                    {
                        "ipv4addr": {
                            "_object_function": "next_available_ip",
                            "_object": "record:host",
                            "_object_parameters": {"name": "x"},
                            "_result_field": "ips",
                        }
                    }
                ],
            },
        ),
        ("POST", f"{WAPI}/record:host/ZG5z:a/default?_function=next_available_ip", {}),
        ("GET", f"{WAPI}/grid", None),
    ],
)
def test_a_request_a_grid_refuses_is_reported(method: str, url: str, body: object) -> None:
    assert refusals(method, url, json.dumps(body) if body is not None else None)


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("GET", f"{WAPI}/ipv4address?names=m1&network_view=default", None),
        ("GET", f"{WAPI}/fixedaddress?network=10.0.0.0%2F24&_paging=1&_page_id=abc", None),
        ("GET", f"{WAPI}/record:host?name=a&view=default&_return_fields=name,ipv4addrs", None),
        ("POST", f"{WAPI}/network/ZG5z:10.0.0.0%2F24/default?_function=next_available_ip", {}),
        (
            "POST",
            f"{WAPI}/record:host",
            {
                "name": "a",
                "network_view": "default",
                "ipv4addrs": [
                    {
                        "ipv4addr": {
                            "_object_function": "next_available_ip",
                            "_object": "network",
                            "_object_parameters": {
                                "network": "10.0.0.0/24",
                                "network_view": "default",
                            },
                            "_result_field": "ips",
                            "_parameters": {"num": 1, "exclude": ["10.0.0.1"]},
                        },
                        "configure_for_dhcp": False,
                    }
                ],
            },
        ),
        ("DELETE", f"{WAPI}/fixedaddress/ZG5z:10.0.0.5/default", None),
    ],
)
def test_a_request_a_grid_accepts_passes(method: str, url: str, body: object) -> None:
    assert refusals(method, url, json.dumps(body) if body is not None else None) == []
