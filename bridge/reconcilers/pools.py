"""Pools, the service: Secrets, backend clients, the IPAM check, and the deletion guard.

`bridge.reconcilers.pool_backends` parses and computes; this module does the I/O around it through
`bridge.runtime.gateway` and the pool's backend:

- `backend_for`: reads the pool's Secret(s) and returns its cached backend client;
- `check_pool`: asks the IPAM about the pool's subnets and returns the Ready status;
- `reconcile_pool`: what one pool needs now (the work queue calls it for every pool event
  that needs it and for the periodic refresh): status, the ``ProtectPool`` finalizer on the
  pool, the ``credentials-in-use`` finalizer on the Secrets it reads, and, while it is being
  deleted, whether anything may still hold an entry in it;
- `purge_quarantined`: deletes the pool's IPAM entries whose reuse grace period ended.

Global pools (cluster-scoped, namespace ``""``) read their Secrets in the namespaces their
``credentialsRef``/``tls.caSecretRef`` name, and their users are the claims and IPAddresses
of every watched namespace.

Credentials outlive the claims that need them (DESIGN.md section 6): a namespace deletion
removes Secrets, pools and claims in no order, so a Secret that a pool reads carries
``ipam.cluster.x-k8s.io/credentials-in-use`` while such a pool exists; the pool keeps it until
its last claim is released, then both go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client import ApiException

from backends.base import IPAMBackend
from backends.errors import BackendError
from bridge import capi
from bridge.capi import Reason
from bridge.reconcilers.context import Context, pool_key, pool_token
from bridge.reconcilers.errors import PoolError, pool_error_from, retry_delay
from bridge.reconcilers.pool_backends import (
    BACKEND_NAMES,
    Pool,
    build_backend,
    fingerprint,
    location_of,
    parse_pool,
    pool_conditions,
    pool_failed_status,
    pool_status,
)
from bridge.runtime.gateway import Outcome
from bridge.runtime.workqueue import Decision

__all__ = [
    "CREDENTIALS_FINALIZER",
    "SECRETS_ANNOTATION",
    "backend_for",
    "check_pool",
    "needs_check",
    "purge_quarantined",
    "reconcile_pool",
    "users_of",
]

log = logging.getLogger(__name__)

#: Finalizer on a Secret that a pool reads (DESIGN.md section 6).
CREDENTIALS_FINALIZER = "ipam.cluster.x-k8s.io/credentials-in-use"
#: Annotation on a pool naming (comma-separated) the Secrets it put `CREDENTIALS_FINALIZER`
#: on: a Secret it stopped reading, or the Secrets of a pool whose spec no longer parses, are
#: still let go. ``<name>`` for a Secret of the pool's own namespace, ``<namespace>/<name>``
#: for another (Global pools). Our bookkeeping on our own object; copied by
#: ``clusterctl move`` like the Secrets' finalizers it describes.
SECRETS_ANNOTATION = "ipam-bridge.io/secrets-in-use"


def backend_for(ctx: Context, pool: Pool, *, reuse: bool = False) -> IPAMBackend:
    """Return the pool's backend client, built from its Secret(s) or taken from the cache.

    Reads the credentials Secret (and the CA Secret when ``spec.tls.caSecretRef`` is set)
    on every call, so a fixed Secret takes effect at once: in the pool's own namespace, or
    for a Global pool in the namespace its reference names. A Secret being deleted is still
    read (it is kept by `CREDENTIALS_FINALIZER` for releases).

    With ``reuse`` (claims: allocations and releases) a client already built from this very
    pool spec is returned without reading any Secret: Secrets are not watched (that would
    need list/watch on every Secret), so the pool's check (`check_pool`, at every pool change
    and every ``IPAM_BRIDGE_POOL_REFRESH_SECONDS``) is what reads them and rebuilds the
    client when they changed. Without such a client the Secrets are read as above.

    Parameters
    ----------
    ctx:
        The operator context.
    pool:
        The pool (possibly with a recorded location, `pool_backends.with_location`): the cache
        key includes its spec, so another location gets its own client.

    Raises
    ------
    PoolError
        ``CredentialsNotFound`` when a Secret or one of its keys is missing; ``InvalidSpec``
        when the client refuses the configuration.
    """
    key = (*pool.key, location_of(pool))
    if reuse and (cached := ctx.backends.reuse(key, pool.spec)) is not None:
        return cached
    secret_namespace = pool.secret_namespace or pool.namespace
    secret = ctx.kube.read_secret(secret_namespace, pool.credentials_secret)
    if secret is None:
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {secret_namespace}/{pool.credentials_secret} not found",
            needs_person=True,
        )
    ca_pem: str | None = None
    if pool.tls.ca_secret_name and not pool.tls.insecure_skip_verify:
        ca_namespace = pool.tls.ca_secret_namespace or pool.namespace
        ca = ctx.kube.read_secret(ca_namespace, pool.tls.ca_secret_name)
        ca_pem = (ca or {}).get(pool.tls.ca_secret_key)
        if not ca_pem:
            raise PoolError(
                Reason.CREDENTIALS_NOT_FOUND,
                f"CA bundle: Secret {ca_namespace}/{pool.tls.ca_secret_name} or its key "
                f"{pool.tls.ca_secret_key!r} not found",
                needs_person=True,
            )
    return ctx.backends.get(
        key,
        fingerprint(pool, secret, ca_pem),
        lambda: build_backend(
            pool,
            secret,
            ca_pem,
            timeout_seconds=ctx.settings.backend_timeout_seconds,
            retry=ctx.settings.retry_policy(),
            endpoints=ctx.flow,
        ),
        spec=pool.spec,
    )


def check_pool(ctx: Context, pool: Pool, body: Mapping[str, Any]) -> dict[str, Any]:
    """Check a pool against its IPAM and return its Ready status.

    Returns
    -------
    dict
        The full status (`pool_backends.pool_status`: per subnet and summed; Ready True
        ``PoolReady``; conditions of other types kept).

    Raises
    ------
    PoolError
        With the reason to show: ``InvalidSpec``, ``CredentialsNotFound``,
        ``AuthenticationFailed``, ``SubnetNotFound``, ``TLSVerificationFailed`` or
        ``BackendUnavailable``.
    """
    backend = backend_for(ctx, pool)
    try:
        infos = ctx.metrics.call(
            BACKEND_NAMES[pool.kind], "describe_subnets", backend.describe_subnets
        )
    except BackendError as exc:
        raise pool_error_from(exc, pool.display) from exc
    free = sum(info.free for info in infos)
    ctx.metrics.pool_free.labels(f"{pool.namespace}/{pool.name}", pool.kind).set(free)
    total = sum(info.total for info in infos)
    ctx.metrics.pool_total.labels(f"{pool.namespace}/{pool.name}", pool.kind).set(total)
    if free > 0:
        ctx.flow.refilled(pool.key)
    previous = (body.get("status") or {}).get("conditions") or []
    return pool_status(pool, infos, previous)


def users_of(ctx: Context, namespace: str, kind: str, name: str) -> list[str]:
    """Return what may still hold an entry in a pool: its claims and IPAddresses (sorted).

    A claim counts while it carries the ``ReleaseAddress`` finalizer (added before anything
    is allocated, removed after the release), so a claim between its IPAM write and its
    IPAddress create, or one whose IPAddress could not be created, keeps the pool. An
    IPAddress counts while it exists. A Global pool (``namespace`` ``""``) is used from
    every watched namespace (``IPAM_BRIDGE_NAMESPACE``, all when empty).

    Returns
    -------
    list of str
        ``IPAddressClaim <name>`` and ``IPAddress <name>`` entries (``<namespace>/<name>``
        for a Global pool).
    """
    version = ctx.address_version
    found: set[str] = set()
    if namespace:
        claims = ctx.kube.list_claims(version, (namespace,))
        addresses = ctx.kube.list_ip_addresses(version, namespace)
    else:
        watched = ctx.settings.namespaces
        claims = ctx.kube.list_claims(version, watched)
        addresses = [
            item for ns in watched or (None,) for item in ctx.kube.list_ip_addresses(version, ns)
        ]

    def shown(meta: Mapping[str, Any]) -> str:
        return (
            f"{meta.get('namespace')}/{meta.get('name')}"
            if not namespace
            else str(meta.get("name"))
        )

    for claim in claims:
        ref = (claim.get("spec") or {}).get("poolRef") or {}
        meta = claim.get("metadata") or {}
        if (
            ref.get("kind") == kind
            and ref.get("name") == name
            and capi.CLAIM_FINALIZER in (meta.get("finalizers") or [])
        ):
            found.add(f"IPAddressClaim {shown(meta)}")
    for address in addresses:
        ref = (address.get("spec") or {}).get("poolRef") or {}
        if ref.get("kind") == kind and ref.get("name") == name:
            found.add(f"IPAddress {shown(address.get('metadata') or {})}")
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


#: A Secret by ``(namespace, name)``.
SecretId = tuple[str, str]


def _recorded_secrets(body: Mapping[str, Any]) -> set[SecretId]:
    """Return the ``(namespace, name)`` of the Secrets a pool's `SECRETS_ANNOTATION` names."""
    meta = body.get("metadata") or {}
    own = str(meta.get("namespace") or "")
    raw = str((meta.get("annotations") or {}).get(SECRETS_ANNOTATION, ""))
    refs: set[SecretId] = set()
    for entry in raw.split(","):
        namespace, _, name = entry.rpartition("/")
        if name and (namespace or own):
            refs.add((namespace or own, name))
    return refs


