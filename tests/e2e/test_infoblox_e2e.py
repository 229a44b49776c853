"""The Infoblox client against a NIOS grid: ``INFOBLOX_URL``'s, else mock_infoblox.

Without ``INFOBLOX_URL`` the same tests run against mock_infoblox on 127.0.0.1 (network
``10.20.0.0/24``). For a real grid: ``INFOBLOX_URL`` (grid master, e.g.
``https://gm.example.com``), ``INFOBLOX_USERNAME``, ``INFOBLOX_PASSWORD`` and
``INFOBLOX_SUBNET`` (CIDR of an existing ``network``/``ipv6network`` with at least two free
addresses; the tests register and then remove host records and fixed addresses named
``ipam-bridge-e2e-<random>.e2e`` in it); the tests skip when ``INFOBLOX_URL`` is set without
the others. Optional: ``INFOBLOX_WAPI_VERSION`` (default ``2.12``), ``INFOBLOX_NETWORK_VIEW``
(default ``default``), ``INFOBLOX_CA_BUNDLE`` (path of a PEM bundle) or
``INFOBLOX_INSECURE=1`` (no TLS verification). The operator path (claims, IPAddresses) is
covered by the cluster tests; this file drives `backends.infoblox.InfobloxBackend` directly.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from backends.base import EntryOwner
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy
from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore

__all__: list[str] = []

#: The owner written on the e2e entries (safe to delete).
OWNER = EntryOwner("ipam-bridge-e2e", "e2e/test")

#: The INFOBLOX_* environment as it was at collection (fixtures of other suites change env).
ENV = {key: value for key, value in os.environ.items() if key.startswith("INFOBLOX_")}
REQUIRED = ("INFOBLOX_URL", "INFOBLOX_USERNAME", "INFOBLOX_PASSWORD", "INFOBLOX_SUBNET")
MISSING = [name for name in REQUIRED if not ENV.get(name)]

#: mock_infoblox: one IPv4 network with its gateway registered.
MOCK_USER = ("capi-operator", "Pa55-w0rd-e2e-never-logged")
MOCK_SEED: dict[str, Any] = {
    "users": {MOCK_USER[0]: MOCK_USER[1]},
    "networks": [{"network": "10.20.0.0/24", "network_view": "default", "gateway": "10.20.0.1"}],
    "used": [{"ip": "10.20.0.1", "network_view": "default", "names": ["gateway"], "types": ["A"]}],
}


@dataclass(frozen=True)
class Grid:
    """Where the tests find a grid: its URL, credentials, network and TLS verification."""

    url: str
    username: str
    password: str
    subnet: str
    wapi_version: str = "2.12"
    network_view: str = "default"
    verify: bool | str = True

    def config(self, record_type: str = "host") -> InfobloxConfig:
        """Return a client configuration of this grid in ``record_type`` mode."""
        return InfobloxConfig(
            endpoint=self.url,
            subnet=self.subnet,
            username=self.username,
            password=self.password,
            wapi_version=self.wapi_version,
            network_view=self.network_view,
            record_type=record_type,  # type: ignore[arg-type]
            verify=self.verify,
            timeout_seconds=30.0,
            retry=RetryPolicy(attempts=3, max_delay_seconds=2.0, total_seconds=60.0),
        )


def _verify() -> bool | str:
    if ENV.get("INFOBLOX_INSECURE", "").lower() in ("1", "true", "yes"):
        return False
    return ENV.get("INFOBLOX_CA_BUNDLE") or True


@pytest.fixture
def grid() -> Iterator[Grid]:
    """The grid of ``INFOBLOX_*`` when ``INFOBLOX_URL`` is set, else a fresh mock_infoblox."""
    if not ENV.get("INFOBLOX_URL"):
        store = InfobloxStore.from_seed(copy.deepcopy(MOCK_SEED))
        with MockInfobloxServer(store) as server:
            yield Grid(server.url, *MOCK_USER, subnet="10.20.0.0/24")
        return
    if MISSING:
        pytest.skip(f"INFOBLOX_URL is set but not {', '.join(MISSING)}")
    yield Grid(
        ENV["INFOBLOX_URL"],
        ENV["INFOBLOX_USERNAME"],
        ENV["INFOBLOX_PASSWORD"],
        ENV["INFOBLOX_SUBNET"],
        wapi_version=ENV.get("INFOBLOX_WAPI_VERSION") or "2.12",
        network_view=ENV.get("INFOBLOX_NETWORK_VIEW") or "default",
        verify=_verify(),
    )


@pytest.fixture
def hostnames(grid: Grid) -> Iterator[list[str]]:
    """Unique hostnames for one test; whatever they registered is released afterwards."""
    names: list[str] = []
    yield names
    for record_type in ("host", "fixedaddress"):
        backend = InfobloxBackend(grid.config(record_type))
        try:
            for name in names:
                backend.release(name, OWNER)
        finally:
            backend.close()


def _new_hostname(names: list[str]) -> str:
    name = f"ipam-bridge-e2e-{uuid.uuid4().hex[:10]}.e2e"
    names.append(name)
    return name


@pytest.fixture(params=["host", "fixedaddress"])
def backend(request: Any, grid: Grid) -> Iterator[InfobloxBackend]:
    """A client of the grid in host-record or fixed-address mode."""
    client = InfobloxBackend(grid.config(str(request.param)))
    yield client
    client.close()


def test_describe_subnet(grid: Grid) -> None:
    client = InfobloxBackend(grid.config())
    try:
        info = client.describe_subnets()[0]
    finally:
        client.close()
    network = ipaddress.ip_network(grid.subnet)
    assert info.cidr == str(network)
    assert info.prefix == network.prefixlen
    usable = network.num_addresses - (2 if network.version == 4 and network.prefixlen < 31 else 0)
    assert info.total == usable
    assert 0 <= info.used <= info.total
    assert info.free == info.total - info.used
    if info.gateway is not None:
        assert ipaddress.ip_address(info.gateway) in network


def test_allocate_twice_gives_the_same_address_and_release_is_idempotent(
    backend: InfobloxBackend, grid: Grid, hostnames: list[str]
) -> None:
    network = ipaddress.ip_network(grid.subnet)
    name = _new_hostname(hostnames)
    assert backend.find(name) is None

    first = backend.allocate(name, OWNER)
    assert ipaddress.ip_address(first.address) in network
    assert ipaddress.ip_address(first.address) != network.network_address
    assert first.prefix == network.prefixlen
    assert first.hostname == name
    assert first.ref

    again = backend.allocate(name, OWNER)
    assert (again.address, again.ref) == (first.address, first.ref)
    found = backend.find(name)
    assert found is not None
    assert (found.address, found.ref) == (first.address, first.ref)

    other = backend.allocate(_new_hostname(hostnames), OWNER)
    assert other.address != first.address

    assert backend.release(name, OWNER) is True
    assert backend.find(name) is None
    assert backend.release(name, OWNER) is False
    assert backend.find(hostnames[1]) is not None
