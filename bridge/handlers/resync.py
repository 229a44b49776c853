"""The work of the leader beside its queue: the replay at the start, resync, quarantine purge.

Tasks on kopf's loop (`resync_forever`, which starts with `replay`, and `purge_forever`),
started with the work queue (`bridge.handlers.lifecycle.start_work`) and cancelled with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from backends.errors import BackendError
from bridge import capi
from bridge.models import IPPool
from bridge.objects.keys import claim_key, cluster_key, pool_key
from bridge.operator import Operator
from bridge.reconcilers.control_plane import ENDPOINT_LABEL, wants_endpoint
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pools import purge_quarantined
from bridge.runtime.store import Store

__all__ = ["purge_forever", "replay", "resync_forever"]

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


def _queue_endpoint_clusters(op: Operator) -> int:
    """Queue the Cluster of every stored control-plane endpoint claim (`ENDPOINT_LABEL`)."""
    if op.versions.cluster is None:
        return 0
    count = 0
    for body in op.cache.claims.values():
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        cluster = labels.get(capi.CLUSTER_NAME_LABEL)
        if labels.get(ENDPOINT_LABEL) == "true" and cluster:
            op.queue.add(cluster_key(str(meta.get("namespace") or ""), str(cluster)))
            count += 1
    return count


def replay(op: Operator) -> dict[str, int]:
    """Queue every pool, claim and endpoint Cluster the stores hold, once; return the counts.

    What a new leader does first, on a queue that accepts keys from now on
    (`bridge.runtime.workqueue.WorkQueue.lead`): a standby's sinks queued nothing, so the
    work is what the stores hold now, as client-go's informer replays its store to the
    handlers a controller registers once it starts (controller-runtime starts its
    controllers only after the election). Bound claims and the claims of stored IPAddresses
    go to the background lane. A part not listed yet is listed from the API (`_objects`);
    its informer's first list queues it again anyway.

    Returns
    -------
    dict[str, int]
        Keys queued by kind: ``pools``, ``claims``, ``owners`` (claims of IPAddresses),
        ``clusters``.
    """
    return {
        "pools": _queue_pools(op),
        "claims": _queue_claims(op),
        "owners": _queue_addresses(op),
        "clusters": _queue_clusters(op) + _queue_endpoint_clusters(op),
    }


async def resync_forever(op: Operator) -> None:
    """Queue every pool, claim and endpoint Cluster of ours periodically, until cancelled.

    Pools every ``pool_refresh_seconds`` (status: usage, readiness); claims (and the claim of
    every IPAddress of ours: one whose claim is gone is released in that key's pass) and the
    Clusters that ask for a control-plane endpoint every ``resync_seconds`` (0: never; bound
    claims in the work queue's background lane, behind new work). The resync is the safety
    net of level-triggered handling: whatever a reconcile left to a later event, the next
    pass decides again from the objects' state (from the informer cache, `_objects`). A list
    that fails is logged and tried at the next tick. It starts with the `replay` of the stores.
    """
    try:
        counts = await asyncio.to_thread(replay, op)
        log.info("queued what the stores hold: %s", counts)
    except Exception:
        log.exception("replay of the stores failed; the next resync queues them")
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


def _purge(op: Operator, *, every_pool: bool, stop: threading.Event | None = None) -> int:
    """Purge ended quarantines of the pools with a grace period (``every_pool``: of all).

    A pool whose grace period was set back to 0 may still hold quarantined entries: the
    passes over every pool (one in `ALL_POOLS_EVERY`) delete those once their time came.
    Returns the number of entries deleted; a pool that fails is logged and tried at the next
    pass. ``stop`` set: the pass ends before its next pool.
    """
    deleted = 0
    for pool in _pools(op):
        if stop is not None and stop.is_set():
            break
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

    Each pass runs in a thread of its own (``ipam-bridge-purge``). Cancelled, a running pass
    ends before its next pool and the task ends once its thread has (a clean stop waits for
    it before the Lease is released: `bridge.runtime.leader.Leadership.close`).
    """
    passes = 0
    stop = threading.Event()
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="ipam-bridge-purge"
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            passes += 1
            every_pool = passes % ALL_POOLS_EVERY == 0
            purge = functools.partial(_purge, op, every_pool=every_pool, stop=stop)
            try:
                await loop.run_in_executor(executor, purge)
            except Exception:
                log.exception("quarantine purge failed; trying again at the next tick")
            await asyncio.sleep(op.settings.quarantine_purge_seconds)
    finally:
        stop.set()
        await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
