"""`bridge.handlers.claims.ClaimEvents`: which events of a claim queue a reconcile."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

from fakes import FakeQueue

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.claims import ClaimEvents
from bridge.objects.cache import PARTS, Cache, informers
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.expectations import GONE, Expectations
from bridge.runtime.gateway import Collection
from bridge.runtime.informer import Event, Listed
from bridge.settings import Settings

KEY = claim_key("ns", "c1")


def claim(rv: str, *, finalizers: list[str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "c1",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": rv,
        "finalizers": finalizers,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": meta,
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "p"}},
    }


def operator() -> tuple[Operator, FakeQueue]:
    queue = FakeQueue()
    op = Operator(
        settings=Settings(),
        kube=cast(ObjectClient, object()),
        versions=ServedVersions("v1beta2"),
        queue=queue,
    )
    op.cache.claims.fill([])
    return op, queue


def event(op: Operator, type: str | None, body: dict[str, Any]) -> None:
    """What the claims informer does with one event: apply it, then tell `ClaimEvents`."""
    sink = ClaimEvents(op)
    key = ("ns", str(body["metadata"]["name"]))
    if type is None:
        op.cache.claims.apply(key, body)
        sink.listed(Listed([(key, body)]))
    else:
        changed = op.cache.claims.apply(key, body, deleted=type == "DELETED")
        sink.event(Event(type, key, body, changed))


class Stream:
    """A watch that tells nothing until it is closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.closed.wait(10)
        return iter(())

    def close(self) -> None:
        self.closed.set()


class ListingKube:
    """Lists one claim of ours and one of another provider; watches tell nothing."""

    def __init__(self) -> None:
        theirs = claim("2", finalizers=[])
        theirs["metadata"]["name"] = "theirs"
        theirs["spec"]["poolRef"] = {"apiGroup": "ipam.example.com", "kind": "Other", "name": "p"}
        self.items = [claim("1", finalizers=[]), theirs]

    def list_collection(self, resource: Any, namespace: str | None) -> Collection:
        items = self.items if resource.plural == "ipaddressclaims" else []
        return Collection([dict(i) for i in items], "5")

    def watch(self, *_: Any, **__: Any) -> Stream:
        return Stream()


def test_a_claim_of_another_provider_is_neither_cached_nor_told() -> None:
    cache = Cache()
    told: list[Listed] = []

    class Sink:
        def listed(self, listed: Listed) -> None:
            told.append(listed)

        def relisted(self, relisted: Any) -> None: ...

        def event(self, event: Event) -> None: ...

    parts = informers(
        cache,
        cast(ObjectClient, ListingKube()),
        version="v1beta2",
        cluster_version=None,
        namespaces=(),
        sinks=dict.fromkeys(PARTS, Sink()),
    )
    made = parts["addresses"] + parts["claims"]
    assert [i.name for i in made] == ["ipaddresses", "ipaddressclaims"]
    for informer in made:
        informer.start()
        assert informer.wait_tried(10)
    for informer in made:
        informer.stop()
    assert [name for _, name in (key for key, _ in told[1].items)] == ["c1"]
    assert ("ns", "c1") in cache.claims and ("ns", "theirs") not in cache.claims


EXPECTED = ("ipaddressclaims", "ns", "c1")


def test_the_deletion_our_last_finalizer_write_made_queues_nothing() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[CLAIM_FINALIZER]))
    event(op, "MODIFIED", claim("2", finalizers=[CLAIM_FINALIZER], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]
    # The release's last write (our finalizer off) was answered: the claim is deleted.
    op.cache.expectations.wrote(EXPECTED, GONE)
    event(op, "DELETED", claim("3", finalizers=[], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]  # no pass for a claim gone and done
    assert op.cache.expectations.pending(EXPECTED) == 0.0


def test_the_echo_of_our_write_queues_nothing_and_wakes_the_pass_waiting_for_it() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[]))
    op.cache.expectations.wrote(EXPECTED, "2")  # our finalizer write, answered
    event(op, "MODIFIED", claim("2", finalizers=[CLAIM_FINALIZER]))
    assert [key for key, _ in queue.added] == [KEY]
    assert Expectations.token(EXPECTED) in queue.woken
    # Someone else's change after ours is news, and queues the claim.
    event(op, "MODIFIED", claim("3", finalizers=[CLAIM_FINALIZER], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]


class PassQueue(FakeQueue):
    """A queue whose key is being processed: ``unless`` is asked when the pass ends."""

    def __init__(self) -> None:
        super().__init__()
        self.deferred: list[tuple[Any, Callable[[], bool]]] = []

    def add(
        self,
        key: Any,
        after: float = 0.0,
        *,
        background: bool = False,
        unless: Callable[[], bool] | None = None,
    ) -> None:
        if unless is None:
            super().add(key, after, background=background)
        else:
            self.deferred.append((key, unless))

    def end_pass(self) -> None:
        for key, unless in self.deferred:
            super().add(key, unless=unless)
        self.deferred.clear()


def test_an_echo_told_before_its_answer_queues_nothing_once_the_pass_ended() -> None:
    op, queue = operator()
    queue = op.queue = PassQueue()
    event(op, "ADDED", claim("1", finalizers=[]))
    queue.end_pass()
    assert [key for key, _ in queue.added] == [KEY]
    # Our finalizer write's echo, then our last finalizer removal's DELETED, both told
    # while the pass runs, before the answers are recorded.
    event(op, "MODIFIED", claim("2", finalizers=[CLAIM_FINALIZER]))
    op.cache.expectations.wrote(EXPECTED, "2")
    event(op, "DELETED", claim("3", finalizers=[], deleting=True))
    op.cache.expectations.wrote(EXPECTED, GONE)
    assert op.cache.expectations.pending(EXPECTED) == 0.0  # both seen: nothing to wait for
    queue.end_pass()
    assert [key for key, _ in queue.added] == [KEY]  # no pass for our own writes


def test_the_deletion_of_a_claim_the_cache_holds_queues_it() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[]))
    event(op, "DELETED", claim("1", finalizers=[]))
    assert [key for key, _ in queue.added] == [KEY, KEY]


def test_the_deletion_of_a_parked_claim_queues_it_to_end_its_wait() -> None:
    op, queue = operator()
    queue.parked_keys[pool_token("ns", "PHPIPAMIPPool", "p")] = {KEY}
    event(op, "DELETED", claim("1", finalizers=[]))
    assert [key for key, _ in queue.added] == [KEY]


def test_a_listing_queues_every_claim_it_shows() -> None:
    op, queue = operator()
    event(op, None, claim("1", finalizers=[]))
    event(op, None, claim("1", finalizers=[]))
    assert [key for key, _ in queue.added] == [KEY, KEY]