def _annotation(refs: set[SecretId], own: str) -> str:
    """Return the `SECRETS_ANNOTATION` value naming ``refs`` (short names in ``own``)."""
    return ",".join(sorted(name if ns == own else f"{ns}/{name}" for ns, name in refs))


def _secrets_of(body: Mapping[str, Any]) -> set[SecretId]:
    """Return the Secrets a pool object reads (or, when its spec is unreadable, protected)."""
    try:
        return set(parse_pool(body).secret_refs)
    except PoolError:
        return _recorded_secrets(body)  # unreadable spec: keep what it held


def _read_by_pools(ctx: Context, namespace: str, *, besides: tuple[str, str, str]) -> set[str]:
    """Return the Secrets of ``namespace`` that pools read, but pool ``(namespace, kind, name)``.

    The namespaced pools of ``namespace`` and every Global pool may read them.
    """
    read: set[str] = set()
    for kind in capi.POOL_KINDS:
        is_global = kind in capi.GLOBAL_POOL_KINDS
        for other in ctx.kube.list_pools(kind, () if is_global else (namespace,)):
            other.setdefault("kind", kind)
            meta = other.get("metadata") or {}
            key = ("" if is_global else str(meta.get("namespace") or ""), kind, meta.get("name"))
            if key == besides:
                continue
            read.update(name for ns, name in _secrets_of(other) if ns == namespace)
    return read


