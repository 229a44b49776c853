"""backends.flowcontrol: where the controls of one IPAM endpoint decide together.

The parts alone are tested where they were used first: the breaker, the slots and the login
budget in test_transport.py, the claims' line in tests/unit/bridge/test_admission.py, the
exhaustion hold in tests/unit/bridge/test_context_and_errors.py.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Hashable, Iterator
from pathlib import Path

import pytest
import requests
import responses

import backends
from backends.errors import BackendUnavailableError, EndpointUnavailableError
from backends.flowcontrol import EndpointState, FlowControl, endpoint_key, endpoint_token
from backends.retry import RetryPolicy
from backends.transport import Transport, TransportConfig

URL = "http://ipam.test/api"
EP = "http://ipam.test:80"
OTHER = "http://other.test:80"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def opened(flow: FlowControl, endpoint: str = EP) -> None:
    """Open the endpoint's breaker (as `failure_threshold` requests without an answer do)."""
    for _ in range(flow.failure_threshold):
        flow.endpoint(endpoint).unreachable()
    assert flow.states()[endpoint] is EndpointState.OPEN


def test_an_open_breaker_admits_no_claim_and_takes_no_place() -> None:
    clock = FakeClock()
    woken: list[Hashable] = []
    flow = FlowControl(
        failure_threshold=2,
        cooldown_seconds=10,
        max_concurrent=1,
        clock=clock,
        wall_clock=lambda: 1_790_000_000.0,
        wake=woken.append,
    )
    assert flow.try_admit(EP, "a")
    assert not flow.try_admit(EP, "b")  # b waits in line
    opened(flow)
    with pytest.raises(
        EndpointUnavailableError, match=r"endpoint http://ipam\.test:80 unreachable"
    ):
        flow.try_admit(EP, "c")
    flow.finish(EP, "a", BackendUnavailableError("no answer"))
    assert woken == ["b"]  # a's place is kept for b
    with pytest.raises(EndpointUnavailableError, match="next try at 2026-09-21T"):
        flow.try_admit(EP, "b")  # woken, but the breaker is open: refused, nothing taken
    assert flow.in_flight(EP) == 0 and flow.waiting(EP) == []
    assert flow.limit(EP) == 1  # only admitted work adapts the limit
    # Another endpoint is not affected.
    assert flow.try_admit(OTHER, "d")
    # After the cool-down claims are admitted again: one of them carries the probe.
    clock.now += 10
    assert flow.try_admit(EP, "b")
    assert flow.states()[EP] is EndpointState.OPEN  # the probe is the first request
    flow.endpoint(EP).admit()
    assert flow.states()[EP] is EndpointState.HALF_OPEN


def test_an_open_breaker_refuses_an_operation_before_it_waits_for_a_slot() -> None:
    flow = FlowControl(failure_threshold=1, max_concurrent=1, slot_wait_seconds=5)
    transport = Transport(
        TransportConfig(endpoint=URL),
        retry=RetryPolicy(attempts=1, sleep=lambda _: None),
        endpoints=flow,
        label="test",
    )
    inside, leave = threading.Event(), threading.Event()

    def slow() -> None:
        inside.set()
        leave.wait(5)

    worker = threading.Thread(target=lambda: transport.call("slow", slow))
    worker.start()
    try:
        assert inside.wait(5)  # the only slot is taken
        opened(flow)
        called: list[str] = []
        with pytest.raises(EndpointUnavailableError, match="unreachable") as caught:
            transport.call("other", lambda: called.append("x"))
        assert "busy" not in caught.value.message and called == []
    finally:
        leave.set()
        worker.join()


def test_the_breaker_counts_requests_of_every_client_and_claims_see_it(
    rsps: responses.RequestsMock,
) -> None:
    flow = FlowControl(failure_threshold=2, max_concurrent=2)
    rsps.get(f"{URL}/x", body=requests.ConnectionError("refused"))
    for _ in range(2):
        transport = Transport(
            TransportConfig(endpoint=URL),
            retry=RetryPolicy(attempts=1, sleep=lambda _: None),
            endpoints=flow,
            label="test",
        )
        with pytest.raises(BackendUnavailableError, match="cannot reach"):
            transport.request("GET", f"{URL}/x", what="GET x")
    # Any URL of the endpoint names the same flow.
    with pytest.raises(EndpointUnavailableError):
        flow.try_admit("http://IPAM.test/other/path", "claim")


def test_exhaustion_is_per_endpoint_and_a_release_anywhere_ends_it() -> None:
    clock = FakeClock()
    flow = FlowControl(exhausted_seconds=5, clock=clock)
    pool = ("ns", "PHPIPAMIPPool", "p")
    flow.exhausted(URL, pool)
    assert flow.is_exhausted(EP, pool)  # any URL of the endpoint
    assert not flow.is_exhausted(OTHER, pool)  # the pool moved: asked at its new endpoint
    assert flow.sizes()["exhausted"] == 1
    flow.refilled(pool)  # a release, or the pool is gone: forgotten everywhere
    assert not flow.is_exhausted(EP, pool) and flow.sizes()["exhausted"] == 0
    # Exhaustion is not unavailability: it neither opens the breaker nor halves the limit.
    assert flow.try_admit(EP, "c")
    flow.finish(EP, "c", Exception("pool exhausted"))
    assert flow.limit(EP) == flow.max_concurrent
    assert flow.states()[EP] is EndpointState.CLOSED


def test_one_limit_for_slots_and_claims_and_sizes_name_every_part() -> None:
    flow = FlowControl(max_concurrent=3)
    assert flow.limit(EP) == 3  # the claims' limit starts at the slots' count
    assert flow.sizes() == {"endpoints": 0, "lines": 0, "keys": 0, "exhausted": 0}
    flow.endpoint(URL)  # a transport's endpoint: no line of claims yet
    assert flow.sizes()["endpoints"] == 1 and flow.sizes()["lines"] == 0
    for key in ("a", "b", "c"):
        assert flow.try_admit(EP, key)
    assert not flow.try_admit(EP, "d")
    assert flow.sizes() == {"endpoints": 1, "lines": 1, "keys": 1, "exhausted": 0}
    flow.settle("d", ())
    assert flow.sizes()["keys"] == 0


def test_endpoint_key_and_token() -> None:
    assert endpoint_key(endpoint_key(URL)) == endpoint_key(URL) == EP
    assert endpoint_key("https://[2001:db8::1]/wapi") == "https://[2001:db8::1]:443"
    assert endpoint_token(EP) == ("endpoint", EP)


def test_backends_import_nothing_of_the_operator_or_kubernetes() -> None:
    root = Path(backends.__file__).parent
    forbidden = ("bridge", "kopf", "kubernetes", "mock_kubernetes")
    for module in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{module.name} imports {name}"
