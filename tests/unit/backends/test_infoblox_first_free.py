"""`InfobloxBackend.first_free`: the address a first-free allocation would take, read-only.

WAPI shapes as in tests/unit/backends/test_infoblox.py (``network`` with its DHCP options,
``ipv4address`` search results with ``types``), from the WAPI 2.12 reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import responses
from responses import matchers

from backends.base import SubnetRef
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy

GM = "https://gm.example.com"
WAPI = f"{GM}/wapi/v2.12"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock


def backend(*cidrs: str) -> InfobloxBackend:
    config = InfobloxConfig(
        endpoint=GM,
        subnets=tuple(SubnetRef(cidr=cidr) for cidr in cidrs),
        username="capi",
        password="s3cr3t-Pa55",
        retry=RetryPolicy(attempts=1, sleep=lambda _: None),
    )
    return InfobloxBackend(config, session=requests.Session())


def add_network(rsps: responses.RequestsMock, cidr: str, routers: str | None) -> None:
    options: list[dict[str, Any]] = []
    if routers is not None:
        options.append(
            {
                "name": "routers",
                "num": 3,
                "use_option": True,
                "value": routers,
                "vendor_class": "DHCP",
            }
        )
    rsps.get(
        f"{WAPI}/network",
        match=[matchers.query_param_matcher({"network": cidr}, strict_match=False)],
        json=[
            {
                "_ref": f"network/x:{cidr}/default",
                "network": cidr,
                "network_view": "default",
                "options": options,
            }
        ],
    )


def add_used(rsps: responses.RequestsMock, cidr: str, *items: tuple[str, str]) -> None:
    rsps.get(
        f"{WAPI}/ipv4address",
        match=[
            matchers.query_param_matcher({"network": cidr, "status": "USED"}, strict_match=False)
        ],
        json={
            "result": [
                {"_ref": f"ipv4address/x:{ip}", "ip_address": ip, "types": [kind]}
                for ip, kind in items
            ]
        },
    )


def test_any_used_record_type_and_the_gateway_are_skipped(rsps: responses.RequestsMock) -> None:
    add_network(rsps, "10.20.0.0/24", routers="10.20.0.1")
    add_used(
        rsps,
        "10.20.0.0/24",
        ("10.20.0.0", "NETWORK"),
        ("10.20.0.2", "A"),
        ("10.20.0.3", "LEASE"),
        ("10.20.0.255", "BROADCAST"),
    )
    assert backend("10.20.0.0/24").first_free() == "10.20.0.4"
    assert {call.request.method for call in rsps.calls} == {"GET"}


def test_a_full_network_is_skipped_and_none_when_all_are_full(
    rsps: responses.RequestsMock,
) -> None:
    add_network(rsps, "10.20.1.0/30", routers=None)
    add_used(rsps, "10.20.1.0/30", ("10.20.1.1", "HOST"), ("10.20.1.2", "FA"))
    add_network(rsps, "10.20.2.0/29", routers="10.20.2.1")
    add_used(rsps, "10.20.2.0/29")
    assert backend("10.20.1.0/30", "10.20.2.0/29").first_free() == "10.20.2.2"

    rsps.reset()
    add_network(rsps, "10.20.1.0/30", routers=None)
    add_used(rsps, "10.20.1.0/30", ("10.20.1.1", "HOST"), ("10.20.1.2", "FA"))
    assert backend("10.20.1.0/30").first_free() is None
