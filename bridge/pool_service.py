"""Pools, the service: Secrets, backend clients, the IPAM check, and the deletion guard.

`bridge.pools` parses and computes; this module does the I/O around it through
`bridge.kube` and the pool's backend:

- `backend_for`: reads the pool's Secret(s) and returns its cached backend client;
- `check_pool`: asks the IPAM about the pool's subnet and returns the Ready status;
- `reconcile_pool`: what one pool needs now (the work queue calls it for every pool event
  that needs it and for the periodic refresh): status, the ``ProtectPool`` finalizer on the
  pool, the ``credentials-in-use`` finalizer on the Secrets it reads, and, while it is being
  deleted, whether anything may still hold an entry in it.

Credentials outlive the claims that need them (DESIGN.md section 6): a namespace deletion
removes Secrets, pools and claims in no order, so a Secret that a pool reads carries
``ipam.cluster.x-k8s.io/credentials-in-use`` while such a pool exists; the pool keeps it until
its last claim is released, then both go.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from backends.base import IPAMBackend
from backends.errors import BackendError
from bridge import capi
from bridge.capi import Reason
from bridge.context import Context, pool_token
from bridge.errors import PoolError, pool_error_from, retry_delay
from bridge.pools import (
    BACKEND_NAMES,
    Pool,
    build_backend,
    fingerprint,
    location_of,
    parse_pool,
    pool_failed_status,
    pool_status,
)
from bridge.workqueue import Decision

__all__ = [
    "CREDENTIALS_FINALIZER",
    "SECRETS_ANNOTATION",
    "backend_for",
    "check_pool",
    "needs_check",
    "reconcile_pool",
    "users_of",
]

log = logging.getLogger(__name__)

#: Finalizer on a Secret that a pool reads (DESIGN.md section 6).
CREDENTIALS_FINALIZER = "ipam.cluster.x-k8s.io/credentials-in-use"
#: Annotation on a pool naming (comma-separated) the Secrets it put `CREDENTIALS_FINALIZER`
#: on: a Secret it stopped reading, or the Secrets of a pool whose spec no longer parses, are
#: still let go. Our bookkeeping on our own object; copied by ``clusterctl move`` like the
#: Secrets' finalizers it describes.
SECRETS_ANNOTATION = "ipam-bridge.io/secrets-in-use"


def backend_for(ctx: Context, pool: Pool) -> IPAMBackend:
    """Return the pool's backend client, built from its Secret(s) or taken from the cache.

    Reads the credentials Secret (and the CA Secret when ``spec.tls.caSecretRef`` is set)
    from the pool's own namespace on every call, so a fixed Secret takes effect at once. A
    Secret being deleted is still read (it is kept by `CREDENTIALS_FINALIZER` for releases).

    Parameters
    ----------
    ctx:
        The operator context.
    pool:
        The pool (possibly with a recorded location, `bridge.pools.with_location`): the cache
        key includes its spec, so another location gets its own client.

    Raises
    ------
    PoolError
        ``CredentialsNotFound`` when a Secret or one of its keys is missing; ``InvalidSpec``
        when the client refuses the configuration.
    """
    secret = ctx.kube.read_secret(pool.namespace, pool.credentials_secret)
    if secret is None:
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {pool.namespace}/{pool.credentials_secret} not found",
            needs_person=True,
        )
    ca_pem: str | None = None
    if pool.tls.ca_secret_name and not pool.tls.insecure_skip_verify:
        ca = ctx.kube.read_secret(pool.namespace, pool.tls.ca_secret_name)
        ca_pem = (ca or {}).get(pool.tls.ca_secret_key)
        if not ca_pem:
            raise PoolError(
                Reason.CREDENTIALS_NOT_FOUND,
                f"CA bundle: Secret {pool.namespace}/{pool.tls.ca_secret_name} or its key "
                f"{pool.tls.ca_secret_key!r} not found",
                needs_person=True,
            )
    return ctx.backends.get(
        (*pool.key, location_of(pool)),
        fingerprint(pool, secret, ca_pem),
        lambda: build_backend(
            pool,
            secret,
            ca_pem,
            timeout_seconds=ctx.settings.backend_timeout_seconds,
            retry=ctx.settings.retry_policy(),
            endpoints=ctx.endpoints,
        ),
    )


def check_pool(ctx: Context, pool: Pool, body: Mapping[str, Any]) -> dict[str, Any]:
    """Check a pool against its IPAM and return its Ready status.

    Returns
    -------
    dict
        The full status (subnet, prefix, gateway, usage, Ready True ``PoolReady``).

    Raises
    ------
    PoolError
        With the reason to show: ``InvalidSpec``, ``CredentialsNotFound``,
        ``AuthenticationFailed``, ``SubnetNotFound``, ``TLSVerificationFailed`` or
        ``BackendUnavailable``.
    """
    backend = backend_for(ctx, pool)
    try:
        info = ctx.metrics.call(
            BACKEND_NAMES[pool.kind], "describe_subnet", backend.describe_subnet
        )
    except BackendError as exc:
        raise pool_error_from(exc, pool.display) from exc
    ctx.metrics.pool_free.labels(f"{pool.namespace}/{pool.name}", pool.kind).set(info.free)
    if info.free > 0:
        ctx.gate.open(pool.key)
    previous = (body.get("status") or {}).get("conditions") or []
    return pool_status(pool, info, previous)


def users_of(ctx: Context, namespace: str, kind: str, name: str) -> list[str]:
    """Return what may still hold an entry in a pool: its claims and IPAddresses (sorted).

    A claim counts while it carries the ``ReleaseAddress`` finalizer (added before anything
    is allocated, removed after the release), so a claim between its IPAM write and its
    IPAddress create, or one whose IPAddress could not be created, keeps the pool. An
    IPAddress counts while it exists.

    Returns
    -------
    list of str
        ``IPAddressClaim <name>`` and ``IPAddress <name>`` entries.
    """
    version = ctx.address_version
    found: set[str] = set()
    for claim in ctx.kube.list_claims(version, (namespace,)):
        ref = (claim.get("spec") or {}).get("poolRef") or {}
        meta = claim.get("metadata") or {}
        if (
            ref.get("kind") == kind
            and ref.get("name") == name
            and capi.CLAIM_FINALIZER in (meta.get("finalizers") or [])
        ):
            found.add(f"IPAddressClaim {meta.get('name')}")
    for address in ctx.kube.list_ip_addresses(version, namespace):
        ref = (address.get("spec") or {}).get("poolRef") or {}
        if ref.get("kind") == kind and ref.get("name") == name:
            found.add(f"IPAddress {(address.get('metadata') or {}).get('name')}")
    return sorted(found)


def needs_check(body: Mapping[str, Any], *, listing: bool) -> bool:
    """Return True when a pool event calls for a reconcile (not our own status write).

    A pool needs one when it is found at start-up (``listing``), is being deleted, has no
    Ready condition yet (new, or recreated by ``clusterctl move`` without status), or its
    spec changed since the last check (``status.observedGeneration`` behind
    ``metadata.generation``). Otherwise the periodic refresh keeps its status current.
    """
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    if listing or meta.get("deletionTimestamp"):
        return True
    if capi.ready_of(body) == (None, None):
        return True
    return bool(status.get("observedGeneration") != meta.get("generation"))


def _recorded_secrets(body: Mapping[str, Any]) -> set[str]:
    """Return the Secrets a pool's `SECRETS_ANNOTATION` says it protects."""
    raw = str(((body.get("metadata") or {}).get("annotations") or {}).get(SECRETS_ANNOTATION, ""))
    return {name for name in raw.split(",") if name}


