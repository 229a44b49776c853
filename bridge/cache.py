"""An informer-style cache of the objects a claim's decision reads: no API read on the hot path.

kopf already watches claims, pools, Clusters and (for this cache) our IPAddresses; every
object it sees comes here (`bridge.handlers.cache`, `bridge.handlers.claims`: event
handlers, which kopf calls for the objects of its initial listing too). A claim's reconcile
then reads its claim, its IPAddress, its pool and its Cluster from memory
(`bridge.claims`), as controller-runtime's cached client does.

What this relies on, and how each risk is closed:

- **Initial listing.** kopf does not tell when its initial listing of a resource is over
  (only its indexes see that, and they do not scale: kopf wakes every waiting object's
  worker at each indexed object, quadratic in the objects; 1,500 claims took 50 s to
  start). So the start-up handler lists pools, Clusters and our IPAddresses once itself
  (`prime`, as an informer's initial list) before kopf's watches start; each part is
  `ObjectCache.synced` once listed. Absence is only trusted once synced: before that, or
  when the list failed, a lookup that finds nothing answers `MISSING_UNKNOWN` and the caller
  reads the API (`ObjectCache.lookup`). Claims are queued by their own event, which puts
  them here first: a claim absent from the cache was deleted.
- **Our own writes.** The result of each of our writes (the object the API server returns)
  is put into the cache at once (`ObjectCache.put`), and a deletion leaves a tombstone
  (`ObjectCache.forget`): the next reconcile of the key sees what we wrote even before the
  watch event comes back.
- **Order.** Watch events of our own writes arrive after the write-through: an object is
  replaced only by one with a higher ``metadata.resourceVersion``. resourceVersions are
  compared as integers when both are (the etcd revision, as every kube-apiserver serves
  them); otherwise the last one seen wins. `ObjectCache.apply` says whether an event
  changed anything, so an echo of our own write queues no reconcile.
- **Stale entries** (an object deleted between `prime`'s list and kopf's, or while a watch
  reconnected: no DELETED event reaches anyone then): writes stay guarded (resourceVersion
  on finalizer patches, 409 AlreadyExists on IPAddress create, read once on that conflict
  path), so a stale entry costs a retry, never a wrong write. An IPAddress of ours cannot
  vanish while it carries our ``ProtectAddress`` finalizer.

The stored bodies are shared, read-only dicts (``metadata.managedFields`` dropped): callers
never modify them in place. Thread-safe: kopf's loop writes, worker threads read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from kubernetes.client import ApiException

from bridge import capi
from bridge.kube import Kube

__all__ = ["MISSING", "MISSING_UNKNOWN", "Cache", "ObjectCache", "newer", "prime"]

log = logging.getLogger(__name__)

Key = tuple[str, ...]

#: `ObjectCache.lookup`: the object is absent, and the initial listing was seen.
MISSING: Final = "missing"
#: `ObjectCache.lookup`: not in the cache, but the listing was not seen yet: read the API.
MISSING_UNKNOWN: Final = "unknown"


def _version(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")


def newer(candidate: str, current: str) -> bool:
    """Return True when resourceVersion ``candidate`` replaces ``current``.

    Integers (etcd revisions) are compared as integers; an empty or non-numeric version on
    either side lets the candidate win (last seen wins), except that an equal version never
    counts as newer.
    """
    if candidate == current:
        return False
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return True


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return a plain dict of ``body`` without ``metadata.managedFields`` (never read)."""
    copy = dict(body)
    meta = copy.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        copy["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return copy


class ObjectCache:
    """The objects of one resource, by key, as last seen in a watch or written by us.

    Parameters
    ----------
    resource:
        A name for messages (``ipaddressclaims``...).
    """

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        # Deleted by us: the resourceVersion last seen, until the watch's DELETED arrives.
        self._tombstones: dict[Key, str] = {}
        self._synced = False

    # -- feeding ---------------------------------------------------------------------------

    def apply(self, key: Key, body: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """Apply one watch event (listing, ADDED, MODIFIED or, with ``deleted``, DELETED).

        Returns
        -------
        bool
            True when the cache changed (a new object or a newer version, or a deletion of
            a known object); False for an echo of a version already known (our own write,
            put earlier) or older than it.
        """
        version = _version(body)
        with self._lock:
            if deleted:
                self._tombstones.pop(key, None)
                return self._objects.pop(key, None) is not None
            tomb = self._tombstones.get(key)
            if tomb is not None:
                if not newer(version, tomb):
                    return False
                del self._tombstones[key]
            current = self._objects.get(key)
            if current is not None and not newer(version, _version(current)):
                return False
            self._objects[key] = _trim(body)
            return True

    def put(self, key: Key, body: Mapping[str, Any] | None) -> None:
        """Write-through: record what the API server returned for our own write (None: nothing).

        Only where the cache is fed (synced, or the object already known from a watch):
        where nothing feeds it, as in unit tests, it holds nothing of its own making.

        A body with ``deletionTimestamp`` and no finalizers is an object the API server has
        just deleted (it goes when its last finalizer does,
        https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/): it is
        dropped, never stored. The watch's DELETED may already have arrived; storing it
        would keep a deleted object in memory for good.
        """
        if body is None:
            return
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            with self._lock:
                self._objects.pop(key, None)
            return
        if not self._synced:
            with self._lock:
                if key not in self._objects:
                    return
        self.apply(key, body)

    def forget(self, key: Key) -> None:
        """Write-through of our deletion: drop the object, ignore older events of it."""
        with self._lock:
            current = self._objects.pop(key, None)
            if current is not None:
                self._tombstones[key] = _version(current)

    def mark_synced(self) -> None:
        """Record that the initial listing was seen (absence can be trusted from now)."""
        self._synced = True

    def fill(self, items: Iterable[tuple[Key, Mapping[str, Any]]]) -> int:
        """Apply a listing's objects (newer versions win, as for events); mark synced.

        Returns
        -------
        int
            How many objects the listing held.
        """
        count = 0
        for key, body in items:
            self.apply(key, body)
            count += 1
        self.mark_synced()
        return count

    # -- reading ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the initial listing was seen."""
        return self._synced

    def get(self, key: Key) -> dict[str, Any] | None:
        """Return the cached object (a shared dict: do not modify it), or None."""
        with self._lock:
            return self._objects.get(key)

    def lookup(self, key: Key) -> dict[str, Any] | str:
        """Return the cached object, or `MISSING` (absent, trusted) or `MISSING_UNKNOWN`."""
        with self._lock:
            found = self._objects.get(key)
        if found is not None:
            return found
        return MISSING if self._synced else MISSING_UNKNOWN

    def values(self) -> Iterator[dict[str, Any]]:
        """Iterate over a snapshot of the cached objects."""
        with self._lock:
            snapshot = list(self._objects.values())
        return iter(snapshot)

    def __len__(self) -> int:
        """Return how many objects are cached."""
        with self._lock:
            return len(self._objects)


class Cache:
    """The operator's caches of claims, IPAddresses, pools and Clusters.

    Keys: ``(namespace, name)``; pools ``(kind, namespace, name)`` (``namespace`` empty for
    Global pools). Lives on the `bridge.context.Context` (``ctx.cache``); fed by
    `bridge.handlers.cache`.
    """

    def __init__(self) -> None:
        self.claims = ObjectCache("ipaddressclaims")
        self.addresses = ObjectCache("ipaddresses")
        self.pools = ObjectCache("pools")
        self.clusters = ObjectCache("clusters")

    def stored(self, plural: str, body: Mapping[str, Any]) -> None:
        """Write-through of one of our writes (`bridge.kube.Kube.on_stored`)."""
        part = {"ipaddressclaims": self.claims, "ipaddresses": self.addresses}.get(plural)
        if part is not None:
            part.put(self.key_of(body), body)

    def deleted(self, plural: str, namespace: str, name: str) -> None:
        """Write-through of one of our deletions (`bridge.kube.Kube.on_deleted`)."""
        part = {"ipaddressclaims": self.claims, "ipaddresses": self.addresses}.get(plural)
        if part is not None:
            part.forget((namespace, name))

    @staticmethod
    def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
        """Return ``(namespace, name)`` of an object (namespace empty when cluster-scoped)."""
        meta = body.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _ours(body: Mapping[str, Any]) -> bool:
    ref = (body.get("spec") or {}).get("poolRef") or {}
    return capi.PoolRef(
        str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
    ).is_ours


def prime(cache: Cache, kube: Kube, *, version: str, namespaces: tuple[str, ...]) -> None:
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
        for item in addresses:
            item.setdefault("apiVersion", f"{capi.GROUP}/{version}")
        count = cache.addresses.fill(
            (Cache.key_of(item), item) for item in addresses if _ours(item)
        )
        pools = cache.pools.fill(
            ((kind, *Cache.key_of(item)), item)
            for kind in capi.POOL_KINDS
            for item in kube.list_pools(kind, namespaces)
        )
        log.info("cache primed: %d IPAddresses of ours, %d pools", count, pools)
    except ApiException as exc:
        log.warning("cache not primed (%s %s): reading the API instead", exc.status, exc.reason)
    try:
        clusters = kube.list_clusters(namespaces)
    except ApiException as exc:
        log.warning("Clusters not listed (%s %s): reading them instead", exc.status, exc.reason)
        return
    cache.clusters.fill((Cache.key_of(item), item) for item in clusters or [])
