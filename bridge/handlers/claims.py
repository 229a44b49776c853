"""The sinks of the informers of claims, IPAddresses and Clusters: they only queue keys.

An informer (`bridge.runtime.informer`) applies each event to the operator's cache in its
own thread, then tells its sink here, which queues a reconcile only for what needs one. The
echo of our own write (`bridge.runtime.expectations.Expectations.observed`) queues nothing:
it wakes the pass that waits for it.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Any

from bridge import capi
from bridge.objects.keys import ClaimKey, claim_key, cluster_key, cluster_token
from bridge.operator import Operator
from bridge.reconcilers import control_plane as endpoints
from bridge.runtime.informer import Event, Listed
from bridge.runtime.store import Relisted, version_of

__all__ = ["AddressEvents", "ClaimEvents", "ClusterEvents"]


def _queue_cluster(op: Operator, body: Mapping[str, Any]) -> None:
    """Queue the Cluster of a control-plane endpoint claim (nothing for another claim)."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    cluster = labels.get(capi.CLUSTER_NAME_LABEL)
    if labels.get(endpoints.ENDPOINT_LABEL) == "true" and cluster:
        op.queue.add(cluster_key(str(meta.get("namespace") or ""), str(cluster)))


def _names(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _key_of(body: Mapping[str, Any]) -> ClaimKey:
    return claim_key(*_names(body))


def _observed(op: Operator, plural: str, event: Event) -> tuple[Hashable, bool]:
    """Tell the expectations of an event; return its key there and whether it was ours.

    Our echo, or a deletion, meets the expectation: the pass parked on it is woken.
    """
    key = (plural, *_names(event.body))
    deleted = event.type == "DELETED"
    ours = op.cache.expectations.observed(key, version_of(event.body), deleted=deleted)
    if ours or deleted:
        op.queue.wake(op.cache.expectations.token(key))
    return key, ours


def _relisted(op: Operator, plural: str, relisted: Relisted) -> None:
    """Tell the expectations what a relist found: versions listed, objects gone."""
    for _, body in relisted.changed:
        op.cache.expectations.observed((plural, *_names(body)), version_of(body))
    for _, body in relisted.gone:
        key = (plural, *_names(body))
        op.cache.expectations.observed(key, "", deleted=True)
        op.queue.wake(op.cache.expectations.token(key))


class ClaimEvents:
    """The claims informer's sink (`bridge.runtime.informer.Sink`): what queues a reconcile.

    Called in the informer's thread. Any sight of a claim by a list queues it (a bound one
    seen by the first list in the background lane); a watch event queues it when it told the
    store something new and is not the echo of our own write (asked once the pass that wrote
    it has ended: `bridge.runtime.workqueue.WorkQueue.add`'s ``unless``), or when it is the
    deletion of a parked claim (its pass ends the wait).

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
            _queue_cluster(op, body)

    def relisted(self, relisted: Relisted) -> None:
        """Queue the claims a later list found gone or changed."""
        _relisted(self._op, "ipaddressclaims", relisted)
        for _, body in [*relisted.gone, *relisted.changed]:
            self._op.queue.add(_key_of(body))
            _queue_cluster(self._op, body)

    def event(self, event: Event) -> None:
        """Queue the claim of an event that changed the store, unless it is our echo."""
        op = self._op
        key = _key_of(event.body)
        expected, ours = _observed(op, "ipaddressclaims", event)
        if not ours and event.changed:
            op.queue.add(
                key,
                unless=functools.partial(
                    op.cache.expectations.ours,
                    expected,
                    version_of(event.body),
                    deleted=event.type == "DELETED",
                ),
            )
        elif event.type == "DELETED" and op.queue.is_parked(key):
            op.queue.add(key)
        _queue_cluster(op, event.body)


def _claim_of_address(body: Mapping[str, Any]) -> ClaimKey:
    """Return the key of the claim an IPAddress names (``spec.claimRef``, else its own name)."""
    namespace, name = _names(body)
    ref = (body.get("spec") or {}).get("claimRef") or {}
    return claim_key(namespace, str(ref.get("name") or name))


class AddressEvents:
    """The IPAddresses informer's sink: each event queues the claim of ``spec.claimRef``.

    controller-runtime's ``Owns()`` (an owned object's event queues its owner), with the
    owner found by ``spec.claimRef`` (the garbage collector may have dropped the claim from
    the owner references, real-cluster.md 13f): the claim's pass decides, and releases an
    IPAddress of ours whose claim is gone (`bridge.reconcilers.claims`). The informer keeps
    only IPAddresses of our pools. The echo of our own write queues nothing, as for claims
    (`ClaimEvents.event`), and wakes the pass waiting for it. The first list queues the claim
    of every IPAddress (in the background lane: a bound claim's key is queued by its own list
    too), so a start-up finds the IPAddresses whose claim went while no leader ran; a later
    list queues the claim of each IPAddress gone or changed meanwhile. Called in the
    informer's thread.
    """

    def __init__(self, op: Operator) -> None:
        self._op = op

    def listed(self, listed: Listed) -> None:
        """Queue the claim of every listed IPAddress, in the background lane."""
        for _, body in listed.items:
            self._op.queue.add(_claim_of_address(body), background=True)

    def relisted(self, relisted: Relisted) -> None:
        """Queue the claims of the IPAddresses gone or changed."""
        _relisted(self._op, "ipaddresses", relisted)
        for _, body in [*relisted.gone, *relisted.changed]:
            self._op.queue.add(_claim_of_address(body))

    def event(self, event: Event) -> None:
        """Queue the claim of an event that changed the store, unless it is our echo."""
        op = self._op
        expected, ours = _observed(op, "ipaddresses", event)
        if ours or not event.changed:
            return
        op.queue.add(
            _claim_of_address(event.body),
            unless=functools.partial(
                op.cache.expectations.ours,
                expected,
                version_of(event.body),
                deleted=event.type == "DELETED",
            ),
        )


class ClusterEvents:
    """The Clusters informer's sink: wakes the claims waiting for a Cluster, queues endpoints.

    Claims of a paused or missing Cluster are parked in the work queue under the Cluster's
    wake token; a sight of the Cluster not paused (listed, created, changed) or gone ends
    their wait without any polling. A Cluster asking for a control-plane endpoint
    (`control_plane.POOL_ANNOTATION`) is queued
    (`bridge.reconcilers.control_plane.reconcile_cluster`), paused or not. Called in the
    informer's thread.
    """

    def __init__(self, op: Operator) -> None:
        self._op = op

    def _seen(self, body: Mapping[str, Any], gone: bool) -> None:
        namespace, name = _names(body)
        meta = body.get("metadata") or {}
        if gone or not capi.is_paused(meta.get("annotations"), body.get("spec")):
            self._op.queue.wake(cluster_token(namespace, name))
        if endpoints.wants_endpoint(meta.get("annotations")):
            self._op.queue.add(cluster_key(namespace, name))

    def listed(self, listed: Listed) -> None:
        """Wake and queue as for an event of each listed Cluster."""
        for _, body in listed.items:
            self._seen(body, gone=False)

    def relisted(self, relisted: Relisted) -> None:
        """Wake and queue for each Cluster a later list found gone or changed."""
        for _, body in relisted.gone:
            self._seen(body, gone=True)
        for _, body in relisted.changed:
            self._seen(body, gone=False)

    def event(self, event: Event) -> None:
        """Wake and queue for one watch event."""
        self._seen(event.body, gone=event.type == "DELETED")
