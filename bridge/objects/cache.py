"""The operator's informer cache: claims, our IPAddresses, pools and Clusters.

kopf watches claims, pools, Clusters and (for this cache) our IPAddresses; every object it
sees comes here (`bridge.handlers.cache`, `bridge.handlers.claims`: event handlers, which
kopf calls for the objects of its initial listing too). A claim's reconcile then reads its
claim, its IPAddress, its pool and its Cluster from memory (`bridge.reconcilers.claims`).
Each part is a `bridge.runtime.cache.ObjectCache` (what it relies on is said there).

- **Initial listing.** kopf does not tell when its initial listing of a resource is over
  (only its indexes see that, and they do not scale: kopf wakes every waiting object's
  worker at each indexed object, quadratic in the objects). So the start-up handler lists
  pools, Clusters and our IPAddresses once itself (`prime`, as an informer's initial list)
  before kopf's watches start. Claims are queued by their own event, which puts them here
  first: a claim absent from the cache was deleted.
- **Watch restarts.** `bridge.handlers.cache.Relists` sees kopf list a resource again and
  refreshes each part from a fresh list of its own (`relist`).
- **Stale entries** left by a watch that resumed late: writes stay guarded (resourceVersion
  on finalizer patches, which answer 404 for a claim gone; 409 AlreadyExists on IPAddress
  create). A Cluster turning unpaused wakes claims that may have waited for hours while
  the claims' watch, another stream, may lag behind: the claims part is suspect until it
  is relisted. An IPAddress of ours cannot vanish while it carries our ``ProtectAddress``
  finalizer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, Literal

from kubernetes.client import ApiException

from bridge import capi
from bridge.objects.client import ObjectClient
from bridge.runtime.cache import Key, ObjectCache, Relisted

__all__ = ["PARTS", "Cache", "Part", "prime", "relist"]

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


def prime(cache: Cache, kube: ObjectClient, *, version: str, namespaces: tuple[str, ...]) -> None:
    """List pools, Clusters and our IPAddresses once into ``cache`` (the informer's list).

    Called by the start-up handler before kopf's watches start; the watches keep the cache
    current from then on. Claims need no list (see the module docstring): they are marked
    synced. A list that fails (no permission, Clusters not served) leaves its part
    unsynced: lookups there read the API instead (logged, never raised).

    Parameters
    ----------
    version:
        The served IPAddress version (the one the operator reads and writes).
    namespaces:
        The watched namespaces (empty: all); Global pools are listed cluster-wide.
    """
    cache.claims.mark_synced()
    try:
        addresses: list[dict[str, Any]] = []
        for namespace in namespaces or (None,):
            addresses += kube.list_ip_addresses(version, namespace)
        count = cache.addresses.fill(_ours_listed(addresses, version))
        pools = cache.pools.fill(_pools(kube, namespaces))
        log.info("cache primed: %d IPAddresses of ours, %d pools", count, pools)
    except ApiException as exc:
        log.warning("cache not primed (%s %s): reading the API instead", exc.status, exc.reason)
    try:
        clusters = kube.list_clusters(namespaces)
    except ApiException as exc:
        log.warning("Clusters not listed (%s %s): reading them instead", exc.status, exc.reason)
        return
    cache.clusters.fill((Cache.key_of(item), item) for item in clusters or [])


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
    target.begin_relist()
    try:
        items = _listing(kube, part, version=version, namespaces=namespaces)
    except BaseException:
        target.end_relist()
        raise
    if items is None:
        target.end_relist()
        return None
    return target.replace(items)