def _free_secrets(ctx: Context, refs: set[SecretId], besides: tuple[str, str, str]) -> None:
    """Remove `CREDENTIALS_FINALIZER` from the Secrets ``refs`` that no pool but ``besides`` reads.

    Takes `Context.namespace_lock` of each Secret's namespace.
    """
    for namespace in sorted({ns for ns, _ in refs}):
        names = {name for ns, name in refs if ns == namespace}
        with ctx.namespace_lock(namespace):
            for name in sorted(names - _read_by_pools(ctx, namespace, besides=besides)):
                ctx.kube.set_secret_finalizer(namespace, name, CREDENTIALS_FINALIZER, False)


def _keep_secrets(ctx: Context, body: Mapping[str, Any], pool: Pool) -> None:
    """Protect the Secrets the pool reads; let go of those it read before and no longer does.

    The pool's `SECRETS_ANNOTATION` names every Secret it put `CREDENTIALS_FINALIZER` on; it
    is widened before a Secret is protected (so none is ever protected unremembered) and
    narrowed after a Secret it stopped reading (``credentialsRef`` changed) was let go.
    """
    wanted, recorded = set(pool.secret_refs), _recorded_secrets(body)
    if not wanted <= recorded:
        ctx.kube.annotate_pool(
            body, SECRETS_ANNOTATION, _annotation(wanted | recorded, pool.namespace)
        )
    for namespace, name in pool.secret_refs:
        ctx.kube.set_secret_finalizer(namespace, name, CREDENTIALS_FINALIZER, True)
    stale = recorded - wanted
    if stale:
        _free_secrets(ctx, stale, besides=pool.key)
        ctx.kube.annotate_pool(body, SECRETS_ANNOTATION, _annotation(wanted, pool.namespace))


#: The condition type the pool's check owns (`bridge.capi.ready_condition`).
READY = "Ready"

