"""kopf handlers of our pools, and the periodic pool refresher.

Pools are checked when created, changed, or found at start-up, and then every
``IPAM_BRIDGE_POOL_REFRESH_SECONDS`` by one refresher task (a kopf timer or daemon would
put kopf's finalizer, which is the claims' ``ReleaseAddress``, on every pool). The refresher
also lets a deleted pool go once no IPAddress references it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client import ApiException

from bridge import capi
from bridge.context import Context
from bridge.errors import PoolReason
from bridge.pools import PoolOutcome, reconcile_pool

__all__ = ["check", "deleted", "refresh_pools", "refresh_pools_forever"]

log = logging.getLogger(__name__)


def _post(body: Mapping[str, Any], outcome: PoolOutcome) -> None:
    if outcome.changed:
        kopf.event(
            kopf.Body(cast(kopf.RawBody, dict(body))),
            type="Normal" if outcome.ready else "Warning",
            reason=outcome.reason,
            message=outcome.message,
        )


def _apply(ctx: Context, body: Mapping[str, Any], outcome: PoolOutcome) -> None:
    meta = body.get("metadata") or {}
    if outcome.status:
        ctx.kube.patch_pool_status(
            meta["namespace"], str(body["kind"]), meta["name"], outcome.status
        )
    ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, outcome.protect)
    if outcome.changed:
        # Not kopf.event: outside a handler kopf has no event queue (LookupError).
        ctx.kube.post_event(
            body,
            type="Normal" if outcome.ready else "Warning",
            reason=outcome.reason,
            message=outcome.message,
        )


def check(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Check the pool against its IPAM; write status, finalizer, and an event on change.

    Raises ``kopf.TemporaryError`` while the pool is not Ready, after the short delay for
    transient causes or the long one for causes a person must fix.
    """
    ctx: Context = memo.bridge
    outcome = reconcile_pool(ctx, body)
    patch.status.update(outcome.status)
    ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, outcome.protect)
    _post(body, outcome)
    if not outcome.ready and outcome.protect:
        transient = outcome.reason in (PoolReason.BACKEND_UNAVAILABLE, PoolReason.DELETION_BLOCKED)
        delay = (
            ctx.settings.requeue_seconds if transient else ctx.settings.requeue_config_error_seconds
        )
        raise kopf.TemporaryError(outcome.message, delay=delay)


def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Let a pool being deleted go at once if no IPAddress references it."""
    ctx: Context = memo.bridge
    _apply(ctx, body, reconcile_pool(ctx, body))


def _deleting(meta: kopf.Meta, **_: Any) -> bool:
    return bool(meta.get("deletionTimestamp"))


for _plural in capi.POOL_KINDS.values():
    kopf.on.resume(capi.GROUP, "v1alpha1", _plural, id="check")(check)
    kopf.on.create(capi.GROUP, "v1alpha1", _plural, id="check")(check)
    kopf.on.update(capi.GROUP, "v1alpha1", _plural, id="check")(check)
    kopf.on.event(capi.GROUP, "v1alpha1", _plural, id="deletion", when=_deleting)(deleted)


def refresh_pools(ctx: Context) -> int:
    """Check every pool in scope once and write its status; return how many were checked."""
    count = 0
    for kind in capi.POOL_KINDS:
        for body in ctx.kube.list_pools(kind, ctx.settings.namespaces):
            try:
                _apply(ctx, body, reconcile_pool(ctx, body))
            except Exception:  # one pool must never stop the refresh of the others
                log.exception(
                    "pool %s/%s: refresh failed",
                    body["metadata"].get("namespace"),
                    body["metadata"].get("name"),
                )
            count += 1
    return count


async def refresh_pools_forever(ctx: Context) -> None:
    """Run `refresh_pools` every ``pool_refresh_seconds`` until cancelled (by clean-up)."""
    while True:
        await asyncio.sleep(ctx.settings.pool_refresh_seconds)
        try:
            await asyncio.to_thread(refresh_pools, ctx)
        except ApiException as exc:
            log.warning("pool refresh failed: %s %s", exc.status, exc.reason)
        except Exception:
            log.exception("pool refresh failed")
