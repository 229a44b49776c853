"""kopf handlers of our pools, and the periodic refresh: they only queue keys.

`bridge.pool_service.reconcile_pool` checks a pool against its IPAM, writes its status and
guards its deletion. A pool event queues the pool only when its state calls for it
(`bridge.pool_service.needs_check`: found at start-up, new or moved without status, spec
changed, being deleted), so the pool's own status writes do not loop. Every
``IPAM_BRIDGE_POOL_REFRESH_SECONDS`` all pools are queued (usage, readiness). A Ready pool
wakes the claims waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from bridge import capi
from bridge.context import Context, claim_key, pool_key, pool_token
from bridge.pool_service import needs_check

__all__ = ["pool_event", "resync_forever"]

log = logging.getLogger(__name__)


async def pool_event(
    type: str | None, body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> None:
    """Queue the pool when it needs a reconcile; wake its waiting claims when it is Ready."""
    ctx: Context = memo.bridge
    namespace, name, kind = str(meta.get("namespace")), str(meta.get("name")), str(body["kind"])
    if type == "DELETED" or needs_check(body, listing=type is None):
        ctx.enqueue(pool_key(namespace, kind, name))
    if type == "DELETED" or capi.ready_of(body)[0] == "True":
        ctx.wake(pool_token(namespace, kind, name))


for _plural in capi.POOL_KINDS.values():
    kopf.on.event(capi.GROUP, "v1alpha1", _plural, id="pool")(pool_event)


def _queue_pools(ctx: Context) -> int:
    count = 0
    for kind in capi.POOL_KINDS:
        for body in ctx.kube.list_pools(kind, ctx.settings.namespaces):
            meta = body.get("metadata") or {}
            ctx.enqueue(pool_key(str(meta.get("namespace")), kind, str(meta.get("name"))))
            count += 1
    return count


def _queue_claims(ctx: Context) -> int:
    count = 0
    for body in ctx.kube.list_claims(ctx.address_version, ctx.settings.namespaces):
        ref = (body.get("spec") or {}).get("poolRef") or {}
        if not capi.PoolRef(
            str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
        ).is_ours:
            continue
        meta = body.get("metadata") or {}
        ctx.enqueue(claim_key(str(meta.get("namespace")), str(meta.get("name"))))
        count += 1
    return count


async def resync_forever(ctx: Context) -> None:
    """Queue every pool and every claim of ours periodically, until cancelled by the clean-up.

    Pools every ``pool_refresh_seconds`` (status: usage, readiness), claims every
    ``resync_seconds`` (0: never). The resync is the safety net of level-triggered handling:
    whatever an event missed, the next pass decides again from the objects' state. A list
    that fails is logged and tried at the next tick.
    """
    loop = asyncio.get_running_loop()
    next_pools = loop.time() + ctx.settings.pool_refresh_seconds
    resync = ctx.settings.resync_seconds
    next_claims = loop.time() + resync if resync else None
    while True:
        due = min(t for t in (next_pools, next_claims) if t is not None)
        await asyncio.sleep(max(due - loop.time(), 0.0))
        now = loop.time()
        try:
            if now >= next_pools:
                next_pools = now + ctx.settings.pool_refresh_seconds
                await asyncio.to_thread(_queue_pools, ctx)
            if next_claims is not None and now >= next_claims:
                next_claims = now + resync
                count = await asyncio.to_thread(_queue_claims, ctx)
                log.debug("resync: %d claims queued", count)
        except Exception:
            log.exception("periodic resync failed; trying again at the next tick")
