"""The periodic resync of claims: from the informer cache, bound claims in the background."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.resync import _queue_claims
from bridge.objects.cache import Cache
from bridge.objects.keys import claim_key
from bridge.reconcilers.context import ServedVersions
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
    listed: int = 0

    def list_claims(self, version: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.listed += 1
        return [dict(c) for c in self.claims]


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
    versions: ServedVersions = field(default_factory=lambda: ServedVersions("v1beta2"))


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
