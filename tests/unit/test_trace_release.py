"""The release trace (``python -m benchmarks --only trace-release``): hooks and parser agree.

The operator's DEBUG lines (work queue, expectations, API and IPAM requests) are what
`benchmarks.trace_release.parse_trace` reads; these tests feed it the lines the real work
queue and expectations log, and a whole release's lines, and check the steps and spans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from benchmarks.operator_process import TRACE_FORMAT
from benchmarks.trace_release import TraceResult, _moments, format_result, parse_trace
from bridge.objects.keys import claim_key, endpoint_token
from bridge.runtime.expectations import Expectations
from bridge.runtime.workqueue import Result, WorkQueue

TRACED = ("bridge.runtime.workqueue", "bridge.runtime.expectations")


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until ``condition`` holds (polling every 5 ms); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def _lines(records: list[logging.LogRecord]) -> list[str]:
    formatter = logging.Formatter(TRACE_FORMAT)
    return [formatter.format(r) for r in records if r.name in TRACED]


@pytest.mark.asyncio
async def test_the_queue_and_expectations_lines_give_a_parked_then_woken_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="bridge.runtime")
    key, token = claim_key("ns", "c1"), endpoint_token("http://ipam:80")
    answers = [Result.wait(token), Result.done()]
    queue = WorkQueue(lambda k: answers.pop(0), workers=1)
    expectations = Expectations()
    deleted = time.time()
    expectations.observed(("ipaddressclaims", "ns", "c1"), "5")  # the deletion's event
    queue.add(key)
    task = asyncio.create_task(queue.run())
    try:
        await _until(lambda: bool(queue.parked(token)))
        queue.add(key)  # a place freed (`Places.freed` queues the key it promises it to)
        await _until(lambda: not answers and len(queue) == 0)  # its end is logged by then
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    expectations.wrote(("ipaddressclaims", "ns", "c1"), "")
    expectations.observed(("ipaddressclaims", "ns", "c1"), "", deleted=True)

    steps = parse_trace(_lines(caplog.records), {"c1": deleted})["c1"]
    assert [s.label for s in steps] == [
        "deleted",
        "event: claim changed",
        "queued",
        "handed to a worker (event loop)",
        "pass starts (worker)",
        "pass decided: parked for an IPAM place",
        "pass over (event loop)",
        "queued: a place freed",
        "handed to a worker (event loop)",
        "pass starts (worker)",
        "pass decided: done",
        "pass over (event loop)",
        "event: claim DELETED (ours)",
    ]
    moments = _moments(steps)
    assert moments["woken"] is not None and moments["last starts"] is not None
    assert moments["woken"] < moments["last starts"]


def _release_lines(t0: float) -> list[str]:
    """A release's trace lines, as the operator logs them (times from ``t0``, in ms)."""
    key = "ClaimKey(namespace='ns', name='c1')"
    loop, worker = "MainThread", "ipam-bridge-worker_0"
    url = "http://127.0.0.1:1/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/ns"
    lines = [
        (
            1,
            loop,
            "bridge.runtime.expectations",
            "observed ('ipaddressclaims', 'ns', 'c1'): version 7",
        ),
        (1.1, loop, "bridge.runtime.workqueue", f"{key} queued, due in 0.000 s"),
        (2, loop, "bridge.runtime.workqueue", f"{key} handed to a worker"),
        (3, worker, "bridge.runtime.workqueue", f"pass of {key} starts"),
        (
            4,
            worker,
            "bridge.runtime.workqueue",
            f"pass of {key} decided Result(after=None, wake_on=(EndpointToken(endpoint='x'),))",
        ),
        (5, loop, "bridge.runtime.workqueue", f"pass of {key} over"),
        (500, worker, "bridge.runtime.workqueue", f"{key} queued, due in 0.000 s"),
        (502, loop, "bridge.runtime.workqueue", f"{key} handed to a worker"),
        (503, worker, "bridge.runtime.workqueue", f"pass of {key} starts"),
        # the IPAM client's lines: answered at the time logged, sent that many seconds before
        (
            544,
            worker,
            "backends.transport",
            "phpIPAM GET addresses/search_hostname/c1.ns/ -> 200 in 0.040s",
        ),
        (585, worker, "backends.transport", "phpIPAM DELETE addresses/7/ -> 200 in 0.040s"),
        (600, worker, "bridge.runtime.rest", f"PATCH {url}/ipaddresses/c1 -> 200 in 0.010s"),
        (611, worker, "bridge.runtime.rest", f"DELETE {url}/ipaddresses/c1 -> 200 in 0.010s"),
        (622, worker, "bridge.runtime.rest", f"PATCH {url}/ipaddressclaims/c1 -> 200 in 0.010s"),
        (623, worker, "bridge.reconcilers.claims", "release of claim ns/c1: released: released"),
        (
            624,
            worker,
            "bridge.runtime.workqueue",
            f"pass of {key} decided Result(after=None, wake_on=())",
        ),
        (625, loop, "bridge.runtime.workqueue", f"pass of {key} over"),
        (
            626,
            loop,
            "bridge.runtime.expectations",
            "observed ('ipaddressclaims', 'ns', 'c1'): version gone (ours)",
        ),
        # another claim's request in another thread belongs to that claim, not to c1
        (
            590,
            "ipam-bridge-worker_1",
            "bridge.runtime.rest",
            f"PATCH {url}/ipaddresses/c2 -> 200 in 0.010s",
        ),
    ]
    return [f"{t0 + ms / 1000:.6f}\t{thread}\t{name}\t{text}" for ms, thread, name, text in lines]


def test_a_release_is_cut_into_its_spans() -> None:
    t0 = 1_700_000_000.0
    timelines = parse_trace(sorted(_release_lines(t0)), {"c1": t0})
    steps = timelines["c1"]
    labels = [s.label for s in steps]
    assert labels.count("API PATCH ipaddresses sent") == 1  # c2's request is not c1's
    assert labels.index("IPAM search sent") < labels.index("API PATCH ipaddressclaims answered")
    moments = _moments(steps)

    def span(a: str, b: str) -> float:
        first, second = moments[a], moments[b]
        assert first is not None and second is not None
        return round((second - first) * 1000, 3)

    assert span("over", "woken") == 495  # parked for a place
    assert span("IPAM search sent", "IPAM search answered") == 40
    assert span("API PATCH ipaddressclaims sent", "API PATCH ipaddressclaims answered") == 10
    assert span("deleted", "claim DELETED") == 626
    report = format_result(TraceResult(1, 40, (3, 10), 1.0, timelines, 20))
    assert "parked: pass over -> woken for a place" in report
    assert "passes per release: 2 passes: 1" in report
