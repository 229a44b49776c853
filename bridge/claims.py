"""Allocate and release the address of an IPAddressClaim: the core of the operator.

Backend-agnostic: the pool's backend comes from `bridge.pools.backend_for`, the Kubernetes
reads and writes from `bridge.kube`. Each function returns what the handler must write
(the claim's status patch and an event) or raises `ClaimError` / `ClaimPaused`.

The order follows the CAPI IPAM contract (CAPI book, ``contracts/ipam.md``): skip while
paused; (kopf adds the ``ReleaseAddress`` finalizer before any of this runs); allocate in the
IPAM by hostname; create the ``IPAddress``; set ``status.addressRef`` and Ready. Release:
free in the IPAM, then delete the ``IPAddress`` (its finalizer first); kopf then removes the
claim's finalizer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.errors import BackendError
from bridge import capi
from bridge.capi import Claim, Reason
from bridge.context import Context
from bridge.errors import ClaimError, PoolError, claim_error_from
from bridge.pools import BACKEND_NAMES, Pool, backend_for, parse_pool

__all__ = ["ClaimPaused", "Outcome", "description_for", "ensure_address", "release_address"]

log = logging.getLogger(__name__)


class ClaimPaused(Exception):  # noqa: N818 - a state to wait out, not an error
    """The claim or its Cluster is paused: nothing may be allocated or released.

    Parameters
    ----------
    message:
        Why (which object carries the pause).
    delay:
        Seconds before looking again.
    """

    def __init__(self, message: str, *, delay: float) -> None:
        super().__init__(message)
        self.message = message
        self.delay = delay


@dataclass(frozen=True)
class Outcome:
    """What the handler writes after a successful step.

    Attributes
    ----------
    status:
        The claim's status patch (may be empty).
    reason, message:
        The Event to post (reason empty: no event).
    backend_calls:
        True when the step talked to the IPAM (for tests and metrics).
    """

    status: Mapping[str, Any]
    reason: str = ""
    message: str = ""
    backend_calls: bool = False


def description_for(claim: Claim) -> str:
    """Return the provenance text stored with the IPAM entry.

    ``ipam-bridge <namespace>/<claim>`` plus `` cluster <name>`` when known.
    """
    text = f"ipam-bridge {claim.key}"
    if claim.cluster_name:
        text += f" cluster {claim.cluster_name}"
    return text


def _check_paused(ctx: Context, claim: Claim) -> None:
    """Raise `ClaimPaused` (or `ClaimError` for a missing Cluster) when the claim must wait.

    The Cluster comes from ``spec.clusterName`` or the cluster-name label. A claim being
    deleted whose Cluster is gone proceeds, so cluster teardown cannot deadlock (in-cluster
    provider issue #289).
    """
    delay = ctx.settings.requeue_paused_seconds
    if capi.PAUSED_ANNOTATION in claim.annotations:
        raise ClaimPaused(
            f"claim {claim.key} carries the {capi.PAUSED_ANNOTATION} annotation", delay=delay
        )
    if not claim.cluster_name:
        return
    cluster = ctx.kube.get_cluster(claim.namespace, claim.cluster_name)
    if cluster is None:
        if claim.deleting:
            return
        raise ClaimError(
            Reason.ALLOCATION_FAILED,
            f"Cluster {claim.namespace}/{claim.cluster_name} not found; waiting for it",
            delay=ctx.settings.requeue_seconds,
        )
    if capi.is_paused((cluster.get("metadata") or {}).get("annotations"), cluster.get("spec")):
        raise ClaimPaused(f"Cluster {claim.namespace}/{claim.cluster_name} is paused", delay=delay)


def _pool_of(ctx: Context, claim: Claim) -> Pool | None:
    body = ctx.kube.get_pool(claim.namespace, claim.pool_ref.kind, claim.pool_ref.name)
    if body is None:
        return None
    try:
        return parse_pool(body)
    except PoolError as exc:
        raise _not_ready(ctx, exc) from exc


def _not_ready(ctx: Context, exc: PoolError) -> ClaimError:
    delay = (
        ctx.settings.requeue_config_error_seconds
        if exc.needs_person
        else (ctx.settings.requeue_seconds)
    )
    return ClaimError(Reason.POOL_NOT_READY, exc.message, delay=delay)


def _backend_error(ctx: Context, exc: BackendError, pool: Pool) -> ClaimError:
    return claim_error_from(
        exc,
        pool.display,
        retry_seconds=ctx.settings.requeue_seconds,
        config_error_seconds=ctx.settings.requeue_config_error_seconds,
        exhausted_seconds=ctx.settings.requeue_exhausted_seconds,
    )


def _bound(body: Mapping[str, Any], address: Mapping[str, Any], pool_display: str) -> Outcome:
    spec = address.get("spec") or {}
    name = str((address.get("metadata") or {}).get("name"))
    message = f"address {spec.get('address')}/{spec.get('prefix')} from {pool_display}"
    return Outcome(
        status=capi.claim_status(
            body, ready=True, reason=Reason.ALLOCATED, message=message, address_ref=name
        ),
        reason=Reason.ALLOCATED,
        message=message,
    )


def _belongs_to(address: Mapping[str, Any], claim: Claim) -> bool:
    spec = address.get("spec") or {}
    return (
        (spec.get("claimRef") or {}).get("name") == claim.name
        and (spec.get("poolRef") or {}).get("name") == claim.pool_ref.name
        and (spec.get("poolRef") or {}).get("kind") == claim.pool_ref.kind
    )


def _ensure(ctx: Context, body: Mapping[str, Any]) -> Outcome:
    """Do the work of `ensure_address` (without the metrics)."""
    claim = Claim.from_body(body)
    _check_paused(ctx, claim)
    version = ctx.address_version
    pool_display = f"{claim.pool_ref.kind} {claim.namespace}/{claim.pool_ref.name}"

    existing = ctx.kube.get_ip_address(version, claim.namespace, claim.address_ref or claim.name)
    if existing is not None and _belongs_to(existing, claim):
        return _bound(body, existing, pool_display)

    pool = _pool_of(ctx, claim)
    if pool is None:
        raise ClaimError(
            Reason.POOL_NOT_READY, f"{pool_display} not found", delay=ctx.settings.requeue_seconds
        )
    if pool.deleting:
        raise ClaimError(
            Reason.POOL_NOT_READY,
            f"{pool.display} is being deleted",
            delay=ctx.settings.requeue_config_error_seconds,
        )
    if ctx.gate.closed(pool.key):
        raise ClaimError(
            Reason.POOL_EXHAUSTED,
            f"{pool.display} has no free address",
            delay=ctx.settings.requeue_exhausted_seconds,
        )
    try:
        backend = backend_for(ctx, pool)
    except PoolError as exc:
        raise _not_ready(ctx, exc) from exc

    hostname = capi.hostname_for(claim, pool.hostname_suffix)
    try:
        allocation = ctx.metrics.call(
            BACKEND_NAMES[pool.kind],
            "allocate",
            lambda: backend.allocate(hostname, description_for(claim)),
        )
    except BackendError as exc:
        error = _backend_error(ctx, exc, pool)
        if error.reason == Reason.POOL_EXHAUSTED:
            ctx.gate.exhausted(pool.key)
        raise error from exc
    ctx.gate.open(pool.key)

    address = capi.build_ip_address(
        claim,
        version=version,
        pool_uid=pool.uid,
        address=allocation.address,
        prefix=pool.prefix if pool.prefix is not None else allocation.prefix,
        gateway=pool.gateway or allocation.gateway,
        hostname=hostname,
    )
    created = ctx.kube.create_ip_address(version, address)
    if created is None:
        # An IPAddress of that name exists but was not ours above: another pool's or a
        # stale one. Never hand one name to two addresses; a person must look.
        raise ClaimError(
            Reason.ALLOCATION_FAILED,
            f"IPAddress {claim.namespace}/{claim.name} already exists and does not belong "
            f"to this claim and pool; {allocation.address} stays registered as {hostname}",
            delay=ctx.settings.requeue_config_error_seconds,
        )
    outcome = _bound(body, created, pool.display)
    log.info("claim %s: %s (%s)", claim.key, outcome.message, hostname)
    return Outcome(outcome.status, outcome.reason, outcome.message, backend_calls=True)


def ensure_address(ctx: Context, body: Mapping[str, Any]) -> Outcome:
    """Make sure the claim holds an address: allocate it and create its ``IPAddress``.

    Idempotent. A claim whose ``IPAddress`` already exists (bound before a restart, or
    recreated by ``clusterctl move`` without status) is answered from that object with no
    backend call. Otherwise the backend looks the hostname up before it allocates, so a
    crash between the backend write and the ``IPAddress`` create is healed by the retry.
    Counts the attempt in the metrics (allocations by result, claims pending by reason).

    Parameters
    ----------
    ctx:
        The operator context.
    body:
        The claim object as kopf passes it.

    Returns
    -------
    Outcome
        The status patch (``addressRef`` and Ready True) and an ``AddressAllocated`` event.

    Raises
    ------
    ClaimPaused
        The claim or its Cluster is paused.
    ClaimError
        ``PoolNotReady`` (pool missing, invalid, credentials, subnet), ``PoolExhausted``,
        or ``AllocationFailed`` (Cluster missing, IPAM unreachable, name conflict).
    """
    claim_key = _key(body)
    pool = _pool_label(body)
    try:
        outcome = _ensure(ctx, body)
    except ClaimError as error:
        ctx.metrics.pending(claim_key, error.reason)
        ctx.metrics.allocations.labels(*pool, error.reason).inc()
        raise
    ctx.metrics.pending(claim_key, None)
    if outcome.backend_calls:
        ctx.metrics.allocations.labels(*pool, "success").inc()
    return outcome


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _pool_label(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    ref = (body.get("spec") or {}).get("poolRef") or {}
    return f"{meta.get('namespace')}/{ref.get('name')}", str(ref.get("kind"))


def release_address(ctx: Context, body: Mapping[str, Any]) -> Outcome:
    """Free the claim's address in the IPAM and delete its ``IPAddress`` (counted in metrics).

    See `_release` for the semantics; raises what it raises.
    """
    pool = _pool_label(body)
    try:
        outcome = _release(ctx, body)
    except ClaimError as error:
        ctx.metrics.releases.labels(*pool, error.reason).inc()
        raise
    ctx.metrics.pending(_key(body), None)
    ctx.metrics.releases.labels(*pool, "success" if outcome.backend_calls else "skipped").inc()
    return outcome


def _release(ctx: Context, body: Mapping[str, Any]) -> Outcome:
    """Free the claim's address in the IPAM and delete its ``IPAddress``.

    Proceeds when the Cluster is gone; waits while paused. When the pool no longer exists
    the IPAM cannot be reached (its endpoint and credentials went with it): the address is
    left in the IPAM, a warning says so, and the claim is let go. The same happens when a
    bound claim's ``IPAddress`` was removed with its ``ProtectAddress`` finalizer stripped
    (``clusterctl move`` deletes the source objects so): the entry may belong to the moved
    claim now, and must not be freed from here.

    Returns
    -------
    Outcome
        An ``AddressReleased`` event (or a ``ReleaseSkipped`` warning reason when the pool
        is gone or the IPAddress was removed without this operator).

    Raises
    ------
    ClaimPaused
        The claim or its Cluster is paused.
    ClaimError
        The IPAM refused or could not be reached: the claim keeps its finalizer.
    """
    claim = Claim.from_body(body)
    _check_paused(ctx, claim)
    version = ctx.address_version
    address = ctx.kube.get_ip_address(version, claim.namespace, claim.address_ref or claim.name)
    if address is not None and not _belongs_to(address, claim):
        address = None
    spec = (address or {}).get("spec") or {}
    annotations = ((address or {}).get("metadata") or {}).get("annotations") or {}

    if address is None and claim.address_ref:
        # Bound, yet its IPAddress went without us: our ProtectAddress finalizer was stripped.
        # clusterctl move deletes the source's objects that way (kopf may put the claim's
        # finalizer back in between), and the same claim now holds this address in the
        # target management cluster: freeing it here would hand it out twice.
        message = (
            f"IPAddress {claim.namespace}/{claim.address_ref} was removed without this "
            "operator (finalizers stripped, e.g. by clusterctl move); the IPAM entry of "
            f"{claim.key} is left as it is"
        )
        log.warning("claim %s: %s", claim.key, message)
        return Outcome(status={}, reason="ReleaseSkipped", message=message)

    pool = _pool_of(ctx, claim)
    if pool is None:
        if address is not None:
            ctx.kube.delete_ip_address(version, claim.namespace, claim.name)
        message = (
            f"{claim.pool_ref.kind} {claim.namespace}/{claim.pool_ref.name} is gone; "
            f"address {spec.get('address', '(none)')} could not be released in the IPAM"
        )
        log.warning("claim %s: %s", claim.key, message)
        return Outcome(status={}, reason="ReleaseSkipped", message=message)

    hostname = annotations.get(capi.HOSTNAME_ANNOTATION) or capi.hostname_for(
        claim, pool.hostname_suffix
    )
    try:
        backend = backend_for(ctx, pool)
        released = ctx.metrics.call(
            BACKEND_NAMES[pool.kind], "release", lambda: backend.release(hostname)
        )
    except PoolError as exc:
        raise _not_ready(ctx, exc) from exc
    except BackendError as exc:
        raise _backend_error(ctx, exc, pool) from exc
    ctx.gate.open(pool.key)
    if address is not None:
        ctx.kube.delete_ip_address(version, claim.namespace, claim.name)
    what = spec.get("address") or hostname
    message = (
        f"released {what} in {pool.display}"
        if released
        else f"{hostname} was not registered in {pool.display}; nothing to release"
    )
    log.info("claim %s: %s", claim.key, message)
    return Outcome(status={}, reason="AddressReleased", message=message, backend_calls=True)
