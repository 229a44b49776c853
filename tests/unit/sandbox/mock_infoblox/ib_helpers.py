"""Seed and HTTP helpers shared by the mock_infoblox tests."""

from __future__ import annotations

from typing import Any

import requests

USER, PASSWORD = "capi", "s3cr3t-Pa55"

SEED: dict[str, Any] = {
    "users": {USER: PASSWORD},
    "network_views": ["default", "lab"],
    "dns_views": [{"name": "internal", "network_view": "default"}],
    "zones": [{"fqdn": "cluster.example.com", "view": "default"}],
    "extensible_attributes": [{"name": "Owner", "type": "STRING"}, "Site"],
    "networks": [
        {
            "network": "10.20.0.0/24",
            "gateway": "10.20.0.1",
            "comment": "nodes",
            "extattrs": {"Site": "dc1"},
        },
        {"network": "10.30.0.0/29", "network_view": "lab"},
        {"network": "2001:db8:20::/64", "comment": "v6 nodes"},
    ],
    "ranges": [{"start_addr": "10.20.0.200", "end_addr": "10.20.0.250"}],
    "used": [{"ip": "10.20.0.1", "names": ["gw.cluster.example.com"], "types": ["A"]}],
}


class Wapi:
    """A tiny client for the tests: Basic auth on every request, like infoblox-go-client."""

    def __init__(self, base: str, version: str = "v2.12") -> None:
        self.base = base
        self.url = f"{base}/wapi/{version}"
        self.session = requests.Session()
        self.session.auth = (USER, PASSWORD)

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.session.get(f"{self.url}/{path}", params=params, timeout=10)

    def post(self, path: str, body: Any = None, **params: Any) -> requests.Response:
        return self.session.post(f"{self.url}/{path}", params=params, json=body, timeout=10)

    def put(self, path: str, body: Any, **params: Any) -> requests.Response:
        return self.session.put(f"{self.url}/{path}", params=params, json=body, timeout=10)

    def delete(self, path: str) -> requests.Response:
        return self.session.delete(f"{self.url}/{path}", timeout=10)


def host_body(name: str, cidr: str = "10.20.0.0/24", **extra: Any) -> dict[str, Any]:
    """The body ipam-bridge sends for a host record outside DNS."""
    return {
        "name": name,
        "configure_for_dns": False,
        "network_view": "default",
        "ipv4addrs": [{"ipv4addr": f"func:nextavailableip:{cidr},default"}],
        **extra,
    }
