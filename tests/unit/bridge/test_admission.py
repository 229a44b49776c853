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
from bridge.objects.keys import EndpointToken, claim_key, endpoint_token
from bridge.operator import Operator
from bridge.reconcilers.claims import reconcile_claim
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.waits import Places
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

EP = "http://ipam.test:80"


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


class Added:
    """A work queue that records the keys `Places` queues."""

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.first: list[Hashable] = []  # the keys queued before every key due

    def add(self, key: Hashable, after: float = 0.0, *, first: bool = False) -> None:
        self.keys.append(key)
        if first:
            self.first.append(key)


def places_of(flow: FlowControl) -> tuple[Places, Added]:
    queue = Added()

    def room(token: Hashable) -> int:
        return flow.room(token.endpoint) if isinstance(token, EndpointToken) else 0

    places = Places(queue, room)
    flow.on_free = lambda endpoint: places.freed(endpoint_token(endpoint))
    return places, queue


TOKEN = endpoint_token(EP)


def refused(places: Places, *keys: str) -> None:
    """Refuse ``keys`` a place, each in a pass of its own that ends parked."""
    for key in keys:
        assert places.wait(TOKEN, key) == Result.wait(TOKEN)
        places.passed(key)


def test_a_freed_place_wakes_the_longest_waiting_claim_only() -> None:
    flow = FlowControl(max_concurrent=1)
    places, queue = places_of(flow)
    holder = Holder(flow, EP)  # "a" works
    refused(places, "b", "c")
    assert queue.keys == []
    holder.leave()  # and ends: one place, for b
    assert queue.keys == ["b"]
    # Queued before every key due: the place is kept for b, idle until b runs.
    assert queue.first == ["b"]
    places.freed(TOKEN)  # told again: the place is promised to b already
    assert queue.keys == ["b"]
    assert places.sizes() == {"waiting": 1, "woken": 1}


def test_a_claim_refused_while_a_place_frees_is_not_forgotten() -> None:
    flow = FlowControl(max_concurrent=1)
    places, queue = places_of(flow)
    holder = Holder(flow, EP)
    places.wait(TOKEN, "b")  # refused; its pass has not ended (not parked yet)
    holder.leave()  # the place frees now
    assert queue.keys == ["b"]  # queued: the work queue runs it once more after its pass
    places.passed("b")  # that pass ends; the promise is passed on: nobody else waits
    assert places.sizes() == {"waiting": 0, "woken": 0}


def test_a_woken_claim_that_leaves_the_place_passes_it_on() -> None:
    flow = FlowControl(max_concurrent=1)
    places, queue = places_of(flow)
    holder = Holder(flow, EP)
    refused(places, "b", "c")
    holder.leave()
    assert queue.keys == ["b"]
    places.passed("b")  # b's pass ended without taking the place (its claim was deleted)
    assert queue.keys == ["b", "c"]
    assert places.may_take(TOKEN, "c") and flow.try_admit(EP)  # c takes it
    places.took(TOKEN, "c")
    places.passed("c")
    assert places.sizes() == {"waiting": 0, "woken": 0}  # nothing kept once passes ended


def test_nobody_jumps_ahead_of_a_woken_claim() -> None:
    flow = FlowControl(max_concurrent=1)
    places, _queue = places_of(flow)
    holder = Holder(flow, EP)
    refused(places, "b")
    holder.leave()  # one place: promised to b
    assert not places.may_take(TOKEN, "new")  # a claim that did not wait waits
    assert places.may_take(TOKEN, "b")
    assert flow.try_admit(EP)
    places.took(TOKEN, "b")
    assert places.sizes()["woken"] == 0 and not places.may_take(TOKEN, "new")  # full now


def test_a_waiting_claim_whose_pass_ends_without_a_refusal_waits_no_more() -> None:
    flow = FlowControl(max_concurrent=1)
    places, queue = places_of(flow)
    holder = Holder(flow, EP)
    refused(places, "b")
    places.passed("b")  # a later pass (the claim was deleted): no refusal
    holder.leave()
    assert queue.keys == [] and places.sizes() == {"waiting": 0, "woken": 0}


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
    # c1 ends: c2 (and only c2) is queued, and its pass is admitted and binds it.
    world.queue.added.clear()
    c1.leave()
    assert world.queue.added == [(claim_key("ns", "c2"), 0.0)]
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
    assert world.queue.added[-1] == (claim_key("ns", "c2"), 0.0)  # woken once c1 ended
    assert reconcile_claim(ctx.claims, "ns", "c2") == Result.done()
    # A failing call (the endpoint unreachable) frees its place too.
    world.kube.add_claim(claim("c3"))
    world.ipam.error = be.BackendUnavailableError("no answer")
    reconcile_claim(ctx.claims, "ns", "c3")
    assert ctx.flow.endpoint(endpoint).in_flight == 0 and ctx.flow.endpoint(endpoint).limit == 1


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
    assert ctx.flow.endpoint(endpoint).limit == 4


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
    assert ctx.flow.endpoint(endpoint).in_flight == 0 and ctx.flow.endpoint(endpoint).limit == 1
