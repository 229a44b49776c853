"""The operator's informer cache: claims, our IPAddresses, pools and Clusters.

One watch stack feeds every part: an informer of the runtime (`bridge.runtime.informer`,
built by `informers`) per resource (each pool kind apart) and watched namespace lists,
then watches, and applies every event to its part here in its own thread; its sink
(`bridge.handlers.claims`, `bridge.handlers.pools`) queues what needs a reconcile. A claim's
reconcile then reads its claim, its IPAddress, its pool and its Cluster from memory
(`bridge.reconcilers.claims`). Each part is a `bridge.runtime.store.Store`, a copy of its
watch (what it relies on is said there); our own writes of claims and IPAddresses are
recorded in `Cache.expectations` (`bridge.runtime.expectations`), never in a store.

- **Initial lists.** IPAddresses, pools and Clusters are listed before claims
  (`bridge.handlers.lifecycle.start_informers`): a claim's first reconcile finds them; a
  claim absent from a synced store was deleted.
- **Watch restarts** (connection loss, an API server restart, the server's timeout): the
  informer resumes its watch from the last resourceVersion, and the part stays trusted.
  After a gap (410 Gone, a watch silent for the stall limit) it makes its scope suspect at
  once (lookups read the API) and lists it again.
- **Stale entries** left by a watch that lags: writes stay guarded (resourceVersion on
  finalizer patches, which answer 404 for a claim gone; 409 AlreadyExists on IPAddress
  create). An IPAddress of ours cannot vanish while it carries our ``ProtectAddress``
  finalizer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from bridge import capi
from bridge.objects.client import (
    ObjectClient,
    address_resource,
    claim_resource,
    cluster_resource,
    pool_resource,
)
from bridge.runtime.expectations import Expectations
from bridge.runtime.gateway import Resource, WatchStream
from bridge.runtime.informer import STALL_SECONDS, WATCH_SECONDS, Informer, Sink
from bridge.runtime.store import Key, Store

__all__ = ["PARTS", "Cache", "Part", "informers"]

#: The name of one part of `Cache`.
Part = Literal["claims", "addresses", "pools", "clusters"]
#: The parts of `Cache`, in the order their informers start (claims last).
PARTS: Final[tuple[Part, ...]] = ("addresses", "pools", "clusters", "claims")


class Cache:
    """The operator's stores of claims, IPAddresses, pools and Clusters, and expectations.

    Keys: ``(namespace, name)`` (`key_of`); pools ``(kind, namespace, name)`` (`pool_key_of`,
    ``namespace`` empty for Global pools). `expectations` are keyed ``(plural, namespace,
    name)`` (`bridge.objects.client.ObjectClient`).
    """

    def __init__(self) -> None:
        self.claims = Store("ipaddressclaims", compact=True)
        self.addresses = Store("ipaddresses", compact=True)
        self.pools = Store("pools", trust_absence=False)
        self.clusters = Store("clusters", trust_absence=False)
        self.expectations = Expectations()

    def part(self, name: Part) -> Store:
        """Return the part called ``name`` (one of `PARTS`)."""
        part: Store = getattr(self, name)
        return part

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
        """Return how many objects each part holds, by ``cache.<part>``, and expectations."""
        sizes = {f"cache.{name}": len(self.part(name)) for name in PARTS}
        sizes["cache.expectations"] = len(self.expectations)
        return sizes

    @staticmethod
    def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
        """Return ``(namespace, name)`` of an object (namespace empty when cluster-scoped)."""
        meta = body.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    @staticmethod
    def pool_key_of(body: Mapping[str, Any], kind: str | None = None) -> tuple[str, str, str]:
        """Return ``(kind, namespace, name)`` of a pool object (``kind``: when known)."""
        return (kind or str(body.get("kind")), *Cache.key_of(body))


def _ours(body: Mapping[str, Any]) -> bool:
    return capi.PoolRef.from_spec(body.get("spec") or {}).is_ours


def _every(body: Mapping[str, Any]) -> bool:
    return True


def informers(
    cache: Cache,
    kube: ObjectClient,
    *,
    version: str,
    cluster_version: str | None,
    namespaces: tuple[str, ...],
    sinks: Mapping[Part, Sink],
    stall: float = STALL_SECONDS,
) -> dict[Part, list[Informer]]:
    """Return the informers of every part, one per resource and watched namespace.

    Claims and IPAddresses keep the objects of our pools only (`bridge.capi.PoolRef.is_ours`;
    a poolRef is immutable). Each pool kind has informers of its own (a Global kind one
    cluster-wide); Clusters have none when they are not served. Not started
    (`Informer.start`).

    Parameters
    ----------
    version:
        The served IPAddressClaim/IPAddress version.
    cluster_version:
        The served Cluster version (None: not served).
    namespaces:
        The watched namespaces (empty: all, one cluster-wide watch per resource).
    sinks:
        What each part's informers tell their events to (`bridge.runtime.informer.Sink`).
    stall:
        Seconds without an event or a bookmark after which a watch is dead and its scope
        is listed again (`bridge.runtime.informer.Informer`).
    """
    resources: dict[Part, list[Resource]] = {
        "addresses": [address_resource(version)],
        "pools": [pool_resource(kind) for kind in capi.POOL_KINDS],
        "clusters": [] if cluster_version is None else [cluster_resource(cluster_version)],
        "claims": [claim_resource(version)],
    }
    made: dict[Part, list[Informer]] = {}
    for part in PARTS:
        store = cache.part(part)
        plan = [
            (resource, namespace, _Scope(resource.kind if part == "pools" else None, namespace))
            for resource in resources[part]
            for namespace in (namespaces or (None,) if resource.namespaced else (None,))
        ]
        store.expect(scope for _, _, scope in plan)  # synced once every list came
        made[part] = [
            Informer(
                resource.plural if namespace is None else f"{resource.plural} in {namespace}",
                list=functools.partial(kube.list_collection, resource, namespace),
                watch=functools.partial(_watch, kube, resource, namespace),
                store=store,
                key=functools.partial(Cache.pool_key_of, kind=resource.kind)
                if part == "pools"
                else Cache.key_of,
                wanted=_ours if part in ("claims", "addresses") else _every,
                sink=sinks[part],
                scope=scope,
                stall=stall,
            )
            for resource, namespace, scope in plan
        ]
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
class _Scope:
    """The keys one informer lists (`bridge.runtime.store.Scope`).

    ``kind``: a pool kind (keys ``(kind, namespace, name)``), None for keys ``(namespace,
    name)``; ``namespace`` None: every namespace.
    """

    kind: str | None
    namespace: str | None

    def __call__(self, key: Key) -> bool:
        if not isinstance(key, tuple):
            return False
        if self.kind is not None:
            if key[:1] != (self.kind,):
                return False
            key = key[1:]
        return self.namespace is None or key[:1] == (self.namespace,)
