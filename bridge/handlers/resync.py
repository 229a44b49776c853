"""The periodic work of the leader: resync of pools, claims and Clusters, quarantine purge.

Tasks on kopf's loop (`resync_forever`, `purge_forever`), started with the work queue
(`bridge.handlers.lifecycle.start_work`) and cancelled with it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from backends.errors import BackendError
from bridge import capi
from bridge.models import IPPool
from bridge.objects.keys import claim_key, cluster_key, pool_key
from bridge.operator import Operator
from bridge.reconcilers.control_plane import wants_endpoint
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pools import purge_quarantined
from bridge.runtime.store import Store

__all__ = ["purge_forever", "resync_forever"]

log = logging.getLogger(__name__)


def _objects(
    part: Store, listed: Callable[[], list[dict[str, Any]] | None]
) -> Iterable[dict[str, Any]]:
    """Return the objects of the cache's ``part``; while it is not trusted, ``listed()``.

    As client-go's resync, which replays the informer's cache (``resyncPeriod`` of
    https://pkg.go.dev/k8s.io/client-go/tools/cache#SharedInformer). A part not synced yet,
    or suspect (a watch ended or stalled, until it is listed again), is listed from the API
    instead (``listed`` returning None: nothing).
    """
    if part.synced and not part.suspected:
        return part.values()
    return listed() or []


def _pools(op: Operator) -> list[IPPool]:
    """Return every pool served, typed (Global ones with the namespace ``""``)."""
    namespaces = op.settings.namespaces
    bodies = _objects(
        op.cache.pools,
        lambda: [b for kind in capi.POOL_KINDS for b in op.kube.list_pools(kind, namespaces)],
    )
    return [IPPool.from_body(body) for body in bodies]


def _queue_pools(op: Operator) -> int:
    pools = _pools(op)
    for pool in pools:
        op.queue.add(pool_key(*pool.key))
    return len(pools)


def _queue_claims(op: Operator) -> int:
    count = 0
    listed = functools.partial(op.kube.list_claims, op.versions.address, op.settings.namespaces)
    for body in _objects(op.cache.claims, listed):
        if not capi.PoolRef.from_spec(body.get("spec") or {}).is_ours:
            continue
        meta = body.get("metadata") or {}
        key = claim_key(str(meta.get("namespace")), str(meta.get("name")))
        op.queue.add(key, background=op.cache.settled(body))
        count += 1
    return count


def _queue_addresses(op: Operator) -> int:
    """Queue the claim of every IPAddress of ours (background lane); return how many.

    As `bridge.handlers.claims.AddressEvents`: the claim of ``spec.claimRef``, whose pass
    releases an IPAddress whose claim is gone (live or being deleted). A claim that exists is
    queued by `_queue_claims` as well (one key, one pass).
    """
    version = op.versions.address
    namespaces: tuple[str | None, ...] = op.settings.namespaces or (None,)
    count = 0
    bodies = _objects(
        op.cache.addresses,
        lambda: [b for ns in namespaces for b in op.kube.list_ip_addresses(version, ns)],
    )
    for body in bodies:
        spec = body.get("spec") or {}
        if not capi.PoolRef.from_spec(spec).is_ours:
            continue
        meta = body.get("metadata") or {}
        name = str((spec.get("claimRef") or {}).get("name") or meta.get("name"))
        op.queue.add(claim_key(str(meta.get("namespace")), name), background=True)
        count += 1
    return count


def _queue_clusters(op: Operator) -> int:
    """Queue every Cluster that asks for a control-plane endpoint (none when not served)."""
    if op.versions.cluster is None:
        return 0
    count = 0
    for body in _objects(op.cache.clusters, lambda: op.kube.list_clusters(op.settings.namespaces)):
        meta = body.get("metadata") or {}
        if wants_endpoint(meta.get("annotations")):
            op.queue.add(cluster_key(str(meta.get("namespace")), str(meta.get("name"))))
            count += 1
    return count


async def resync_forever(op: Operator) -> None:
    """Queue every pool, claim and endpoint Cluster of ours periodically, until cancelled.

    Pools every ``pool_refresh_seconds`` (status: usage, readiness); claims (and the claim of
    every IPAddress of ours: one whose claim is gone is released in that key's pass) and the
    Clusters that ask for a control-plane endpoint every ``resync_seconds`` (0: never; bound
    claims in the work queue's background lane, behind new work). The resync is the safety
    net of level-triggered handling: whatever a reconcile left to a later event, the next
    pass decides again from the objects' state (from the informer cache, `_objects`). A list
    that fails is logged and tried at the next tick.
    """
    loop = asyncio.get_running_loop()
    next_pools = loop.time() + op.settings.pool_refresh_seconds
    resync = op.settings.resync_seconds
    next_claims = loop.time() + resync if resync else None
    while True:
        due = min(t for t in (next_pools, next_claims) if t is not None)
        await asyncio.sleep(max(due - loop.time(), 0.0))
        now = loop.time()
        try:
            if now >= next_pools:
                next_pools = now + op.settings.pool_refresh_seconds
                await asyncio.to_thread(_queue_pools, op)
            if next_claims is not None and now >= next_claims:
                next_claims = now + resync
                count = await asyncio.to_thread(_queue_claims, op)
                addresses = await asyncio.to_thread(_queue_addresses, op)
                clusters = await asyncio.to_thread(_queue_clusters, op)
                log.debug(
                    "resync: %d claims, the claims of %d IPAddresses and %d Clusters queued",
                    count,
                    addresses,
                    clusters,
                )
        except Exception:
            log.exception("periodic resync failed; trying again at the next tick")


#: Every this many purge passes, the pools without a grace period are purged too.
ALL_POOLS_EVERY = 10


def _purge(op: Operator, *, every_pool: bool) -> int:
    """Purge ended quarantines of the pools with a grace period (``every_pool``: of all).

    A pool whose grace period was set back to 0 may still hold quarantined entries: the
    passes over every pool (one in `ALL_POOLS_EVERY`) delete those once their time came.
    Returns the number of entries deleted; a pool that fails is logged and tried at the next
    pass.
    """
    deleted = 0
    for pool in _pools(op):
        if not every_pool and (pool.spec is None or pool.grace_period_seconds <= 0):
            continue
        try:
            deleted += len(purge_quarantined(op.pools, *pool.key))
        except (PoolError, BackendError) as exc:
            log.warning("pool %s %s: quarantine purge failed: %s", pool.kind, pool.name, exc)
    return deleted


async def purge_forever(op: Operator) -> None:
    """Delete the IPAM entries whose quarantine ended, at start and then periodically.

    Runs on the leader only (started with the work queue, `bridge.handlers.lifecycle`), until
    cancelled. The pools with ``addressReuseGracePeriodSeconds`` > 0 are purged at once and
    then every ``IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS`` (default 30; one list request per
    subnet each); every pool is purged one pass in `ALL_POOLS_EVERY` (not at start-up: a
    restart costs no backend call for pools without a grace period).
    """
    passes = 0
    while True:
        passes += 1
        try:
            await asyncio.to_thread(_purge, op, every_pool=passes % ALL_POOLS_EVERY == 0)
        except Exception:
            log.exception("quarantine purge failed; trying again at the next tick")
        await asyncio.sleep(op.settings.quarantine_purge_seconds)