#: Re-reads of a pool whose status write met 409 Conflict before the write is left to the
#: next check (each re-read means another writer just wrote; a handful never all lose).
STATUS_ATTEMPTS = 5


def _status_patch(current: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """Return what of ``status`` differs from ``current``'s status, Ready merged in.

    Fields are taken as they are; from ``status["conditions"]`` only the Ready condition is
    ours: when it differs from ``current``'s, ``conditions`` is ``current``'s list with Ready
    replaced (`pool_backends.pool_conditions`), every other type (``InSync``) kept.
    """
    now = current.get("status") or {}
    patch = {k: v for k, v in status.items() if k != "conditions" and now.get(k) != v}
    ready = next(c for c in status["conditions"] if c.get("type") == READY)
    previous = now.get("conditions") or []
    if next((c for c in previous if c.get("type") == READY), None) != ready:
        patch["conditions"] = pool_conditions(previous, ready)
    return patch


def _write(
    ctx: Context,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    ready: bool,
    reason: str,
    message: str,
) -> None:
    """Write the pool's status where it changed; post an Event when Ready changes.

    One writer per condition: the pool's check owns ``Ready`` and the status fields
    (usage, subnets, ``observedGeneration``), the drift audit owns ``InSync``
    (`audit`). Fields are merge-patched as they are (nobody else writes them). The
    conditions list is replaced whole by a merge patch, so when Ready changed it is written
    merged into the list as read, guarded by that resourceVersion; on 409 Conflict (the audit
    wrote in between, after seconds of IPAM calls) the pool is read again and Ready merged
    into what it holds now. A resourceVersion guard with a re-read, rather than server-side
    apply with a field manager per writer: the guard is plain optimistic concurrency every
    API server and the in-memory one (`mock_kubernetes`) serve, while apply would first have
    to take over the conditions that merge patches of earlier versions own (managed
    fields, https://kubernetes.io/docs/reference/using-api/server-side-apply/#conflicts).
    """
    meta = body.get("metadata") or {}
    namespace, kind, name = str(meta.get("namespace") or ""), str(body["kind"]), meta["name"]
    current: Mapping[str, Any] = body
    for _ in range(STATUS_ATTEMPTS):
        patch = _status_patch(current, status)
        if not patch:
            break
        version = (current.get("metadata") or {}).get("resourceVersion")
        guard = str(version) if "conditions" in patch and version else None
        try:
            ctx.kube.patch_pool_status(namespace, kind, name, patch, resource_version=guard)
            break
        except ApiException as exc:
            if exc.status != 409:
                raise
        reread = ctx.kube.get_pool(namespace, kind, name)
        if reread is None:
            return
        current = reread
    else:
        log.info("pool %s/%s: status not written (it kept changing)", namespace, name)
    if capi.ready_of(body) != ("True" if ready else "False", reason):
        log.log(logging.INFO if ready else logging.WARNING, "pool %s: %s", reason, message)
        ctx.event(body, "Normal" if ready else "Warning", reason, message)


def reconcile_pool(ctx: Context, namespace: str, kind: str, name: str) -> Decision:
    """Decide and do what one pool needs now (called by the work queue).

    A live pool: ``ProtectPool`` and the Secrets' `CREDENTIALS_FINALIZER` are ensured, the
    pool is checked against its IPAM, the status written where it changed (an Event when
    Ready changes), and when Ready the claims waiting for it are woken. A pool being deleted
    keeps ``ProtectPool`` while `users_of` finds anything, or a claim is about to hold it
    (``ctx.holds``, between its look at the pool and its finalizer write): ``DeletionBlocked``
    naming them;
    then the finalizer goes, the Secrets are let go when no other pool reads them, and its
    backend client is closed.

    Returns
    -------
    Decision
        Retry after `errors.retry_delay` of the failure's reason while not Ready or
        blocked; done otherwise (the periodic refresh queues every pool again).

    ``namespace`` is ``""`` for a Global pool.

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found" (the queue logs and retries).
    """
    body = ctx.kube.get_pool(namespace, kind, name)
    if body is None:
        ctx.backends.drop((namespace, kind, name))
        ctx.flow.refilled((namespace, kind, name))  # forgotten: the pool is gone
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
        outcome = ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, True).outcome
        if outcome is Outcome.CONFLICT:
            return Decision.retry(1.0)  # changed since read: its watch event queues it too
        if outcome is Outcome.GONE:
            return Decision.done()
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


