"""Feed `bridge.cache` from the watches kopf runs: pools, Clusters and our IPAddresses.

One event handler per resource puts every object kopf sees (its initial listing, additions,
changes) into the operator's cache and drops deleted ones. Claims are fed by
`bridge.handlers.claims.claim_event`, which also decides whether the event needs a
reconcile. The cache's initial list comes from the start-up handler (`bridge.cache.prime`).

This module is imported before the other handler modules, so that its handlers run first for
each event (kopf runs a resource's event handlers in registration order): a reconcile
queued by another handler of the same event (a pool turning Ready wakes its claims) sees the
cache updated.
"""

from __future__ import annotations

from typing import Any

import kopf

from bridge import capi
from bridge.cache import ObjectCache
from bridge.context import Context

__all__ = ["address_is_ours", "cache_event"]


def address_is_ours(spec: kopf.Spec, **_: Any) -> bool:
    """Filter: the IPAddress's ``spec.poolRef`` names one of our pool kinds."""
    ref = spec.get("poolRef") or {}
    return capi.PoolRef(
        str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
    ).is_ours


async def cache_event(
    type: str | None, body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any
) -> None:
    """Put an IPAddress, pool or Cluster as seen into the cache; drop it when deleted."""
    ctx: Context | None = memo.get("bridge")
    if ctx is None:
        return
    key: tuple[str, ...] = ctx.cache.key_of(body)
    part: ObjectCache
    if resource.plural == "ipaddresses":
        part = ctx.cache.addresses
    elif resource.plural == "clusters":
        part = ctx.cache.clusters
    else:
        part, key = ctx.cache.pools, (str(body.get("kind")), *key)
    part.apply(key, body, deleted=type == "DELETED")


kopf.on.event(capi.GROUP, "ipaddresses", id="cache", when=address_is_ours)(cache_event)
for _plural in capi.POOL_KINDS.values():
    kopf.on.event(capi.GROUP, "v1alpha1", _plural, id="cache")(cache_event)
kopf.on.event(capi.CLUSTER_GROUP, "clusters", id="cache")(cache_event)