def _read_by_pools(ctx: Context, namespace: str, *, besides: tuple[str, str]) -> set[str]:
    """Return the Secrets that the pools of a namespace read, but pool ``(kind, name)``."""
    read: set[str] = set()
    for kind in capi.POOL_KINDS:
        for other in ctx.kube.list_pools(kind, (namespace,)):
            if (kind, (other.get("metadata") or {}).get("name")) == besides:
                continue
            try:
                read.update(parse_pool(other).secrets)
            except PoolError:
                read.update(_recorded_secrets(other))  # unreadable spec: keep what it held
    return read


def _free_secrets(ctx: Context, namespace: str, names: set[str], besides: tuple[str, str]) -> None:
    """Remove `CREDENTIALS_FINALIZER` from ``names`` that no pool but ``besides`` reads.

    Call with `Context.namespace_lock` held.
    """
    if not names:
        return
    for name in sorted(names - _read_by_pools(ctx, namespace, besides=besides)):
        ctx.kube.set_secret_finalizer(namespace, name, CREDENTIALS_FINALIZER, False)


def _keep_secrets(ctx: Context, body: Mapping[str, Any], pool: Pool) -> None:
    """Protect the Secrets the pool reads; let go of those it read before and no longer does.

    The pool's `SECRETS_ANNOTATION` names every Secret it put `CREDENTIALS_FINALIZER` on; it
    is widened before a Secret is protected (so none is ever protected unremembered) and
    narrowed after a Secret it stopped reading (``credentialsRef`` changed) was let go.
    """
    wanted, recorded = set(pool.secrets), _recorded_secrets(body)
    if not wanted <= recorded:
        ctx.kube.annotate_pool(body, SECRETS_ANNOTATION, ",".join(sorted(wanted | recorded)))
    for name in pool.secrets:
        ctx.kube.set_secret_finalizer(pool.namespace, name, CREDENTIALS_FINALIZER, True)
    stale = recorded - wanted
    if stale:
        with ctx.namespace_lock(pool.namespace):
            _free_secrets(ctx, pool.namespace, stale, besides=(pool.kind, pool.name))
        ctx.kube.annotate_pool(body, SECRETS_ANNOTATION, ",".join(sorted(wanted)))


