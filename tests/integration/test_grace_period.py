"""``addressReuseGracePeriodSeconds``: released addresses stay quarantined (issue 12, item 4).

The real operator against the emulated Kubernetes API and the IPAM mocks over HTTP on
127.0.0.1, for both IPAMs, on a /30 (two host addresses) with a grace period of 3 s and the
purge every 0.5 s (``IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS``). A released claim and its
IPAddress go at once; the IPAM entry stays, marked, so the next claim gets the other address
and a third waits as ``PoolExhausted`` (a quarantined entry counts as used) until the
quarantine ends and the leader deletes the entry. With phpIPAM, the quarantine also outlives
an operator that stops before it ends: the operator that starts again deletes the entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from backends.base import QUARANTINE_PREFIX, quarantined_until
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []

GRACE_SECONDS = 3
SETTINGS = {"IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS": "0.5"}


def address_of(sandbox: Sandbox, name: str) -> str | None:
    found = sandbox.get_object(
        f"ipam.cluster.x-k8s.io/{sandbox.version}", "ipaddresses", name, NAMESPACE
    )
    return None if found is None else str(found["spec"]["address"])


def bound_address(sandbox: Sandbox, name: str) -> str:
    return str(wait_for(lambda: address_of(sandbox, name), message=f"claim {name} bound"))


def released(sandbox: Sandbox, name: str) -> None:
    sandbox.delete_claim(NAMESPACE, name)
    wait_for(
        lambda: sandbox.get_claim(NAMESPACE, name) is None and address_of(sandbox, name) is None,
        timeout=15,
        message=f"claim {name} and its IPAddress gone at once",
    )


@pytest.mark.parametrize("ipam", ["phpipam", "infoblox"])
def test_a_released_address_is_not_handed_out_before_the_grace_period_ends(
    request: pytest.FixtureRequest, make_sandbox: Callable[..., Sandbox], ipam: str
) -> None:
    sandbox = make_sandbox(settings=SETTINGS)
    if ipam == "phpipam":
        server: MockPhpipamServer | MockInfobloxServer = request.getfixturevalue("phpipam")
        kind = "PHPIPAMIPPool"
        sandbox.phpipam_pool(
            NAMESPACE,
            "pool",
            endpoint=server.url,
            subnet_id=9,
            credentials=CREDENTIALS,
            addressReuseGracePeriodSeconds=GRACE_SECONDS,
        )
    else:
        server = request.getfixturevalue("infoblox")
        kind = "InfobloxIPPool"
        sandbox.infoblox_pool(
            NAMESPACE,
            "pool",
            endpoint=server.url,
            subnet="10.20.1.0/30",
            credentials=CREDENTIALS,
            addressReuseGracePeriodSeconds=GRACE_SECONDS,
        )
    sandbox.wait_pool_ready(NAMESPACE, "pool", kind)

    sandbox.claim(NAMESPACE, "first", "pool", kind=kind)
    first = bound_address(sandbox, "first")
    released(sandbox, "first")
    if isinstance(server, MockPhpipamServer):
        (row,) = server.store.search_hostname(f"{QUARANTINE_PREFIX}first.{NAMESPACE}")
        assert str(row.ip) == first
        assert quarantined_until(row.values.get("description")) is not None

    sandbox.claim(NAMESPACE, "second", "pool", kind=kind)
    second = bound_address(sandbox, "second")
    assert second != first
    sandbox.claim(NAMESPACE, "third", "pool", kind=kind)
    # The quarantined entry counts as used: the pool is exhausted, then it is purged and the
    # waiting claim gets the address once its grace period ended.
    sandbox.wait_claim_reason(NAMESPACE, "third", "PoolExhausted", timeout=GRACE_SECONDS + 1)
    assert bound_address(sandbox, "third") == first
    if isinstance(server, MockPhpipamServer):
        assert not server.store.search_hostname(f"{QUARANTINE_PREFIX}first.{NAMESPACE}")


def test_a_quarantine_ends_across_an_operator_restart(
    phpipam: MockPhpipamServer, make_sandbox: Callable[..., Sandbox]
) -> None:
    sandbox = make_sandbox(settings=SETTINGS)
    sandbox.phpipam_pool(
        NAMESPACE,
        "pool",
        endpoint=phpipam.url,
        subnet_id=9,
        credentials=CREDENTIALS,
        addressReuseGracePeriodSeconds=GRACE_SECONDS,
    )
    sandbox.claim(NAMESPACE, "gone", "pool")
    bound_address(sandbox, "gone")
    released(sandbox, "gone")
    sandbox.stop_operator()  # before the quarantine ends: only a new operator can purge it
    (row,) = phpipam.store.search_hostname(f"{QUARANTINE_PREFIX}gone.{NAMESPACE}")
    until = quarantined_until(row.values.get("description"))
    assert until is not None
    wait_for(lambda: time.time() > until, timeout=GRACE_SECONDS + 2, message="quarantine ended")
    assert phpipam.store.search_hostname(f"{QUARANTINE_PREFIX}gone.{NAMESPACE}")  # nobody purged

    sandbox.start_operator()
    wait_for(
        lambda: not phpipam.store.search_hostname(f"{QUARANTINE_PREFIX}gone.{NAMESPACE}"),
        timeout=10,
        message="the restarted operator deletes the entry whose quarantine ended",
    )
