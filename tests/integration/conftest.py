"""Fixtures of the integration tests: the real operator, the emulated API, the IPAM mocks.

Every test gets a fresh emulated Kubernetes API with the operator running in-process
(`bridge.testing.Sandbox`) and fresh mock IPAM servers on 127.0.0.1.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bridge.testing.sandbox import Sandbox
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

NAMESPACE = "test"
CREDENTIALS = {"username": "capi-operator", "password": "Pa55-w0rd-never-logged"}

#: phpIPAM: subnet 7 is a /24 with a gateway, 8 an IPv6 /64 without one, 9 a /30 (two
#: usable hosts, for exhaustion), 10 a /28.
PHPIPAM_SEED: dict[str, Any] = {
    "users": [{"username": CREDENTIALS["username"], "password": CREDENTIALS["password"]}],
    "apps": [
        {"id": "capi", "permissions": 2, "security": "none"},
        {"id": "capicode", "permissions": 2, "security": "ssl_code",
         "code": "app-code-token-0123456789"},
    ],
    "sections": [{"id": 3, "name": "capi-test", "subnets": [
        {"id": 7, "cidr": "10.20.0.0/24", "gateway": "10.20.0.1"},
        {"id": 8, "cidr": "2001:db8:20::/64"},
        {"id": 9, "cidr": "10.20.1.0/30"},
        {"id": 10, "cidr": "10.20.2.0/28", "gateway": "10.20.2.1"},
    ]}],
}

#: Infoblox: the same shapes as networks of the default network view.
INFOBLOX_SEED: dict[str, Any] = {
    "users": {CREDENTIALS["username"]: CREDENTIALS["password"]},
    "zones": [{"fqdn": "nodes.example.com", "view": "default"}],
    "extensible_attributes": [{"name": "Owner", "type": "STRING"}],
    "networks": [
        {"network": "10.20.0.0/24", "network_view": "default", "gateway": "10.20.0.1"},
        {"network": "2001:db8:20::/64", "network_view": "default"},
        {"network": "10.20.1.0/30", "network_view": "default"},
    ],
    "used": [{"ip": "10.20.0.1", "network_view": "default", "names": ["gateway"],
              "types": ["A"]}],
}


@pytest.fixture
def phpipam() -> Iterator[MockPhpipamServer]:
    """A fresh mock phpIPAM seeded with `PHPIPAM_SEED` (its ``.store`` is inspectable)."""
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield server


@pytest.fixture
def infoblox() -> Iterator[MockInfobloxServer]:
    """A fresh WAPI mock seeded with `INFOBLOX_SEED`."""
    with MockInfobloxServer(InfobloxStore.from_seed(copy.deepcopy(INFOBLOX_SEED))) as server:
        yield server


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    """Factory of sandboxes (``make_sandbox(settings={...}, capi_versions=(...))``).

    Each one is entered, gets the namespace `NAMESPACE`, and is closed after the test.
    """
    opened: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        sandbox = Sandbox(**kwargs).__enter__()
        opened.append(sandbox)
        sandbox.namespace(NAMESPACE)
        return sandbox

    yield make
    for sandbox in reversed(opened):
        sandbox.__exit__(None, None, None)


@pytest.fixture
def sandbox(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """The operator running against a fresh emulated API (CAPI v1beta2 preferred)."""
    return make_sandbox()
