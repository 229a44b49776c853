"""`bridge.handlers.claims.claim_event`: which watch events of a claim queue a reconcile."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.claims import claim_event
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
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
    memo = kopf.Memo()
    memo.bridge = op
    asyncio.run(
        claim_event(type=type, body=body, meta=body["metadata"], spec=body["spec"], memo=memo)  # type: ignore[arg-type]
    )


def test_a_claim_of_another_provider_is_neither_cached_nor_queued() -> None:
    op, queue = operator()
    body = claim("1", finalizers=[CLAIM_FINALIZER])
    body["spec"]["poolRef"] = {"apiGroup": "ipam.example.com", "kind": "OtherPool", "name": "p"}
    event(op, "ADDED", body)
    event(op, "DELETED", body)
    assert queue.added == []
    assert op.cache.claims.get(("ns", "c1")) is None


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
