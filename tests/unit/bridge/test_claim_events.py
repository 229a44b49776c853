"""`bridge.handlers.claims.ClaimEvents`: which events of a claim queue a reconcile."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.claims import ClaimEvents
from bridge.objects.cache import Cache, informers
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.gateway import Collection
from bridge.runtime.informer import Event, Listed
from bridge.settings import Settings
from tests.unit.bridge.fakes import FakeQueue

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
    op.cache.claims.mark_synced()
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

    made = informers(
        cache,
        cast(ObjectClient, ListingKube()),
        version="v1beta2",
        namespaces=(),
        addresses=Sink(),
        claims=Sink(),
    )
    assert [i.name for i in made] == ["ipaddresses", "ipaddressclaims"]
    for informer in made:
        informer.start()
        assert informer.wait_tried(10)
    for informer in made:
        informer.stop()
    assert [name for _, name in (key for key, _ in told[1].items)] == ["c1"]
    assert ("ns", "c1") in cache.claims and ("ns", "theirs") not in cache.claims


def test_the_deletion_of_a_claim_whose_release_the_cache_saw_queues_nothing() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[CLAIM_FINALIZER]))
    event(op, "MODIFIED", claim("2", finalizers=[CLAIM_FINALIZER], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]
    # The release's last write (our finalizer off) answers the claim deleted: written through.
    op.cache.stored("ipaddressclaims", claim("3", finalizers=[], deleting=True))
    event(op, "DELETED", claim("3", finalizers=[], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]  # no pass for a claim gone and done


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


def test_the_echo_of_our_write_that_came_before_its_answer_queues_nothing() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[]))
    assert [key for key, _ in queue.added] == [KEY]
    # Our finalizer write: its echo comes first (news to the cache), then its answer.
    echo = claim("2", finalizers=[CLAIM_FINALIZER])
    changed = op.cache.claims.apply(("ns", "c1"), echo)
    assert changed
    op.cache.stored("ipaddressclaims", echo)
    ClaimEvents(op).event(Event("MODIFIED", ("ns", "c1"), echo, changed))
    assert [key for key, _ in queue.added] == [KEY]  # ours: no pass for it
    # Someone else's change after ours is news, and queues the claim.
    event(op, "MODIFIED", claim("3", finalizers=[CLAIM_FINALIZER], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]


def test_the_deletion_our_last_finalizer_write_made_queues_nothing_even_told_first() -> None:
    op, queue = operator()
    event(op, "ADDED", claim("1", finalizers=[CLAIM_FINALIZER]))
    event(op, "MODIFIED", claim("2", finalizers=[CLAIM_FINALIZER], deleting=True))
    assert [key for key, _ in queue.added] == [KEY, KEY]
    # The release's last write: the watch's DELETED comes before the write's answer.
    gone = claim("3", finalizers=[], deleting=True)
    changed = op.cache.claims.apply(("ns", "c1"), gone, deleted=True)
    assert changed
    op.cache.stored("ipaddressclaims", gone)  # the answer, written through
    ClaimEvents(op).event(Event("DELETED", ("ns", "c1"), gone, changed))
    assert [key for key, _ in queue.added] == [KEY, KEY]  # no pass for our own deletion
    assert op.cache.claims.held() == 0
