"""The Infoblox client against a real NIOS grid (skipped unless INFOBLOX_URL etc. are set).

Required environment: ``INFOBLOX_URL`` (grid master, e.g. ``https://gm.example.com``),
``INFOBLOX_USERNAME``, ``INFOBLOX_PASSWORD`` and ``INFOBLOX_SUBNET`` (CIDR of an existing
``network``/``ipv6network`` with at least two free addresses; the tests register and then
remove host records and fixed addresses named ``ipam-bridge-e2e-<random>.e2e`` in it).
Optional: ``INFOBLOX_WAPI_VERSION`` (default ``2.12``), ``INFOBLOX_NETWORK_VIEW`` (default
``default``), ``INFOBLOX_CA_BUNDLE`` (path of a PEM bundle) or ``INFOBLOX_INSECURE=1`` (no TLS
verification). The operator path (claims, IPAddresses) against a real cluster is covered by
the other e2e tests when ``KUBECONFIG`` is set as well; this file drives
`backends.infoblox.InfobloxBackend` directly.
"""

from __future__ import annotations

import ipaddress
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.retry import RetryPolicy

__all__: list[str] = []

#: The INFOBLOX_* environment as it was at collection (fixtures of other suites change env).
ENV = {key: value for key, value in os.environ.items() if key.startswith("INFOBLOX_")}
REQUIRED = ("INFOBLOX_URL", "INFOBLOX_USERNAME", "INFOBLOX_PASSWORD", "INFOBLOX_SUBNET")
MISSING = [name for name in REQUIRED if not ENV.get(name)]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs a real Infoblox grid; not set: {', '.join(MISSING)}",
    ),
]


def _verify() -> bool | str:
    if ENV.get("INFOBLOX_INSECURE", "").lower() in ("1", "true", "yes"):
        return False
    return ENV.get("INFOBLOX_CA_BUNDLE") or True


def _config(record_type: str = "host") -> InfobloxConfig:
    return InfobloxConfig(
        endpoint=ENV["INFOBLOX_URL"],
        subnet=ENV["INFOBLOX_SUBNET"],
        username=ENV["INFOBLOX_USERNAME"],
        password=ENV["INFOBLOX_PASSWORD"],
        wapi_version=ENV.get("INFOBLOX_WAPI_VERSION") or "2.12",
        network_view=ENV.get("INFOBLOX_NETWORK_VIEW") or "default",
        record_type=record_type,  # type: ignore[arg-type]
        verify=_verify(),
        timeout_seconds=30.0,
        retry=RetryPolicy(attempts=3, max_delay_seconds=2.0, total_seconds=60.0),
    )


@pytest.fixture
def hostnames() -> Iterator[list[str]]:
    """Unique hostnames for one test; whatever they registered is released afterwards."""
    names: list[str] = []
    yield names
    for record_type in ("host", "fixedaddress"):
        backend = InfobloxBackend(_config(record_type))
        try:
            for name in names:
                backend.release(name)
        finally:
            backend.close()


def _new_hostname(names: list[str]) -> str:
    name = f"ipam-bridge-e2e-{uuid.uuid4().hex[:10]}.e2e"
    names.append(name)
    return name


@pytest.fixture(params=["host", "fixedaddress"])
def backend(request: Any) -> Iterator[InfobloxBackend]:
    """A client of the grid in host-record or fixed-address mode."""
    client = InfobloxBackend(_config(str(request.param)))
    yield client
    client.close()


def test_describe_subnet() -> None:
    client = InfobloxBackend(_config())
    try:
        info = client.describe_subnets()[0]
    finally:
        client.close()
    network = ipaddress.ip_network(ENV["INFOBLOX_SUBNET"])
    assert info.cidr == str(network)
    assert info.prefix == network.prefixlen
    usable = network.num_addresses - (2 if network.version == 4 and network.prefixlen < 31 else 0)
    assert info.total == usable
    assert 0 <= info.used <= info.total
    assert info.free == info.total - info.used
    if info.gateway is not None:
        assert ipaddress.ip_address(info.gateway) in network


def test_allocate_twice_gives_the_same_address_and_release_is_idempotent(
    backend: InfobloxBackend, hostnames: list[str]
) -> None:
    network = ipaddress.ip_network(ENV["INFOBLOX_SUBNET"])
    name = _new_hostname(hostnames)
    assert backend.find(name) is None

    first = backend.allocate(name, "ipam-bridge e2e test")
    assert ipaddress.ip_address(first.address) in network
    assert ipaddress.ip_address(first.address) != network.network_address
    assert first.prefix == network.prefixlen
    assert first.hostname == name
    assert first.ref

    again = backend.allocate(name, "ipam-bridge e2e test")
    assert (again.address, again.ref) == (first.address, first.ref)
    found = backend.find(name)
    assert found is not None
    assert (found.address, found.ref) == (first.address, first.ref)

    other = backend.allocate(_new_hostname(hostnames), "ipam-bridge e2e test")
    assert other.address != first.address

    assert backend.release(name) is True
    assert backend.find(name) is None
    assert backend.release(name) is False
    assert backend.find(hostnames[1]) is not None
