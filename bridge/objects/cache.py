"""The operator's informer cache: claims, our IPAddresses, pools and Clusters.

Claims and our IPAddresses are watched by informers of the runtime
(`bridge.runtime.informer`, built by `informers`): each lists, then watches, and applies
every event to its part here in its own thread. kopf watches pools and Clusters; every one
it sees comes here (`bridge.handlers.cache`). A claim's reconcile then reads its claim, its
IPAddress, its pool and its Cluster from memory (`bridge.reconcilers.claims`). Each part
is a `bridge.runtime.cache.ObjectCache` (what it relies on is said there).

- **Initial lists.** The start-up handler lists pools and Clusters once itself (`prime`,
  as an informer's initial list) before kopf's watches start: kopf does not tell when its
  initial listing of a resource is over (only its indexes see that, and they do not scale:
  kopf wakes every waiting object's worker at each indexed object, quadratic in the
  objects). The IPAddresses' informer lists before the claims' does, so a claim's first
  reconcile finds its IPAddress; a claim absent from the cache was deleted.
- **Watch restarts.** The informers list again on every restart of their watch
  (connection loss, an API server restart, 410 Gone). `bridge.handlers.cache.Relists` sees
  kopf list pools or Clusters again and refreshes those parts from a fresh list of its own
  (`relist`).
- **Stale entries** left by a watch that resumed late: writes stay guarded (resourceVersion
  on finalizer patches, which answer 404 for a claim gone; 409 AlreadyExists on IPAddress
  create). A Cluster turning unpaused wakes claims that may have waited for hours while
  the claims' watch, another stream, may lag behind: the claims part is suspect until it
  is relisted. An IPAddress of ours cannot vanish while it carries our ``ProtectAddress``
  finalizer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from kubernetes.client import ApiException

from bridge import capi
from bridge.objects.client import ObjectClient, address_resource, claim_resource
from bridge.runtime.cache import Key, ObjectCache, Relisted, Scope
from bridge.runtime.gateway import Resource, WatchStream
from bridge.runtime.informer import STALL_SECONDS, WATCH_SECONDS, Informer, Sink

__all__ = ["PARTS", "Cache", "Part", "informers", "prime", "relist"]

log = logging.getLogger(__name__)

#: The name of one part of `Cache`.
Part = Literal["claims", "addresses", "pools", "clusters"]
#: The parts of `Cache` a relist can refresh.
PARTS: Final[tuple[Part, ...]] = ("claims", "addresses", "pools", "clusters")


class Cache:
    """The operator's caches of claims, IPAddresses, pools and Clusters.

    Keys: ``(namespace, name)`` (`key_of`); pools ``(kind, namespace, name)`` (`pool_key_of`,
    ``namespace`` empty for Global pools). Fed by `bridge.handlers.cache`, written through
    by the `ObjectClient` (`stored`, `deleted`).
    """

    def __init__(self) -> None:
        self.claims = ObjectCache("ipaddressclaims", compact=True)
        self.addresses = ObjectCache("ipaddresses", compact=True)
        self.pools = ObjectCache("pools", trust_absence=False)
        self.clusters = ObjectCache("clusters", trust_absence=False)

    def part(self, name: Part) -> ObjectCache:
        """Return the part called ``name`` (one of `PARTS`)."""
        part: ObjectCache = getattr(self, name)
        return part

    def stored(self, plural: str, body: Mapping[str, Any]) -> None:
        """Write-through of one of our writes (`bridge.runtime.gateway.Kube.on_stored`)."""
        part = {"ipaddressclaims": self.claims, "ipaddresses": self.addresses}.get(plural)
        if part is not None:
            part.put(self.key_of(body), body)

    def deleted(self, plural: str, namespace: str, name: str) -> None:
        """Write-through of one of our deletions (`bridge.runtime.gateway.Kube.on_deleted`)."""
        part = {"ipaddressclaims": self.claims, "ipaddresses": self.addresses}.get(plural)
        if part is not None:
            part.forget((namespace, name))

    def settled(self, claim: Mapping[str, Any]) -> bool:
        """Tell whether ``claim`` (a claim's body) looks bound, with nothing left to do.

        True when it is not being deleted, carries the ``ReleaseAddress`` finalizer, and its
        ``status.addressRef`` names an IPAddress this cache holds: a start-up listing or a
        resync queues such a claim in the work queue's background lane
        (`bridge.runtime.workqueue.WorkQueue.add`), behind every claim that needs work. Its
        reconcile still decides (level-triggered); this only orders the queue.
        """
        meta = claim.get("metadata") or {}
        if meta.get("deletionTimestamp") or capi.CLAIM_FINALIZER not in (
            meta.get("finalizers") or ()
        ):
            return False
        ref = ((claim.get("status") or {}).get("addressRef") or {}).get("name")
        if not ref:
            return False
        return (str(meta.get("namespace") or ""), str(ref)) in self.addresses

    def sizes(self) -> dict[str, int]:
        """Return how many objects each part holds, by ``cache.<part>``."""
        return {f"cache.{name}": len(self.part(name)) for name in PARTS}

    @staticmethod
    def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
        """Return ``(namespace, name)`` of an object (namespace empty when cluster-scoped)."""
        meta = body.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    @staticmethod
    def pool_key_of(body: Mapping[str, Any]) -> tuple[str, str, str]:
        """Return ``(kind, namespace, name)`` of a pool object."""
        return (str(body.get("kind")), *Cache.key_of(body))


def _ours(body: Mapping[str, Any]) -> bool:
    return capi.PoolRef.from_spec(body.get("spec") or {}).is_ours


def _pools(kube: ObjectClient, namespaces: tuple[str, ...]) -> list[tuple[Key, dict[str, Any]]]:
    return [
        (Cache.pool_key_of(item), item)
        for kind in capi.POOL_KINDS
        for item in kube.list_pools(kind, namespaces)
    ]


def _ours_listed(items: list[dict[str, Any]], version: str) -> list[tuple[Key, dict[str, Any]]]:
    """Stamp listed claims or IPAddresses with their apiVersion; keep those of our pools."""
    for item in items:
        item.setdefault("apiVersion", f"{capi.GROUP}/{version}")
    return [(Cache.key_of(item), item) for item in items if _ours(item)]


def prime(cache: Cache, kube: ObjectClient, *, namespaces: tuple[str, ...]) -> None:
    """List pools and Clusters once into ``cache`` (an informer's first list).

    Called by the start-up handler before kopf's watches of pools and Clusters start; the
    watches keep the cache current from then on. Claims and IPAddresses are listed by their
    own informers (`informers`). A list that fails (no permission, Clusters not served)
    leaves its part unsynced: lookups there read the API instead (logged, never raised).

    Parameters
    ----------
    namespaces:
        The watched namespaces (empty: all); Global pools are listed cluster-wide.
    """
    try:
        pools = cache.pools.fill(_pools(kube, namespaces))
        log.info("cache primed: %d pools", pools)
    except ApiException as exc:
        log.warning("pools not listed (%s %s): reading the API instead", exc.status, exc.reason)
    try:
        clusters = kube.list_clusters(namespaces)
    except ApiException as exc:
        log.warning("Clusters not listed (%s %s): reading them instead", exc.status, exc.reason)
        return
    cache.clusters.fill((Cache.key_of(item), item) for item in clusters or [])


def informers(
    cache: Cache,
    kube: ObjectClient,
    *,
    version: str,
    namespaces: tuple[str, ...],
    addresses: Sink,
    claims: Sink,
    stall: float = STALL_SECONDS,
) -> list[Informer]:
    """Return the informers of our IPAddresses and claims, one per watched namespace.

    IPAddresses first: a claim's first reconcile reads its IPAddress from the cache. Each
    keeps the objects of our pools only (`bridge.capi.PoolRef.is_ours`; a poolRef is
    immutable), under ``(namespace, name)``. Not started (`Informer.start`).

    Parameters
    ----------
    version:
        The served IPAddressClaim/IPAddress version.
    namespaces:
        The watched namespaces (empty: all, one cluster-wide watch per resource).
    addresses, claims:
        What each informer tells its events to (`bridge.runtime.informer.Sink`).
    stall:
        Seconds without an event or a bookmark after which a watch is dead and its scope
        is listed again (`bridge.runtime.informer.Informer`).
    """
    made: list[Informer] = []
    scopes: dict[str | None, Scope] = {
        namespace: _Everywhere() if namespace is None else _Namespace(namespace)
        for namespace in namespaces or (None,)
    }
    for resource, part, sink in (
        (address_resource(version), cache.addresses, addresses),
        (claim_resource(version), cache.claims, claims),
    ):
        part.expect(scopes.values())  # synced once every namespace was listed
        for namespace, scope in scopes.items():
            made.append(
                Informer(
                    resource.plural if namespace is None else f"{resource.plural} in {namespace}",
                    list=functools.partial(kube.list_collection, resource, namespace),
                    watch=functools.partial(_watch, kube, resource, namespace),
                    cache=part,
                    key=Cache.key_of,
                    wanted=_ours,
                    sink=sink,
                    scope=scope,
                    stall=stall,
                )
            )
    return made


def _watch(
    kube: ObjectClient,
    resource: Resource,
    namespace: str | None,
    version: str,
    *,
    read_timeout: float,
) -> WatchStream:
    return kube.watch(
        resource,
        namespace,
        version,
        timeout_seconds=WATCH_SECONDS,
        read_timeout=read_timeout,
    )


@dataclass(frozen=True)
class _Everywhere:
    """Every key (`bridge.runtime.cache.Scope`): an informer's own, apart from other lists'."""

    def __call__(self, key: Key) -> bool:
        return True


@dataclass(frozen=True)
class _Namespace:
    """The keys of one namespace (`bridge.runtime.cache.Scope`)."""

    namespace: str

    def __call__(self, key: Key) -> bool:
        return isinstance(key, tuple) and bool(key) and key[0] == self.namespace


def _listing(
    kube: ObjectClient, part: Part, *, version: str, namespaces: tuple[str, ...]
) -> list[tuple[Key, dict[str, Any]]] | None:
    """List one part's objects afresh as ``(key, body)``; None when Clusters are not served."""
    if part == "pools":
        return _pools(kube, namespaces)
    if part == "clusters":
        clusters = kube.list_clusters(namespaces)
        return None if clusters is None else [(Cache.key_of(c), c) for c in clusters]
    if part == "claims":
        items = kube.list_claims(version, namespaces)
    else:
        items = [a for ns in namespaces or (None,) for a in kube.list_ip_addresses(version, ns)]
    return _ours_listed(items, version)


def relist(
    cache: Cache, kube: ObjectClient, part: Part, *, version: str, namespaces: tuple[str, ...]
) -> Relisted | None:
    """Refresh one part of ``cache`` from a fresh list (what an informer does on a relist).

    Parameters
    ----------
    part:
        One of `PARTS`.
    version:
        The served IPAddressClaim/IPAddress version.
    namespaces:
        The watched namespaces (empty: all); Global pools are listed cluster-wide.

    Returns
    -------
    Relisted or None
        What the list changed; None when Clusters are not served (nothing to list).

    Raises
    ------
    kubernetes.client.ApiException
        When the list fails (the part stays as it was, absence not trusted after
        `bridge.runtime.cache.ObjectCache.suspect`).
    urllib3.exceptions.HTTPError
        When the API server cannot be reached.
    """
    target = cache.part(part)
    relisting = target.begin_relist()
    try:
        items = _listing(kube, part, version=version, namespaces=namespaces)
    except BaseException:
        target.end_relist(relisting)
        raise
    if items is None:
        target.end_relist(relisting)
        return None
    return target.replace(items, relisting)
