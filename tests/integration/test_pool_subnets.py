"""Pools of several subnets (issue 12, item 1): the first subnet fills, then the next one.

The real operator against the emulated Kubernetes API and the IPAM mocks over HTTP on
127.0.0.1, for both IPAMs. Each pool lists two /30 subnets (two host addresses each); the
second one has a gateway (which is never handed out) and overrides its prefix, so it has one
address to give. Three claims fill the pool: two in the first subnet, one in the second,
each IPAddress with its own subnet's prefix and gateway; a fourth waits as ``PoolExhausted``
(only when every subnet is full) and is served when an address of the first subnet is freed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE

from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []

FIRST, SECOND = "10.60.0.0/30", "10.60.1.0/30"
GATEWAY = "10.60.1.1"
#: The prefix the second entry writes on its IPAddresses (an override of the subnet's /30).
SECOND_PREFIX = 24


def phpipam_pool(phpipam: MockPhpipamServer, sandbox: Sandbox) -> str:
    phpipam.store.add_subnet(FIRST, section_id=3, subnet_id=31)
    phpipam.store.add_subnet(SECOND, section_id=3, subnet_id=32, gateway=GATEWAY)
    sandbox.phpipam_pool(
        NAMESPACE,
        "multi",
        endpoint=phpipam.url,
        credentials=CREDENTIALS,
        subnets=[{"subnetId": 31}, {"subnet": SECOND, "prefix": SECOND_PREFIX}],
    )
    return "PHPIPAMIPPool"


def infoblox_pool(infoblox: MockInfobloxServer, sandbox: Sandbox) -> str:
    infoblox.store.seed(
        {
            "networks": [
                {"network": FIRST, "network_view": "default"},
                {"network": SECOND, "network_view": "default", "gateway": GATEWAY},
            ]
        }
    )
    body = {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": "multi", "namespace": NAMESPACE},
        "spec": {
            "endpoint": infoblox.url,
            "credentialsRef": {"name": "multi-credentials"},
            "subnets": [{"subnet": FIRST}, {"subnet": SECOND, "prefix": SECOND_PREFIX}],
        },
    }
    sandbox.secret(NAMESPACE, "multi-credentials", CREDENTIALS)
    sandbox.create(body)
    return "InfobloxIPPool"


@pytest.fixture(params=["phpipam", "infoblox"])
def multi_pool(request: pytest.FixtureRequest, sandbox: Sandbox) -> Callable[[], str]:
    """Create the two-subnet pool of the parametrized IPAM; return a function giving its kind."""
    if request.param == "phpipam":
        kind = phpipam_pool(request.getfixturevalue("phpipam"), sandbox)
    else:
        kind = infoblox_pool(request.getfixturevalue("infoblox"), sandbox)
    return lambda: kind


def specs(sandbox: Sandbox) -> dict[str, dict[str, Any]]:
    return {a["metadata"]["name"]: dict(a["spec"]) for a in sandbox.addresses(NAMESPACE)}


def test_the_first_subnet_fills_then_the_second(
    sandbox: Sandbox, multi_pool: Callable[[], str]
) -> None:
    kind = multi_pool()
    pool = sandbox.wait_pool_ready(NAMESPACE, "multi", kind)
    status = pool["status"]
    assert [(s["cidr"], s["prefix"], s.get("gateway")) for s in status["subnets"]] == [
        (FIRST, 30, None),
        (SECOND, SECOND_PREFIX, GATEWAY),
    ]
    assert (status["subnet"], status["prefix"]) == (FIRST, 30)
    assert status["ipAddresses"] == {"total": 4, "used": 1, "free": 3}

    for name in ("c0", "c1", "c2"):
        sandbox.claim(NAMESPACE, name, "multi", kind=kind)
    sandbox.wait_claims_bound(NAMESPACE, 3)
    bound = specs(sandbox)
    first = sorted(s["address"] for s in bound.values() if s["address"].startswith("10.60.0."))
    second = [s for s in bound.values() if s["address"].startswith("10.60.1.")]
    assert first == ["10.60.0.1", "10.60.0.2"]
    assert [(s["address"], s["prefix"], s.get("gateway")) for s in second] == [
        ("10.60.1.2", SECOND_PREFIX, GATEWAY)
    ]
    assert all(
        s["prefix"] == 30 and "gateway" not in s for s in bound.values() if s["address"] in first
    )

    # Every subnet full: only now is the pool exhausted.
    sandbox.claim(NAMESPACE, "c3", "multi", kind=kind)
    sandbox.wait_claim_reason(NAMESPACE, "c3", "PoolExhausted")
    wait_for(
        lambda: (
            (sandbox.pool(NAMESPACE, "multi", kind) or {})["status"]["ipAddresses"]
            == {"total": 4, "used": 4, "free": 0}
        ),
        timeout=15,
        message="usage summed over both subnets",
    )
    pool = sandbox.pool(NAMESPACE, "multi", kind) or {}
    assert [s["ipAddresses"]["free"] for s in pool["status"]["subnets"]] == [0, 0]

    # An address of the first subnet is freed: the waiting claim gets it, with that prefix.
    freed = next(n for n, s in bound.items() if s["address"] == "10.60.0.1")
    sandbox.delete_claim(NAMESPACE, freed)
    wait_for(
        lambda: specs(sandbox).get("c3", {}).get("address") == "10.60.0.1",
        timeout=30,
        message="the waiting claim gets the freed address of the first subnet",
    )
    assert specs(sandbox)["c3"]["prefix"] == 30
