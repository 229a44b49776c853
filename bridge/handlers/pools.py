"""The sink of the pools' informers: it queues pools and wakes their claims.

`bridge.reconcilers.pools.reconcile_pool` checks a pool against its IPAM, writes its status
and guards its deletion; the periodic refresh is `bridge.handlers.resync`. Global pools are
cluster-scoped: their informers watch them cluster-wide even when ``IPAM_BRIDGE_NAMESPACE``
limits the namespaces, and their work-queue keys carry the namespace ``""``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.models import IPPool
from bridge.objects.keys import pool_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.pools import needs_check
from bridge.runtime.informer import Event, Listed
from bridge.runtime.store import Relisted

__all__ = ["PoolEvents"]


class PoolEvents:
    """The pools' informers' sink (`bridge.runtime.informer.Sink`), in their threads.

    A pool is queued when it needs a reconcile (`needs_check`: every pool a list shows; an
    event only for a new pool, a changed spec or a deletion, so that the pool's own status
    writes do not loop). The claims waiting for it are woken once its current spec was
    checked (Ready True, or False for ``observedGeneration`` = ``generation``: they then
    show why they wait) and when it is gone. The store has the pool first, so a woken claim
    reads what was seen.

    Parameters
    ----------
    op:
        The operator (its work queue).
    """

    def __init__(self, op: Operator) -> None:
        self._op = op

    def _seen(self, body: Mapping[str, Any], *, listing: bool, gone: bool = False) -> None:
        """Queue the pool when it needs it; wake its claims (always when ``gone``)."""
        pool = IPPool.from_body(body)
        namespace, kind, name = pool.key
        if gone or needs_check(pool, listing=listing):
            self._op.queue.add(pool_key(namespace, kind, name))
        ready = pool.ready[0]
        checked = pool.observed_generation == pool.generation
        if gone or ready == "True" or (ready == "False" and checked):
            self._op.queue.wake(pool_token(namespace, kind, name))

    def listed(self, listed: Listed) -> None:
        """Queue every listed pool."""
        for _, body in listed.items:
            self._seen(body, listing=True)

    def relisted(self, relisted: Relisted) -> None:
        """Queue the pools a later list found gone or changed, and wake their claims.

        A changed pool wakes its claims as a gone one does: what they wait for may have
        come and gone while the watch did not tell.
        """
        for _, body in [*relisted.gone, *relisted.changed]:
            self._seen(body, listing=True, gone=True)

    def event(self, event: Event) -> None:
        """Queue and wake for one watch event."""
        self._seen(event.body, gone=event.type == "DELETED", listing=False)
