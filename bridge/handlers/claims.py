"""kopf handlers of IPAddressClaim and Cluster: they only queue keys (see `workqueue`).

kopf watches; `claims.reconcile_claim` decides from the claim's current state. Using
``kopf.on.event`` only, kopf keeps no bookkeeping on claims (no finalizer of its own, no
last-handled-configuration or progress annotations): a claim that is not ours is never
written to, and a claim recreated by ``clusterctl move`` with copied metadata is handled like
any other. Claims of other providers (`bridge.capi.PoolRef.is_ours`) are left at the door:
never cached, queued or written to.
"""

from __future__ import annotations

from typing import Any

import kopf

from bridge import capi
from bridge.handlers.cache import cache_event, claim_seen
from bridge.objects.keys import claim_key, cluster_key, cluster_token
from bridge.operator import Operator
from bridge.reconcilers import control_plane as endpoints

__all__ = ["claim_event", "cluster_event"]


@kopf.on.event(capi.GROUP, "ipaddressclaims")
async def claim_event(
    type: str | None,
    body: kopf.Body,
    meta: kopf.Meta,
    spec: kopf.Spec,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Queue the claim: any sight of it (start-up listing, change, deletion) is a reconcile.

    The claim goes into the operator's cache (`bridge.objects.cache`) first; an event that
    tells the cache nothing new queues nothing: the echo of our own write, already written
    through, and the deletion of a claim the cache no longer holds (a release removed its
    last finalizer, and the API server's answer to that write took it out of the cache),
    unless the claim is parked in the work queue (the pass it gets ends the wait).

    A Cluster's control-plane endpoint claim (`control_plane.ENDPOINT_LABEL`) also queues
    its Cluster: bound, it gives the Cluster its endpoint; waiting, the Cluster says why;
    deleted, the Cluster gets a new one.
    """
    # Checked here, not by a kopf when= filter, which would cost every event of ours a
    # second call with kopf's keyword arguments built anew.
    if not capi.PoolRef.from_spec(spec).is_ours:
        return  # another provider's claim: never cached, queued or written to
    op: Operator = memo.bridge
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    claim_seen(op, type)  # a listing after a watch restart relists the cache
    key = claim_key(namespace, name)
    changed = op.cache.claims.apply((namespace, name), body, deleted=type == "DELETED")
    if changed or type is None or (type == "DELETED" and op.queue.is_parked(key)):
        # A bound claim seen by a listing (start-up, watch restart) waits behind new work.
        settled = type is None and op.cache.settled(body)
        op.queue.add(key, background=settled)
    labels = meta.get("labels") or {}
    cluster = labels.get(capi.CLUSTER_NAME_LABEL)
    if labels.get(endpoints.ENDPOINT_LABEL) == "true" and cluster:
        op.queue.add(cluster_key(namespace, str(cluster)))


@kopf.on.event(capi.CLUSTER_GROUP, "clusters")
async def cluster_event(
    type: str | None,
    body: kopf.Body,
    meta: kopf.Meta,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Wake the claims waiting for this Cluster when it is not paused (or is gone).

    Claims of a paused or missing Cluster are parked in the work queue under the Cluster's
    wake token; an unpause, a creation or a deletion ends their wait without any polling.
    A Cluster asking for a control-plane endpoint (`control_plane.POOL_ANNOTATION`) is
    queued (`bridge.reconcilers.control_plane.reconcile_cluster`), paused or not. The
    Cluster goes into the operator's cache first (`bridge.handlers.cache.cache_event`).
    """
    await cache_event(type, body, resource, memo)
    op: Operator = memo.bridge
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    if type == "DELETED" or not capi.is_paused(meta.get("annotations"), body.get("spec")):
        op.queue.wake(cluster_token(namespace, name))
    if endpoints.wants_endpoint(meta.get("annotations")):
        op.queue.add(cluster_key(namespace, name))
