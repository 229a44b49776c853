"""kopf handlers of our pools: they feed the cache and queue keys.

`bridge.reconcilers.pools.reconcile_pool` checks a pool against its IPAM, writes its status and
guards its deletion. A pool event queues the pool only when its state calls for it
(`bridge.reconcilers.pools.needs_check`: found at start-up, new or moved without status, spec
changed, being deleted), so the pool's own status writes do not loop. A Ready pool wakes
the claims waiting for it; the periodic refresh is `bridge.handlers.resync`.

Global pools (``GlobalPHPIPAMIPPool``, ``GlobalInfobloxIPPool``) are cluster-scoped: kopf
watches them cluster-wide even when ``IPAM_BRIDGE_NAMESPACE`` limits the namespaces, and
their work-queue keys carry the namespace ``""``.
"""

from __future__ import annotations

from typing import Any

import kopf

from bridge import capi
from bridge.handlers.cache import cache_event
from bridge.models import IPPool
from bridge.objects.keys import pool_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.pools import needs_check

__all__ = ["pool_event"]


async def pool_event(
    type: str | None,
    body: kopf.Body,
    meta: kopf.Meta,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Queue the pool when it needs a reconcile; wake its waiting claims when it was checked.

    The claims waiting for a pool are woken by its events once its current spec was checked
    (Ready True, or False for ``observedGeneration`` = ``generation``: they then show why
    they wait) and when it is deleted. The pool goes into the operator's cache first
    (`bridge.handlers.cache.cache_event`), so a woken claim reads what the event shows.
    """
    await cache_event(type, body, resource, memo)
    op: Operator = memo.bridge
    pool = IPPool.from_body(body)
    namespace, kind, name = pool.key
    if type == "DELETED" or needs_check(pool, listing=type is None):
        op.queue.add(pool_key(namespace, kind, name))
    ready = pool.ready[0]
    checked = pool.observed_generation == pool.generation
    if type == "DELETED" or ready == "True" or (ready == "False" and checked):
        op.queue.wake(pool_token(namespace, kind, name))


for _plural in capi.POOL_KINDS.values():
    kopf.on.event(capi.GROUP, "v1alpha1", _plural, id="pool")(pool_event)
