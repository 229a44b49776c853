"""bridge.runtime.waits.Places: claims parked for a place at an IPAM server, woken one per place."""

from __future__ import annotations

from collections.abc import Hashable

from backends.flowcontrol import FlowControl
from bridge.objects.keys import EndpointToken, endpoint_token
from bridge.runtime.waits import Places
from bridge.runtime.workqueue import Result, WorkQueue

EP = "http://ipam.test:80"


def parked_queue(*keys: str) -> WorkQueue:
    """A work queue with ``keys`` parked under the endpoint's token, oldest first."""
    queue = WorkQueue(lambda key: Result.wait(endpoint_token(EP)), workers=1)
    for key in keys:
        queue._park(key, (endpoint_token(EP),))  # as a pass that ended in Result.wait
    return queue


def places_of(queue: WorkQueue, flow: FlowControl) -> Places:
    def room(token: Hashable) -> int:
        return flow.room(token.endpoint) if isinstance(token, EndpointToken) else 0

    places = Places(queue, room)
    flow.on_free = lambda endpoint: places.freed(endpoint_token(endpoint))
    return places


def test_a_freed_place_wakes_the_longest_parked_claim_only() -> None:
    flow = FlowControl(max_concurrent=1)
    queue = parked_queue("b", "c")
    places = places_of(queue, flow)
    assert flow.try_admit(EP)  # "a" works
    flow.endpoint(EP).release()  # and ends: one place
    assert queue.parked(endpoint_token(EP)) == frozenset({"c"})  # b woken, c still parked
    assert len(places) == 1
    places.freed(endpoint_token(EP))  # told again: the place is promised to b already
    assert queue.parked(endpoint_token(EP)) == frozenset({"c"})


def test_a_woken_claim_that_leaves_the_place_passes_it_on() -> None:
    flow = FlowControl(max_concurrent=1)
    queue = parked_queue("b", "c")
    places = places_of(queue, flow)
    places.freed(endpoint_token(EP))
    assert queue.parked(endpoint_token(EP)) == frozenset({"c"})
    places.passed("b")  # b's pass ended without taking the place (its claim was deleted)
    assert queue.parked(endpoint_token(EP)) == frozenset() and len(places) == 1
    assert flow.try_admit(EP)  # c takes it
    places.passed("c")
    assert len(places) == 0  # nothing kept once the passes ended


def test_a_place_taken_by_the_woken_claim_wakes_nobody_else() -> None:
    flow = FlowControl(max_concurrent=1)
    queue = parked_queue("b", "c")
    places = places_of(queue, flow)
    places.freed(endpoint_token(EP))
    assert flow.try_admit(EP)  # b takes its place
    places.passed("b")
    assert queue.parked(endpoint_token(EP)) == frozenset({"c"})  # still full: c waits
