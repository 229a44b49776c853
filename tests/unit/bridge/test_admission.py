"""backends.flowcontrol: claims in flight per IPAM endpoint, AIMD limit, hand-over of places.

Also how `claims` uses it: a claim over its endpoint's limit parks on the endpoint's
token without a write or an IPAM call, and the end of an admitted claim queues the next.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, cast

import pytest
from fakes import FakeIPAM, FakeKube, FakeQueue, claim, install_backend, phpipam_pool
from fakes import pool_condition as pool_ready

from backends import errors as be
from backends.flowcontrol import FlowControl, endpoint_token
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key
from bridge.operator import Operator
from bridge.reconcilers.claims import reconcile_claim
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

EP = "https://a.example.com:443"
OTHER = "https://b.example.com:443"


class Woken:
    """Records the keys the admission queues."""

    def __init__(self) -> None:
        self.keys: list[Hashable] = []

    def __call__(self, key: Hashable) -> None:
        self.keys.append(key)


def admission(max_limit: int = 2) -> tuple[FlowControl, Woken, dict[str, int]]:
    woken = Woken()
    gauge: dict[str, int] = {}
    flow = FlowControl(max_concurrent=max_limit, wake=woken, on_limit=gauge.__setitem__)
    return flow, woken, gauge


def test_the_limit_starts_at_the_max_and_is_per_endpoint() -> None:
    adm, woken, gauge = admission(2)
    assert adm.limit(EP) == 2
    assert adm.try_admit(EP, "a") and adm.try_admit(EP, "b")
    assert not adm.try_admit(EP, "c")  # full: waits, nothing queued
    assert adm.try_admit(OTHER, "d")  # another endpoint is not held by a full one
    assert adm.in_flight(EP) == 2 and adm.waiting(EP) == ["c"]
    assert woken.keys == [] and gauge == {EP: 2, OTHER: 2}
    with pytest.raises(ValueError):
        FlowControl(max_concurrent=0, wake=woken)


def test_the_peek_before_the_finalizer_takes_no_place_and_queues_in_line() -> None:
    adm, woken, _ = admission(1)
    assert not adm.wait_if_full(EP, "a")  # unknown endpoint: room
    assert adm.try_admit(EP, "a")
    assert not adm.wait_if_full(EP, "a")  # in flight itself: never parks
    assert adm.wait_if_full(EP, "b")  # full: b waits in line, nothing taken
    assert adm.in_flight(EP) == 1 and adm.waiting(EP) == ["b"]
    adm.finish(EP, "a")
    assert woken.keys == ["b"]  # the place is kept for b ...
    assert not adm.wait_if_full(EP, "b")  # ... so its next pass goes on to write
    assert adm.wait_if_full(EP, "c") and adm.waiting(EP) == ["c"]  # b's kept place is no room
    assert adm.try_admit(EP, "b") and adm.in_flight(EP) == 1


def test_a_finish_queues_the_longest_waiting_claim_and_keeps_its_place() -> None:
    adm, woken, _ = admission(1)
    assert adm.try_admit(EP, "a")
    assert not adm.try_admit(EP, "b")
    assert not adm.try_admit(EP, "c")
    assert not adm.try_admit(EP, "b")  # asked again (a resync): keeps its place in line
    adm.finish(EP, "a")
    assert woken.keys == ["b"]  # one, the oldest
    assert not adm.try_admit(EP, "newcomer")  # the place is b's
    assert adm.try_admit(EP, "b")
    assert adm.waiting(EP) == ["c", "newcomer"]


def test_no_count_leaks_when_the_work_raises() -> None:
    adm, woken, _ = admission(1)
    assert adm.try_admit(EP, "a")
    assert not adm.try_admit(EP, "b")
    with pytest.raises(RuntimeError), adm.held(EP, "a"):
        raise RuntimeError("boom")
    assert adm.in_flight(EP) == 0 and woken.keys == ["b"]
    adm.finish(EP, "a")  # a second finish changes nothing
    assert adm.in_flight(EP) == 0 and adm.limit(EP) == 1


def test_a_woken_claim_that_no_longer_needs_the_endpoint_passes_its_place_on() -> None:
    adm, woken, _ = admission(1)
    assert adm.try_admit(EP, "a")
    assert not adm.try_admit(EP, "b")
    assert not adm.try_admit(EP, "c")
    adm.finish(EP, "a")
    assert woken.keys == ["b"]
    adm.settle("b", ())  # b's pass ended without asking (bound, paused, gone)
    assert woken.keys == ["b", "c"]
    # A waiting claim whose pass parks elsewhere leaves the line; one still waiting stays.
    adm.settle("c", (endpoint_token(EP),))
    assert adm.try_admit(EP, "c")


def test_timeouts_halve_the_limit_once_per_window_and_successes_grow_it() -> None:
    adm, _, gauge = admission(8)
    keys = [f"k{i}" for i in range(8)]
    assert all(adm.try_admit(EP, k) for k in keys)
    unavailable = be.BackendUnavailableError("no answer within 10s")
    for key in keys[:4]:  # one burst of timeouts: one decrease
        adm.finish(EP, key, unavailable)
    assert adm.limit(EP) == 4 and gauge[EP] == 4
    for key in keys[4:]:
        adm.finish(EP, key, be.AuthenticationFailedError("refused"))  # neither up nor down
    assert adm.limit(EP) == 4
    assert adm.try_admit(EP, "x")  # admitted after the decrease: may decrease again
    adm.finish(EP, "x", be.EndpointUnavailableError("endpoint busy"))
    assert adm.limit(EP) == 2
    for step in range(3):
        assert adm.try_admit(EP, f"y{step}")
        adm.finish(EP, f"y{step}", be.BackendUnavailableError("503"))
    assert adm.limit(EP) == 1  # never below 1
    for step in range(3):  # +1 per limit successes: 1 -> 2 after 1, -> 3 after 2 more
        assert adm.try_admit(EP, f"z{step}")
        adm.finish(EP, f"z{step}")
    assert adm.limit(EP) == 3 and gauge[EP] == 3
    for step in range(100):
        assert adm.try_admit(EP, f"w{step}")
        adm.finish(EP, f"w{step}")
    assert adm.limit(EP) == 8  # never above the transport's limit


def test_growth_hands_the_new_room_to_waiting_claims() -> None:
    adm, woken, _ = admission(2)
    assert adm.try_admit(EP, "a") and adm.try_admit(EP, "b")
    adm.finish(EP, "a", be.BackendUnavailableError("timeout"))  # 2 -> 1
    adm.finish(EP, "b", be.BackendUnavailableError("timeout"))  # same window: stays 1
    assert adm.limit(EP) == 1
    assert adm.try_admit(EP, "c")
    assert not adm.try_admit(EP, "d") and not adm.try_admit(EP, "e")
    adm.finish(EP, "c")  # 1 -> 2: two places, both go to the waiting claims
    assert adm.limit(EP) == 2 and woken.keys == ["d", "e"]


# -- in claims ------------------------------------------------------------------------


class Ctx:
    """A context whose endpoint allows one claim in flight, over the fakes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kube = FakeKube()
        self.ipam = FakeIPAM(cidr="10.0.0.0/28")
        self.built = install_backend(monkeypatch, self.ipam)
        self.queue = FakeQueue()
        self.ctx = Operator(
            settings=Settings(),
            kube=cast(ObjectClient, self.kube),
            versions=ServedVersions("v1beta2"),
            flow=FlowControl(max_concurrent=1),
            queue=self.queue,
        )
        self.kube.add_secret("ns", "creds", {"username": "u", "password": "p"})
        self.kube.add_pool(phpipam_pool(status=pool_ready()))
        self.endpoint = "https://ipam.example.com:443"  # the pool's, as the registry keys it


