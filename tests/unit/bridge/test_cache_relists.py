"""`bridge.handlers.cache.Relists`: kopf's listing after a watch restart relists the cache.

kopf watches pools and Clusters; claims and IPAddresses have informers of their own, which
list again themselves (`tests/unit/bridge/test_informer.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bridge.capi import GROUP
from bridge.handlers.cache import Relists
from bridge.objects.cache import Cache
from bridge.objects.keys import claim_key, cluster_key
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.cache import MISSING_UNKNOWN

OURS = {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "p"}}


def obj(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, **extra}


class Kube:
    """Lists from memory; the first ``failures`` Cluster lists fail (API server unreachable)."""

    def __init__(self, failures: int = 0) -> None:
        self.claims = [obj("live", "3", spec=OURS)]
        self.clusters = [obj("c1", "9", spec={"paused": False})]
        self.failures = failures
        self.lists = 0  # of Clusters
        self.claim_lists = 0

    def list_claims(self, version: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.claim_lists += 1
        return [dict(c) for c in self.claims]

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        return []

    def list_pools(self, kind: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        return []

    def list_clusters(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]] | None:
        self.lists += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError("refused")
        return [dict(c) for c in self.clusters]


@dataclass
class Settings:
    namespaces: tuple[str, ...] = ()


@dataclass
class Queue:
    queued: list[Any] = field(default_factory=list)
    woken: list[Any] = field(default_factory=list)

    def add(self, key: Any, after: float = 0.0) -> None:
        self.queued.append(key)

    def wake(self, token: Any, count: int | None = None) -> None:
        self.woken.append(token)


@dataclass
class Ctx:
    kube: Kube
    cache: Cache = field(default_factory=Cache)
    settings: Settings = field(default_factory=Settings)
    versions: ServedVersions = field(default_factory=lambda: ServedVersions("v1beta2"))
    queue: Queue = field(default_factory=Queue)

    @property
    def queued(self) -> list[Any]:
        return self.queue.queued

    @property
    def woken(self) -> list[Any]:
        return self.queue.woken


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle(relists: Relists) -> None:
    task = relists._task
    if task is not None:
        await asyncio.wait_for(task, 30)


def test_a_second_listing_drops_deleted_clusters_and_wakes_their_claims() -> None:
    async def scenario() -> tuple[Ctx, int]:
        ctx = Ctx(Kube())
        for part in (ctx.cache.claims, ctx.cache.addresses, ctx.cache.pools, ctx.cache.clusters):
            part.mark_synced()
        clock = Clock()
        relists = Relists(ctx, clock=clock)  # type: ignore[arg-type]
        # The first listing (start-up): nothing is relisted.
        ctx.cache.clusters.apply(("ns", "c1"), obj("c1", "1", spec={"paused": True}))
        ctx.cache.clusters.apply(("ns", "deleted"), obj("deleted", "2", spec={"paused": True}))
        relists.seen("clusters", None)
        clock.now = 1
        relists.seen("clusters", None)
        relists.seen("clusters", "MODIFIED")
        await _settle(relists)
        first = ctx.kube.lists
        # The watch restarted (410 Gone): kopf lists again. The Cluster deleted meanwhile
        # is not in kopf's listing, and absence is not trusted until the relist is done.
        relists.seen("clusters", None)
        assert ctx.cache.clusters.lookup(("ns", "other")) == MISSING_UNKNOWN
        assert ctx.cache.pools.suspected
        assert not ctx.cache.claims.suspected  # the claims' informer relists on its own
        await _settle(relists)
        return ctx, first

    ctx, first = asyncio.run(scenario())
    assert first == 0
    assert ctx.kube.lists == 1 and ctx.kube.claim_lists == 0
    assert ctx.cache.clusters.get(("ns", "deleted")) is None
    assert {token.name for token in ctx.woken} == {"c1", "deleted"}  # unpaused, and gone
    assert cluster_key("ns", "c1") not in ctx.queued  # asks for no endpoint


def test_a_listing_long_after_the_last_one_is_a_new_one_and_a_failed_relist_is_retried(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("bridge.handlers.cache.RETRY_SECONDS", 0.01)

    async def scenario() -> Ctx:
        ctx = Ctx(Kube(failures=2))
        clock = Clock()
        relists = Relists(ctx, clock=clock)  # type: ignore[arg-type]
        ctx.cache.clusters.apply(("ns", "deleted"), obj("deleted", "2", spec={"paused": True}))
        relists.seen("clusters", None)
        clock.now = 60  # no watch event in between, but a minute later: a new listing
        relists.seen("clusters", None)
        await _settle(relists)
        return ctx

    ctx = asyncio.run(scenario())
    assert ctx.kube.lists == 3
    assert ctx.cache.clusters.get(("ns", "deleted")) is None
    assert any(token.name == "deleted" for token in ctx.woken)


def test_a_cluster_turning_unpaused_relists_the_claims_its_event_wakes() -> None:
    async def scenario() -> tuple[Ctx, list[bool]]:
        ctx = Ctx(Kube())
        ctx.cache.claims.mark_synced()
        relists = Relists(ctx)  # type: ignore[arg-type]
        # Deleted while the claims' watch was down; its DELETED has not come yet.
        ctx.cache.claims.apply(("ns", "deleted"), obj("deleted", "2", spec=OURS))
        paused = obj("c1", "5", spec={"paused": True})
        relists.unpaused(None, paused)  # a new Cluster, paused: nothing
        relists.unpaused(paused, obj("c1", "6", spec={"paused": True}))  # still paused
        seen = [ctx.cache.claims.suspected]
        relists.unpaused(paused, obj("c1", "7", spec={"paused": False}))
        # The woken claims, reconciled before the relist is done, read the API.
        seen.append(ctx.cache.claims.lookup(("ns", "deleted")) == MISSING_UNKNOWN)
        await _settle(relists)
        return ctx, seen

    ctx, seen = asyncio.run(scenario())
    assert seen == [False, True]
    assert ctx.kube.claim_lists == 1
    assert ctx.cache.claims.lookup(("ns", "deleted")) == "missing"
    assert claim_key("ns", "deleted") in ctx.queued