#: How soon a pool being deleted looks again while the cache does not show its deletion yet,
#: or while a claim is about to hold it (``ctx.holds``).
CACHE_LAG_SECONDS = 0.5


def _reconcile_deleting(ctx: Context, body: Mapping[str, Any], pool: Pool | None) -> Decision:
    """Keep a pool being deleted while anything may hold an entry in it; else let it go."""
    meta = body.get("metadata") or {}
    kind, name = str(body["kind"]), str(meta["name"])
    namespace = capi.pool_namespace(kind, str(meta.get("namespace") or ""))
    ctx.wake(pool_token(namespace, kind, name))  # its waiting claims learn it is going
    cached = ctx.cache.pools.get((kind, namespace, name))
    if cached is not None and not (cached.get("metadata") or {}).get("deletionTimestamp"):
        # Claims decide from the cache: until it shows the deletion, a claim may still see
        # the pool live and register in it. Its watch event queues the pool again.
        return Decision.retry(CACHE_LAG_SECONDS)
    pending = ctx.holds.of((namespace, kind, name))
    users = users_of(ctx, namespace, kind, name) + [f"IPAddressClaim {key}" for key in pending]
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        error = PoolError(
            Reason.DELETION_BLOCKED,
            f"pool is being deleted but {len(users)} object(s) may still hold an address in "
            f"it: {shown}; it goes once their claims are released",
            needs_person=False,
        )
        _write_failure(ctx, body, error)
        if pending:  # claims in flight settle within moments: look again soon
            return Decision.retry(CACHE_LAG_SECONDS)
        # Each release queues the pool again; this retry is only the safety net.
        return Decision.retry(ctx.settings.requeue_config_error_seconds)
    held = _recorded_secrets(body) | set(pool.secret_refs if pool is not None else ())
    # Under the namespace locks (see Context.namespace_lock): two pools reading one Secret,
    # deleted at once, must not each see the other and both keep its finalizer.
    _free_secrets(ctx, held, besides=(namespace, kind, name))
    if ctx.kube.set_pool_finalizer(body, capi.POOL_FINALIZER, False).outcome is Outcome.CONFLICT:
        return Decision.retry(1.0)  # changed since read: decided again from what it is now
    ctx.backends.drop((namespace, kind, name))
    ctx.flow.refilled((namespace, kind, name))
    ctx.metrics.forget_pool(f"{namespace}/{name}", kind)
    log.info("pool %s/%s: nothing holds an address in it any more; let go", namespace, name)
    return Decision.done()


def purge_quarantined(ctx: Context, namespace: str, kind: str, name: str) -> list[str]:
    """Delete a pool's IPAM entries whose reuse grace period ended (DESIGN.md section 6).

    Run by the leader for every pool at start-up, then every
    ``IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS`` for the pools with
    ``addressReuseGracePeriodSeconds`` > 0 (`bridge.handlers.pools.purge_forever`). The
    quarantine mark lives in the IPAM (`backends.base.quarantine_mark`), so nothing here
    depends on memory: a restart or a new leader purges what is due. When entries were
    deleted, one claim waiting for an address in the pool is woken.

    Returns
    -------
    list of str
        The addresses deleted (empty when the pool is gone, not parseable, being deleted,
        or nothing was due).

    Raises
    ------
    PoolError
        When the pool's backend cannot be built (Secret missing...).
    backends.errors.BackendError
        When the IPAM call fails (the caller logs it and tries at the next pass).
    """
    body = ctx.kube.get_pool(namespace, kind, name)
    if body is None:
        return []
    body.setdefault("kind", kind)
    try:
        pool = parse_pool(body)
    except PoolError:
        return []
    if pool.deleting:
        return []
    backend = backend_for(ctx, pool)
    purged = ctx.metrics.call(
        BACKEND_NAMES[pool.kind],
        "purge_quarantined",
        lambda: backend.purge_quarantined(time.time()),
    )
    if purged:
        log.info(
            "pool %s: quarantine ended for %s; entries deleted", pool.display, ", ".join(purged)
        )
        ctx.flow.refilled(pool.key)
        ctx.wake(pool_token(pool.namespace, pool.kind, pool.name), count=1)
        ctx.enqueue(pool_key(pool.namespace, pool.kind, pool.name))
    return list(purged)
