"""Events of IPAddressClaims (their informer) and Clusters (kopf): they only queue keys.

Claims are watched by an informer of the runtime (`bridge.runtime.informer`, built by
`bridge.objects.cache.informers`), not by kopf: the informer applies each event to the
operator's cache in its own thread, and `ClaimEvents` queues a reconcile only for an event
that told the cache something new, so the echoes of our own writes cost the event loop
nothing. `claims.reconcile_claim` decides from the claim's current state. Claims of other
providers (`bridge.capi.PoolRef.is_ours`) are left at the door: never cached, queued or
written to. Clusters are watched by kopf (``kopf.on.event`` only: kopf keeps no
bookkeeping on them).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import kopf

from bridge import capi
from bridge.handlers.cache import cache_event, queue_relisted
from bridge.objects.keys import ClaimKey, claim_key, cluster_key, cluster_token
from bridge.operator import Operator
from bridge.reconcilers import control_plane as endpoints
from bridge.runtime.cache import Relisted
from bridge.runtime.informer import Event, Listed

__all__ = ["AddressEvents", "ClaimEvents", "cluster_event"]


def _endpoint_cluster(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return ``(namespace, Cluster)`` of a control-plane endpoint claim, else None."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    cluster = labels.get(capi.CLUSTER_NAME_LABEL)
    if labels.get(endpoints.ENDPOINT_LABEL) == "true" and cluster:
        return str(meta.get("namespace") or ""), str(cluster)
    return None


class ClaimEvents:
    """The claims informer's sink (`bridge.runtime.informer.Sink`): what queues a reconcile.

    Called in the informer's thread (the work queue is thread-safe). Any sight of a claim
    by a list queues it; a watch event queues it when it told the cache something new, or
    when it is the deletion of a claim parked in the work queue (its pass ends the wait). A
    bound claim seen by the first list waits in the work queue's background lane, behind
    new work.

    The echo of our own write tells the cache nothing new, except when it arrives before
    the write's answer was written through: then the claim is queued unless the version
    turns out to be ours (`bridge.runtime.cache.ObjectCache.is_own`), or the deletion our
    own last finalizer removal made (`bridge.runtime.cache.ObjectCache.deleted_by_us`),
    asked once the pass that wrote it has ended (`bridge.runtime.workqueue.WorkQueue.add`'s
    ``unless``).

    A Cluster's control-plane endpoint claim (`control_plane.ENDPOINT_LABEL`) also queues
    its Cluster at each event: bound, it gives the Cluster its endpoint; waiting, the
    Cluster says why; deleted, the Cluster gets a new one.

    Parameters
    ----------
    op:
        The operator (its cache and work queue).
    """

    def __init__(self, op: Operator) -> None:
        self._op = op

    def listed(self, listed: Listed) -> None:
        """Queue every listed claim (a bound one in the background lane)."""
        op = self._op
        for _, body in listed.items:
            op.queue.add(_key_of(body), background=op.cache.settled(body))
            if (cluster := _endpoint_cluster(body)) is not None:
                op.queue.add(cluster_key(*cluster))

    def relisted(self, relisted: Relisted) -> None:
        """Queue the claims a later list found gone or changed."""
        queue_relisted(self._op, "claims", relisted)
        for _, body in relisted.changed:
            if (cluster := _endpoint_cluster(body)) is not None:
                self._op.queue.add(cluster_key(*cluster))

    def event(self, event: Event) -> None:
        """Queue the claim of an event that changed the cache, or of a parked claim's deletion."""
        op = self._op
        key = _key_of(event.body)
        if event.type == "DELETED":
            if event.changed:  # not if our own write deleted it (the pass that wrote is done)
                gone = functools.partial(op.cache.claims.deleted_by_us, event.key)
                op.queue.add(key, unless=gone)
            elif op.queue.is_parked(key):
                op.queue.add(key)
        elif event.changed:
            version = str((event.body.get("metadata") or {}).get("resourceVersion") or "")
            op.queue.add(key, unless=functools.partial(op.cache.claims.is_own, event.key, version))
        if (cluster := _endpoint_cluster(event.body)) is not None:
            op.queue.add(cluster_key(*cluster))


def _key_of(body: Mapping[str, Any]) -> ClaimKey:
    meta = body.get("metadata") or {}
    return claim_key(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class AddressEvents:
    """The IPAddresses informer's sink: a later list queues the claims of what it changed.

    The informer keeps our IPAddresses in the cache; their watch events queue nothing (a
    claim's reconcile reads its IPAddress from the cache when it runs). A list after a
    watch restart queues the claim of each IPAddress gone or changed meanwhile
    (`bridge.handlers.cache.queue_relisted`). Called in the informer's thread.
    """

    def __init__(self, op: Operator) -> None:
        self._op = op

    def listed(self, listed: Listed) -> None:
        """Nothing to queue: claims are queued by their own list."""

    def relisted(self, relisted: Relisted) -> None:
        """Queue the claims of the IPAddresses gone or changed."""
        queue_relisted(self._op, "addresses", relisted)

    def event(self, event: Event) -> None:
        """Nothing to queue (the cache has the event)."""


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
