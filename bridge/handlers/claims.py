"""kopf handlers of IPAddressClaim: allocate on create/resume, release on delete.

Only claims whose ``spec.poolRef`` names one of our pool kinds in our group are handled
(the filter is in the decorators: other claims get no finalizer, no annotation, nothing).
The resource is versionless: kopf serves the API server's preferred version of the group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from bridge import capi
from bridge.claims import ClaimPaused, Outcome, ensure_address, release_address
from bridge.context import Context
from bridge.errors import ClaimError

__all__ = ["allocate", "claim_is_ours", "release"]


def claim_is_ours(spec: kopf.Spec, **_: Any) -> bool:
    """Filter: the claim's poolRef is one of our pool kinds in ``ipam.cluster.x-k8s.io``."""
    ref = spec.get("poolRef") or {}
    return capi.PoolRef(
        str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
    ).is_ours


def _write_status(body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch) -> None:
    """Patch the claim's status only where it changes.

    A patch that changes nothing leaves the resourceVersion as it is, and kopf then waits
    its consistency timeout (5 s) before it handles the claim's next event: a bound claim
    resumed after a restart must cost no write.
    """
    current = body.get("status") or {}
    changed = {key: value for key, value in status.items() if current.get(key) != value}
    if changed:
        patch.status.update(changed)


def _report(body: kopf.Body, outcome: Outcome, patch: kopf.Patch) -> None:
    before = capi.ready_of(body)
    _write_status(body, outcome.status, patch)
    after = (
        capi.ready_of(
            {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "status": outcome.status,
            }
        )
        if outcome.status
        else before
    )
    if outcome.reason and (after != before or not outcome.status):
        kind = "Warning" if outcome.reason == "ReleaseSkipped" else "Normal"
        kopf.event(body, type=kind, reason=outcome.reason, message=outcome.message)


def _fail(body: kopf.Body, error: ClaimError, patch: kopf.Patch) -> kopf.TemporaryError:
    status = capi.claim_status(body, ready=False, reason=error.reason, message=error.message)
    _write_status(body, status, patch)
    if capi.ready_of(body) != ("False", error.reason):
        kopf.event(body, type="Warning", reason=error.reason, message=error.message)
    return kopf.TemporaryError(error.message, delay=error.delay)


@kopf.on.resume(capi.GROUP, "ipaddressclaims", when=claim_is_ours)
@kopf.on.create(capi.GROUP, "ipaddressclaims", when=claim_is_ours)
def allocate(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Give the claim an address (see `bridge.claims.ensure_address`).

    Notes
    -----
    Returns None on purpose: a returned value would be written to ``status.<handler id>``,
    which CAPI's schema prunes. Failures set Ready False with a reason and retry after the
    error's delay (``kopf.TemporaryError``), never in a tight loop.
    """
    ctx: Context = memo.bridge
    try:
        outcome = ensure_address(ctx, body)
    except ClaimPaused as paused:
        raise kopf.TemporaryError(f"paused: {paused.message}", delay=paused.delay) from paused
    except ClaimError as error:
        raise _fail(body, error, patch) from error
    _report(body, outcome, patch)


@kopf.on.delete(capi.GROUP, "ipaddressclaims", when=claim_is_ours)
def release(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Free the claim's address (see `bridge.claims.release_address`).

    kopf removes the claim's ``ReleaseAddress`` finalizer once this returns.
    """
    ctx: Context = memo.bridge
    try:
        outcome = release_address(ctx, body)
    except ClaimPaused as paused:
        raise kopf.TemporaryError(f"paused: {paused.message}", delay=paused.delay) from paused
    except ClaimError as error:
        raise _fail(body, error, patch) from error
    _report(body, outcome, patch)