def test_a_claim_over_the_limit_parks_on_its_endpoint_and_a_finish_queues_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch)
    ctx, endpoint = world.ctx, world.endpoint
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
    # c1 is in its IPAM call (admitted) when c2 comes.
    assert ctx.flow.try_admit(endpoint, claim_key("ns", "c1"))
    world.kube.writes.clear()
    decision = reconcile_claim(ctx.claims, "ns", "c2")
    assert decision == Result.wait(endpoint_token(endpoint))  # parked, no timer
    assert world.ipam.calls == []  # the IPAM was not asked
    assert world.kube.writes == []  # parked before its finalizer: no write at all
    world.kube.writes.clear()
    assert reconcile_claim(ctx.claims, "ns", "c2") == decision  # a resync: still nothing written
    assert world.kube.writes == []
    # c1 ends: c2 (and only c2) is queued, and its pass is admitted and binds it.
    ctx.flow.finish(endpoint, claim_key("ns", "c1"))
    assert world.queue.added == [(claim_key("ns", "c2"), 0.0)]
    assert reconcile_claim(ctx.claims, "ns", "c2") == Result.done()
    assert ("ns", "c2") in world.kube.addresses
    assert world.kube.ops()[0] == "claim.finalizer"  # the contract: finalizer first
    assert ctx.flow.in_flight(endpoint) == 0


def test_a_claims_ipam_call_releases_its_place_and_queues_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Ctx(monkeypatch)
    ctx, endpoint = world.ctx, world.endpoint
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
    seen: list[int] = []

    def during() -> None:  # c2 comes while c1 is in its IPAM call
        seen.append(ctx.flow.in_flight(endpoint))
        assert reconcile_claim(ctx.claims, "ns", "c2") == Result.wait(endpoint_token(endpoint))

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
    # A failing call (the endpoint unreachable) frees its place too, and halves nothing
    # below 1.
    world.kube.add_claim(claim("c3"))
    world.ipam.error = be.BackendUnavailableError("no answer")
    reconcile_claim(ctx.claims, "ns", "c3")
    assert ctx.flow.in_flight(endpoint) == 0 and ctx.flow.limit(endpoint) == 1


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
    assert ctx.flow.in_flight(endpoint) == 0 and ctx.flow.limit(endpoint) == 1
