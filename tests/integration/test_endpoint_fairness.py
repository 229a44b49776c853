"""Claims of one endpoint are never held behind a slow one (issue 15, item 4).

Two pools on two mock phpIPAMs, 4 workers (2 claims in flight per endpoint). Endpoint A is
slowed down and gets 30 claims; a few claims of pool B on endpoint B, created after them, are
all bound while A still has unbound claims: A's waiting claims are parked
(`backends.flowcontrol`), not holding workers, and none of them failed with "endpoint busy".
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
from fault_audit import is_bound, ready_condition
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

from mock_kubernetes.objects import wait_for
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

#: The /24 both mocks serve.
SUBNET_ID = 7


@pytest.fixture
def slow() -> Iterator[MockPhpipamServer]:
    """A second mock phpIPAM (endpoint A); the test slows it down."""
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield server
        server.faults.reset()


def test_claims_of_a_fast_endpoint_are_not_stuck_behind_a_slow_one(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    slow: MockPhpipamServer,
) -> None:
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_WORKERS": "4"})
    sandbox.phpipam_pool(
        NAMESPACE, "a", endpoint=slow.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE, "b", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "a", timeout=30)
    sandbox.wait_pool_ready(NAMESPACE, "b", timeout=30)

    # Each request to A now takes 0.6 s: an allocation (search, first-free) over a second;
    # 30 claims at 2 in flight take about 20 s.
    slow.faults.update(latency_seconds=0.6)
    a_claims = [f"a{i}" for i in range(30)]
    for name in a_claims:
        sandbox.claim(NAMESPACE, name, "a")
    wait_for(lambda: slow.faults.stats["latency"] >= 2, timeout=10, message="A is busy")

    b_claims = [f"b{i}" for i in range(4)]
    for name in b_claims:
        sandbox.claim(NAMESPACE, name, "b")

    def of(names: list[str]) -> list[dict[str, object]]:
        wanted = set(names)
        return [c for c in sandbox.claims(NAMESPACE) if c["metadata"]["name"] in wanted]

    wait_for(
        lambda: len(of(b_claims)) == len(b_claims) and all(is_bound(c) for c in of(b_claims)),
        timeout=8,
        interval=0.1,
        message="B's claims bound",
    )
    a_now = of(a_claims)
    unbound = [c["metadata"]["name"] for c in a_now if not is_bound(c)]
    assert unbound, "every claim of A was bound first: B was not served beside A"
    # A's waiting claims were parked, not failed: no "endpoint busy", no status written.
    failed = {
        c["metadata"]["name"]: ready_condition(c).get("message")
        for c in a_now
        if ready_condition(c).get("status") == "False"
    }
    assert failed == {}
    print(f"\nB bound with {len(unbound)} of {len(a_claims)} claims of A still unbound")
