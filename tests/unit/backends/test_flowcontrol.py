"""backends.flowcontrol: where the controls of one IPAM endpoint decide together.

The parts alone are tested where they were used first: the breaker, the limit's places and
the login budget in test_transport.py; the parking of claims in tests/unit/bridge/test_admission.py.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import responses

import backends
from backends.errors import BackendUnavailableError, EndpointUnavailableError
from backends.flowcontrol import EndpointState, FlowControl, endpoint_key
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
    freed: list[str] = []
    flow = FlowControl(
        failure_threshold=2,
        cooldown_seconds=10,
        max_concurrent=1,
        clock=clock,
        wall_clock=lambda: 1_790_000_000.0,
        on_free=freed.append,
    )
    assert flow.try_admit(EP)
    opened(flow)
    with pytest.raises(
        EndpointUnavailableError, match=r"endpoint http://ipam\.test:80 unreachable"
    ):
        flow.try_admit(EP)
    flow.endpoint(EP).release()
    assert freed == [EP]  # the runtime is told a place freed
    with pytest.raises(EndpointUnavailableError, match="next try at 2026-09-21T"):
        flow.try_admit(EP)  # the breaker is open: refused, nothing taken
    assert flow.endpoint(EP).in_flight == 0
    assert flow.endpoint(EP).limit == 1
    # After the cool-down claims are admitted again: one of them carries the probe.
    clock.now += 10
    assert flow.try_admit(EP)
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
        flow.try_admit("http://IPAM.test/other/path")


def test_one_limit_for_claims_and_operations_fed_only_by_the_ipams_answers() -> None:
    limits: list[tuple[str, int]] = []
    flow = FlowControl(
        max_concurrent=2, slot_wait_seconds=0, on_limit=lambda e, n: limits.append((e, n))
    )
    assert flow.endpoint(EP).limit == 2 and limits == [(EP, 2)]  # the gauge starts at the max
    endpoint = flow.endpoint(EP)
    assert flow.try_admit(EP)  # a claim's place
    with endpoint.operation():  # its operations run in it: no second place
        assert endpoint.in_flight == 1
    other = threading.Thread(target=lambda: flow.try_admit(EP))
    other.start()
    other.join()
    assert endpoint.in_flight == 2 and flow.room(EP) == 0
    refused: list[BaseException] = []

    def third() -> None:  # an operation of a third thread finds no place
        try:
            with endpoint.operation():
                pass
        except EndpointUnavailableError as exc:
            refused.append(exc)

    worker = threading.Thread(target=third)
    worker.start()
    worker.join()
    assert len(refused) == 1 and "busy" in str(refused[0])
    assert flow.endpoint(EP).limit == 2  # refusals of the flow control never change the limit
    endpoint.congested()  # a timeout, 429 or 5xx of the IPAM: halved
    endpoint.congested()  # of work placed before that decrease: not again
    assert flow.endpoint(EP).limit == 1 and flow.room(EP) == -1
    endpoint.answered()  # one answer per place raises it by one
    assert flow.endpoint(EP).limit == 2 and limits[-2:] == [(EP, 1), (EP, 2)]
    assert flow.sizes() == {"endpoints": 1, "in_flight": 2}


def test_endpoint_key() -> None:
    assert endpoint_key(endpoint_key(URL)) == endpoint_key(URL) == EP
    assert endpoint_key("https://[2001:db8::1]/wapi") == "https://[2001:db8::1]:443"


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


@pytest.mark.parametrize(
    ("answer", "lowered"),
    [
        ({"status": 429}, True),
        ({"status": 500}, True),
        ({"status": 503}, True),
        ({"body": requests.ConnectTimeout("slow")}, True),
        ({"body": requests.ConnectionError("refused")}, True),
        ({"status": 404}, False),
        ({"status": 409}, False),
        ({"status": 200}, False),
    ],
)
def test_the_transport_feeds_the_limit_the_ipams_failures_only(
    rsps: responses.RequestsMock, answer: dict[str, object], lowered: bool
) -> None:
    flow = FlowControl(max_concurrent=4, failure_threshold=100)
    rsps.get(f"{URL}/x", **answer)  # type: ignore[arg-type]
    transport = Transport(
        TransportConfig(endpoint=URL),
        retry=RetryPolicy(attempts=1, sleep=lambda _: None),
        endpoints=flow,
        label="test",
    )
    with contextlib.suppress(BackendUnavailableError):
        transport.call("x", lambda: transport.request("GET", f"{URL}/x", what="GET x"))
    assert flow.endpoint(EP).limit == (2 if lowered else 4)
    assert flow.endpoint(EP).in_flight == 0  # the operation's place is given back
