"""`PHPIPAMBackend` and the operator against phpIPAM: ``PHPIPAM_URL``'s, else mock_phpipam.

Without ``PHPIPAM_URL`` the same tests run against mock_phpipam on 127.0.0.1 (its small
subnet is a /30). Variables: ``PHPIPAM_URL`` (API base URL),
``PHPIPAM_APP_ID``, ``PHPIPAM_USERNAME`` + ``PHPIPAM_PASSWORD`` or ``PHPIPAM_TOKEN`` (app code),
``PHPIPAM_SUBNET_ID`` (a subnet with a few free addresses; the tests register entries named
``e2e-<random>.ipam-bridge.test`` and delete them again), optional ``PHPIPAM_SMALL_SUBNET_ID``
(a subnet with at most 16 free addresses, filled up and emptied again), ``PHPIPAM_CA_BUNDLE``
or ``PHPIPAM_INSECURE=1``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import IpamTarget, allocation_scenario, unique_name

from backends.base import EntryOwner
from backends.errors import AuthenticationFailedError, SubnetExhaustedError, SubnetNotFoundError
from backends.phpipam import PHPIPAMBackend
from mock_kubernetes.sandbox import Sandbox

#: The owner written on the e2e entries (safe to delete).
OWNER = EntryOwner("ipam-bridge-e2e", "e2e/test")

#: At most this many addresses are taken from PHPIPAM_SMALL_SUBNET_ID.
SMALL_SUBNET_MAX_FREE = 16


@pytest.fixture
def hostname(phpipam: IpamTarget) -> Iterator[Callable[[int | None], str]]:
    """``hostname(subnet_id=None)`` makes a fresh hostname; all are released after the test."""
    made: list[tuple[int | None, str]] = []

    def make(subnet_id: int | None = None) -> str:
        name = f"e2e-{secrets.token_hex(4)}.ipam-bridge.test"
        made.append((subnet_id, name))
        return name

    yield make
    for subnet_id, name in made:
        with phpipam.backend(subnet_id) as ipam:
            ipam.release(name, OWNER)


def test_describe_subnet_reports_consistent_facts(phpipam: IpamTarget) -> None:
    with phpipam.backend() as ipam:
        info = ipam.describe_subnets()[0]
    network = ipaddress.ip_network(info.cidr)  # strict: host bits must be zero
    assert info.prefix == network.prefixlen
    assert info.gateway is None or ipaddress.ip_address(info.gateway) in network
    assert info.total > 0 and info.used >= 0
    assert info.free == max(0, info.total - info.used)


def test_allocate_is_idempotent_and_release_is_idempotent(
    phpipam: IpamTarget, hostname: Callable[..., str]
) -> None:
    host = hostname()
    with phpipam.backend() as ipam:
        info = ipam.describe_subnets()[0]
        if info.free == 0:
            pytest.skip(f"subnet {phpipam.subnet_id} has no free address")
        assert ipam.find(host) is None
        first = ipam.allocate(host, OWNER)
        again = ipam.allocate(host, OWNER)
        found = ipam.find(host)
    assert (again.address, again.ref) == (first.address, first.ref)
    assert found is not None and (found.address, found.ref) == (first.address, first.ref)
    assert ipaddress.ip_address(first.address) in ipaddress.ip_network(info.cidr)
    assert first.address != info.gateway
    assert (first.prefix, first.gateway) == (info.prefix, info.gateway)
    assert first.hostname.lower() == host

    with phpipam.backend() as other:  # a second client: its own login, same entry
        seen = other.find(host)
        assert seen is not None and seen.address == first.address
        assert other.release(host, OWNER) is True
        assert other.find(host) is None
        assert other.release(host, OWNER) is False


def test_concurrent_allocations_get_distinct_addresses(
    phpipam: IpamTarget, hostname: Callable[..., str]
) -> None:
    count = 6
    hosts = [hostname() for _ in range(count)]
    clients = [phpipam.backend(), phpipam.backend()]
    try:
        if clients[0].describe_subnets()[0].free < count:
            pytest.skip(f"subnet {phpipam.subnet_id} has fewer than {count} free addresses")
        with ThreadPoolExecutor(max_workers=3) as pool:
            allocations = list(
                pool.map(lambda i: clients[i % 2].allocate(hosts[i], OWNER), range(count))
            )
        addresses = [a.address for a in allocations]
        assert len(set(addresses)) == count, f"an address was handed out twice: {addresses}"
        for host, allocation in zip(hosts, allocations, strict=True):
            found = clients[1].find(host)
            assert found is not None and found.address == allocation.address
        assert all(clients[0].release(host, OWNER) for host in hosts)
    finally:
        for client in clients:
            client.close()


def test_unknown_subnet_is_subnet_not_found(phpipam: IpamTarget) -> None:
    with phpipam.backend(subnet_id=2**31 - 7) as ipam, pytest.raises(SubnetNotFoundError):
        ipam.describe_subnets()[0]


def test_wrong_credentials_are_refused_without_echoing_them(phpipam: IpamTarget) -> None:
    wrong = f"wrong-{secrets.token_hex(8)}"
    config = phpipam.config
    if config.app_code:
        config = dataclasses.replace(config, app_code=wrong)
    else:  # one refused login (phpIPAM blocks an address after more than 10 in 5 minutes)
        config = dataclasses.replace(config, password=wrong)
    with PHPIPAMBackend(config) as ipam, pytest.raises(AuthenticationFailedError) as caught:
        ipam.describe_subnets()[0]
    assert wrong not in str(caught.value)


def test_small_subnet_is_exhausted_then_freed(
    phpipam: IpamTarget, hostname: Callable[..., str]
) -> None:
    subnet_id = phpipam.small_subnet_id
    if subnet_id is None:
        pytest.skip("PHPIPAM_SMALL_SUBNET_ID is not set: no small subnet to exhaust")
    with phpipam.backend(subnet_id) as ipam:
        free = ipam.describe_subnets()[0].free
        if free > SMALL_SUBNET_MAX_FREE:
            pytest.skip(
                f"subnet {subnet_id} has {free} free addresses "
                f"(at most {SMALL_SUBNET_MAX_FREE} are filled up)"
            )
        taken = [ipam.allocate(hostname(subnet_id), OWNER) for _ in range(free)]
        assert len({a.address for a in taken}) == free
        extra = hostname(subnet_id)
        with pytest.raises(SubnetExhaustedError):
            ipam.allocate(extra, OWNER)
        assert ipam.find(extra) is None
        assert ipam.describe_subnets()[0].free == 0
        assert ipam.release(taken[0].hostname, OWNER) is True
        assert ipam.allocate(extra, OWNER).address == taken[0].address


def test_operator_allocates_and_releases_in_phpipam(phpipam: IpamTarget) -> None:
    """The operator (the integration tests' sandbox) against phpIPAM: the allocation flow."""
    settings = {
        "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "15",
        "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "30",
    }
    with Sandbox(settings=settings) as sandbox:
        namespace = unique_name("e2e")
        sandbox.namespace(namespace)
        allocation_scenario(sandbox, phpipam, namespace, claims=3, timeout=60)
