"""bridge.runtime.waits.Places: claims parked for a place at an IPAM server, woken one per place.

Also how `claims` uses it: a claim over its endpoint's limit parks on the endpoint's token
without a write or an IPAM call, and the end of an admitted claim wakes the next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, cast

import pytest
from fakes import FakeIPAM, FakeKube, FakeQueue, claim, install_backend, phpipam_pool
from fakes import pool_condition as pool_ready

from backends import errors as be
from backends.flowcontrol import FlowControl
from bridge.objects.client import ObjectClient
from bridge.objects.keys import EndpointToken, endpoint_token
from bridge.operator import Operator
from bridge.reconcilers.claims import reconcile_claim
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.waits import Places
from bridge.runtime.workqueue import Result, WorkQueue
from bridge.settings import Settings

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


def test_nobody_jumps_ahead_of_a_woken_claim() -> None:
    flow = FlowControl(max_concurrent=1)
    queue = parked_queue("b")
    places = places_of(queue, flow)
    token = endpoint_token(EP)
    places.freed(token)  # one place: promised to b
    assert not places.may_take(token, "new")  # a claim that was not parked waits
    assert places.may_take(token, "b")
    assert flow.try_admit(EP)
    places.took(token, "b")
    assert len(places) == 0 and not places.may_take(token, "new")  # full now


# -- in claims ------------------------------------------------------------------------


class Ctx:
    """A context whose endpoint allows ``limit`` claims in flight, over the fakes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int = 1) -> None:
        self.kube = FakeKube()
        self.ipam = FakeIPAM(cidr="10.0.0.0/28")
        self.built = install_backend(monkeypatch, self.ipam)
        self.queue = FakeQueue()
        self.ctx = Operator(
            settings=Settings(),
            kube=cast(ObjectClient, self.kube),
            versions=ServedVersions("v1beta2"),
            flow=FlowControl(max_concurrent=limit),
            queue=self.queue,
        )
        self.kube.add_secret("ns", "creds", {"username": "u", "password": "p"})
        self.kube.add_pool(phpipam_pool(status=pool_ready()))
        self.endpoint = "https://ipam.example.com:443"  # the pool's, as the registry keys it


class Holder:
    """A worker thread that holds a place at ``endpoint`` until `leave`."""

    def __init__(self, flow: FlowControl, endpoint: str) -> None:
        self._in, self._out = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(flow, endpoint))
        self._thread.start()
        assert self._in.wait(10)

    def _run(self, flow: FlowControl, endpoint: str) -> None:
        assert flow.try_admit(endpoint)
        with flow.held(endpoint):
            self._in.set()
            self._out.wait(10)

    def leave(self) -> None:
        """Give the place back (as the end of the claim's IPAM work does) and wait for it."""
        self._out.set()
        self._thread.join()


def in_other_thread(fn: Callable[[], Any]) -> None:
    """Run ``fn`` in a thread of its own (a place is per thread) and wait for it."""
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


def test_a_claim_over_the_limit_parks_on_its_endpoint_and_a_release_wakes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch)
    ctx, endpoint = world.ctx, world.endpoint
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
    # c1 is in its IPAM call (admitted, in another worker) when c2 comes.
    c1 = Holder(ctx.flow, endpoint)
    world.kube.writes.clear()
    decision = reconcile_claim(ctx.claims, "ns", "c2")
    assert decision == Result.wait(endpoint_token(endpoint))  # parked, no timer
    assert world.ipam.calls == []  # the IPAM was not asked
    assert world.kube.writes == []  # parked before its finalizer: no write at all
    assert reconcile_claim(ctx.claims, "ns", "c2") == decision  # a resync: still nothing written
    assert world.kube.writes == []
    # c1 ends: the runtime is asked to wake one claim parked for the endpoint.
    world.queue.woken_places.clear()
    c1.leave()
    assert world.queue.woken_places[0] == (endpoint_token(endpoint), 1)
    assert reconcile_claim(ctx.claims, "ns", "c2") == Result.done()
    assert ("ns", "c2") in world.kube.addresses
    assert world.kube.ops()[0] == "claim.finalizer"  # the contract: finalizer first
    assert ctx.flow.endpoint(endpoint).in_flight == 0


def test_a_claims_ipam_call_releases_its_place_and_wakes_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch)
    ctx, endpoint = world.ctx, world.endpoint
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
    seen: list[int] = []

    def during() -> None:  # c2 comes (in another worker) while c1 is in its IPAM call
        seen.append(ctx.flow.endpoint(endpoint).in_flight)
        decisions: list[Result] = []
        in_other_thread(lambda: decisions.append(reconcile_claim(ctx.claims, "ns", "c2")))
        assert decisions == [Result.wait(endpoint_token(endpoint))]

    real_call = ctx.metrics.call

    def call(backend: str, operation: str, fn: Callable[[], Any]) -> Any:
        if not seen:
            during()
        return real_call(backend, operation, fn)

    monkeypatch.setattr(ctx.metrics, "call", call)
    assert reconcile_claim(ctx.claims, "ns", "c1") == Result.done()
    assert seen == [1]
    assert (endpoint_token(endpoint), 1) in world.queue.woken_places  # woken once c1 ended
    assert reconcile_claim(ctx.claims, "ns", "c2") == Result.done()
    # A failing call (the endpoint unreachable) frees its place too.
    world.kube.add_claim(claim("c3"))
    world.ipam.error = be.BackendUnavailableError("no answer")
    reconcile_claim(ctx.claims, "ns", "c3")
    assert ctx.flow.endpoint(endpoint).in_flight == 0 and ctx.flow.limit(endpoint) == 1


def test_the_flow_controls_own_refusals_never_lower_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch, limit=4)
    ctx, endpoint = world.ctx, world.endpoint
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
    # A "busy" refusal (no place for an operation) is not an answer of the IPAM: the limit
    # stays (it used to be halved, which shrank a healthy endpoint under load).
    world.ipam.error = be.EndpointUnavailableError(f"endpoint {endpoint} busy: 4 calls")
    reconcile_claim(ctx.claims, "ns", "c1")
    reconcile_claim(ctx.claims, "ns", "c2")
    assert ctx.flow.limit(endpoint) == 4


def test_a_claim_whose_endpoint_is_short_circuited_is_not_admitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch)
    ctx, endpoint = world.ctx, world.endpoint
    world.kube.add_claim(claim("c1"))
    for _ in range(ctx.flow.failure_threshold):  # requests without an answer open the breaker
        ctx.flow.endpoint(endpoint).unreachable()
    decision = reconcile_claim(ctx.claims, "ns", "c1")
    assert decision == Result.requeue_after(ctx.settings.requeue_seconds)  # not parked: retried
    assert world.ipam.calls == [] and world.built == []  # no client built, the IPAM not asked
    (ready,) = [
        c for c in world.kube.claims[("ns", "c1")]["status"]["conditions"] if c["type"] == "Ready"
    ]
    assert ready["reason"] == "AllocationFailed"
    assert f"endpoint {endpoint} unreachable, next try at" in ready["message"]
    assert ctx.flow.endpoint(endpoint).in_flight == 0 and ctx.flow.limit(endpoint) == 1
