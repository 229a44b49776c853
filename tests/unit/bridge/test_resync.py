"""The periodic resync: from the informer cache (else the API), bound claims in the background."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.resync import _queue_addresses, _queue_claims, _queue_clusters, _queue_pools
from bridge.objects.cache import Cache
from bridge.objects.keys import claim_key, cluster_key, pool_key
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.control_plane import POOL_ANNOTATION
from bridge.settings import Settings


def claim(name: str, *, bound: bool = False, kind: str = "PHPIPAMIPPool") -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": kind, "name": "pool"}},
    }
    if bound:
        body["metadata"]["finalizers"] = [CLAIM_FINALIZER]
        body["status"] = {"addressRef": {"name": name}}
    return body


@dataclass
class Kube:
    claims: list[dict[str, Any]]
    pools: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    addresses: list[dict[str, Any]] = field(default_factory=list)
    listed: int = 0

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        self.listed += 1
        return [dict(a) for a in self.addresses]

    def list_claims(self, version: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.listed += 1
        return [dict(c) for c in self.claims]

    def list_pools(self, kind: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.listed += 1
        return [dict(p) for p in self.pools if p["kind"] == kind]

    def list_clusters(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.listed += 1
        return [dict(c) for c in self.clusters]


@dataclass
class Queue:
    added: list[tuple[Any, bool]] = field(default_factory=list)

    def add(self, key: Any, after: float = 0.0, *, background: bool = False) -> None:
        self.added.append((key, background))


@dataclass
class Ctx:
    kube: Kube
    cache: Cache = field(default_factory=Cache)
    queue: Queue = field(default_factory=Queue)
    settings: Settings = field(default_factory=Settings)
    versions: ServedVersions = field(default_factory=lambda: ServedVersions("v1beta2", "v1beta2"))


def test_claims_are_resynced_from_the_cache_bound_ones_in_the_background() -> None:
    ctx = Ctx(Kube([claim("in-api-only")]))
    ctx.cache.claims.fill([])
    ctx.cache.claims.apply(("ns", "new"), claim("new"))
    ctx.cache.claims.apply(("ns", "bound"), claim("bound", bound=True))
    ctx.cache.addresses.apply(("ns", "bound"), {"metadata": {"namespace": "ns", "name": "bound"}})
    assert _queue_claims(ctx) == 2  # type: ignore[arg-type]
    assert ctx.kube.listed == 0
    assert sorted(ctx.queue.added, key=str) == [
        (claim_key("ns", "bound"), True),
        (claim_key("ns", "new"), False),
    ]


def test_claims_are_listed_while_the_cache_is_suspect() -> None:
    ctx = Ctx(Kube([claim("listed"), claim("other", kind="OtherPool")]))
    ctx.cache.claims.fill([])
    ctx.cache.claims.suspect()
    assert _queue_claims(ctx) == 1  # type: ignore[arg-type]
    assert ctx.kube.listed == 1
    assert ctx.queue.added == [(claim_key("ns", "listed"), False)]


def pool(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
    }


def cluster(name: str) -> dict[str, Any]:
    annotations = {POOL_ANNOTATION: "PHPIPAMIPPool/nodes"}
    return {"metadata": {"namespace": "ns", "name": name, "annotations": annotations}}


def test_pools_and_clusters_are_resynced_from_the_cache_once_it_is_listed() -> None:
    ctx = Ctx(Kube([], pools=[pool("in-api")], clusters=[cluster("in-api")]))
    assert _queue_pools(ctx) == 1  # type: ignore[arg-type]  # not listed yet: the API
    assert _queue_clusters(ctx) == 1  # type: ignore[arg-type]
    assert ctx.kube.listed == 5  # each pool kind, then the Clusters
    assert ctx.queue.added == [
        (pool_key("ns", "PHPIPAMIPPool", "in-api"), False),
        (cluster_key("ns", "in-api"), False),
    ]
    ctx.queue.added.clear()
    ctx.cache.pools.fill([(("PHPIPAMIPPool", "ns", "cached"), pool("cached"))])
    ctx.cache.clusters.fill([(("ns", "cached"), cluster("cached"))])
    assert _queue_pools(ctx) == 1  # type: ignore[arg-type]
    assert _queue_clusters(ctx) == 1  # type: ignore[arg-type]
    assert ctx.kube.listed == 5  # nothing listed
    assert ctx.queue.added == [
        (pool_key("ns", "PHPIPAMIPPool", "cached"), False),
        (cluster_key("ns", "cached"), False),
    ]
    ctx.cache.pools.suspect()  # a watch ended or stalled: listed again
    assert _queue_pools(ctx) == 1  # type: ignore[arg-type]
    assert ctx.kube.listed == 9


def address(name: str, claim_name: str, *, kind: str = "PHPIPAMIPPool") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
        "spec": {
            "claimRef": {"name": claim_name},
            "poolRef": {"apiGroup": GROUP, "kind": kind, "name": "pool"},
        },
    }


def test_the_claims_of_ipaddresses_are_resynced_so_an_orphan_is_found() -> None:
    # Issue 37: the resync walked claims only; an IPAddress whose claim is gone (live, owned
    # by its pool alone: real-cluster.md 13f) was never looked at again, across restarts.
    ctx = Ctx(Kube([], addresses=[address("in-api", "in-api")]))
    assert _queue_addresses(ctx) == 1  # type: ignore[arg-type]  # not listed yet: the API
    assert ctx.kube.listed == 1
    assert ctx.queue.added == [(claim_key("ns", "in-api"), True)]
    ctx.queue.added.clear()
    ctx.cache.addresses.fill(
        [
            (("ns", "orphan"), address("orphan", "orphan")),
            (("ns", "foreign"), address("foreign", "foreign", kind="InClusterIPPool")),
        ]
    )
    assert _queue_addresses(ctx) == 1  # type: ignore[arg-type]
    assert ctx.kube.listed == 1  # from the cache
    assert ctx.queue.added == [(claim_key("ns", "orphan"), True)]