def _write(
    ctx: Context,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    ready: bool,
    reason: str,
    message: str,
) -> None:
    """Write the pool's status where it changed; post an Event when Ready changes."""
    meta = body.get("metadata") or {}
    current = body.get("status") or {}
    changed = {k: v for k, v in status.items() if current.get(k) != v}
    if changed:
        ctx.kube.patch_pool_status(meta["namespace"], str(body["kind"]), meta["name"], changed)
    if capi.ready_of(body) != ("True" if ready else "False", reason):
        log.log(logging.INFO if ready else logging.WARNING, "pool %s: %s", reason, message)
        ctx.event(body, "Normal" if ready else "Warning", reason, message)


def reconcile_pool(ctx: Context, namespace: str, kind: str, name: str) -> Decision:
    """Decide and do what one pool needs now (called by the work queue).

    A live pool: ``ProtectPool`` and the Secrets' `CREDENTIALS_FINALIZER` are ensured, the
    pool is checked against its IPAM, the status written where it changed (an Event when
    Ready changes), and when Ready the claims waiting for it are woken. A pool being deleted
    keeps ``ProtectPool`` while `users_of` finds anything (``DeletionBlocked`` naming them);
    then the finalizer goes, the Secrets are let go when no other pool reads them, and its
    backend client is closed.

    Returns
    -------
    Decision
        Retry after `bridge.errors.retry_delay` of the failure's reason while not Ready or
        blocked; done otherwise (the periodic refresh queues every pool again).

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found" (the queue logs and retries).
    """
    body = ctx.kube.get_pool(namespace, kind, name)
    if body is None:
        ctx.backends.drop((namespace, kind, name))
        ctx.metrics.forget_pool(f"{namespace}/{name}", kind)
        ctx.wake(pool_token(namespace, kind, name))
        return Decision.done()
    body.setdefault("kind", kind)
    meta = body.get("metadata") or {}
    pool: Pool | None = None
    error: PoolError | None = None
    try:
        pool = parse_pool(body)
    except PoolError as exc:
        error = exc

    if meta.get("deletionTimestamp"):
        return _reconcile_deleting(ctx, body, pool)

    if capi.POOL_FINALIZER not in (meta.get("finalizers") or []):
        ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, True)
    try:
        if pool is None:
            raise error or PoolError(Reason.INVALID_SPEC, "invalid spec", needs_person=True)
        _keep_secrets(ctx, body, pool)
        status = check_pool(ctx, pool, body)
    except PoolError as failure:
        if capi.ready_of(body) != ("False", failure.reason):
            # A new failure: claims that waited for the pool's check learn what it found.
            ctx.wake(pool_token(namespace, kind, name))
        _write_failure(ctx, body, failure)
        return Decision.retry(retry_delay(ctx.settings, failure.reason))
    condition = status["conditions"][0]
    was_ready = capi.ready_of(body)[0] == "True"
    _write(ctx, body, status, ready=True, reason=condition["reason"], message=condition["message"])
    token = pool_token(namespace, kind, name)
    if not was_ready:
        ctx.wake(token)  # the claims that waited for the pool to turn Ready
    elif status["ipAddresses"]["free"] > 0:
        ctx.wake(token, count=1)  # a claim waiting for an address tries; success wakes the next
    if ctx.waiting(token):
        # Claims wait for an address: look again soon (one IPAM request per pool, not one
        # per claim), until they are served.
        return Decision.retry(retry_delay(ctx.settings, Reason.POOL_EXHAUSTED))
    return Decision.done()


def _write_failure(ctx: Context, body: Mapping[str, Any], error: PoolError) -> None:
    """Write Ready False with the error's reason and message (see `_write`)."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    previous = (body.get("status") or {}).get("conditions") or []
    status = pool_failed_status(generation, error, previous)
    _write(ctx, body, status, ready=False, reason=error.reason, message=error.message)


def _reconcile_deleting(ctx: Context, body: Mapping[str, Any], pool: Pool | None) -> Decision:
    """Keep a pool being deleted while anything may hold an entry in it; else let it go."""
    meta = body.get("metadata") or {}
    namespace, kind, name = str(meta["namespace"]), str(body["kind"]), str(meta["name"])
    ctx.wake(pool_token(namespace, kind, name))  # its waiting claims learn it is going
    users = users_of(ctx, namespace, kind, name)
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        error = PoolError(
            Reason.DELETION_BLOCKED,
            f"pool is being deleted but {len(users)} object(s) may still hold an address in "
            f"it: {shown}; it goes once their claims are released",
            needs_person=False,
        )
        _write_failure(ctx, body, error)
        # Each release queues the pool again; this retry is only the safety net.
        return Decision.retry(ctx.settings.requeue_config_error_seconds)
    held = _recorded_secrets(body) | set(pool.secrets if pool is not None else ())
    with ctx.namespace_lock(namespace):  # see Context.namespace_lock
        _free_secrets(ctx, namespace, held, besides=(kind, name))
        ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, False)
    ctx.backends.drop((namespace, kind, name))
    ctx.metrics.forget_pool(f"{namespace}/{name}", kind)
    log.info("pool %s/%s: nothing holds an address in it any more; let go", namespace, name)
    return Decision.done()
