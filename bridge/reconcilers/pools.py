"""Pools, the service: Secrets, backend clients, the IPAM check, and the deletion guard.

`bridge.reconcilers.pool_backends` parses and computes; this module does the I/O around it through
`bridge.runtime.gateway` and the pool's backend:

- `bridge.reconcilers.backend_clients.PoolClients.backend_for`: the pool's backend client;
- `check_pool`: asks the IPAM about the pool's subnets and returns the Ready status;
- `reconcile_pool`: what one pool needs now (the work queue calls it for every pool event
  that needs it and for the periodic refresh): status, the ``ProtectPool`` finalizer on the
  pool, the ``credentials-in-use`` finalizer on the Secrets it reads, and, while it is being
  deleted, whether anything may still hold an entry in it;
- `purge_quarantined`: deletes the pool's IPAM entries whose reuse grace period ended.

Global pools (cluster-scoped, namespace ``""``) read their Secrets in the namespaces their
``credentialsRef``/``tls.caSecretRef`` name, and their users are the claims and IPAddresses
of every watched namespace.

Credentials outlive the claims that need them: a namespace deletion
removes Secrets, pools and claims in no order, so a Secret that a pool reads carries
``ipam.cluster.x-k8s.io/credentials-in-use`` while such a pool exists; the pool keeps it until
its last claim is released, then both go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from backends.errors import BackendError
from bridge import capi
from bridge.capi import Reason
from bridge.metrics import Metrics
from bridge.models import IPPool, PoolStatus
from bridge.objects.cache import Cache
from bridge.objects.keys import pool_key, pool_token
from bridge.reconcilers.backend_clients import PoolClients, SecretReader
from bridge.reconcilers.context import (
    NamespaceLocks,
    Queue,
    ServedVersions,
)
from bridge.reconcilers.errors import PoolError, pool_error_from, retry_delay
from bridge.reconcilers.pool_backends import (
    BACKEND_NAMES,
    READY,
    Pool,
    pool_failed_status,
    pool_status,
    status_patch,
    valid,
)
from bridge.runtime.events import EventSink
from bridge.runtime.gateway import Outcome, Write
from bridge.runtime.holds import PendingHolds
from bridge.runtime.waits import HoldOff
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

__all__ = [
    "CREDENTIALS_FINALIZER",
    "SECRETS_ANNOTATION",
    "PoolApi",
    "PoolDeps",
    "check_pool",
    "needs_check",
    "purge_quarantined",
    "reconcile_pool",
    "users_of",
]

log = logging.getLogger(__name__)

#: Finalizer on a Secret that a pool reads (it outlives the claims that need it).
CREDENTIALS_FINALIZER = "ipam.cluster.x-k8s.io/credentials-in-use"
#: Annotation on a pool naming (comma-separated) the Secrets it put `CREDENTIALS_FINALIZER`
#: on: a Secret it stopped reading, or the Secrets of a pool whose spec no longer parses, are
#: still let go. ``<name>`` for a Secret of the pool's own namespace, ``<namespace>/<name>``
#: for another (Global pools). Our bookkeeping on our own object; copied by
#: ``clusterctl move`` like the Secrets' finalizers it describes.
SECRETS_ANNOTATION = "ipam-bridge.io/secrets-in-use"


class PoolApi(SecretReader, Protocol):
    """The Kubernetes reads and writes of the pool reconciler (`bridge.objects.client`)."""

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool, or None."""

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return the pools of ``kind`` in ``namespaces``."""

    def list_claims(
        self, version: str, namespaces: tuple[str, ...] = (), *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Return the claims of ``namespaces``."""

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        """Return the IPAddresses of a namespace (None: all)."""

    def set_pool_finalizer(self, pool: IPPool, finalizer: str, present: bool) -> Write:
        """Add or remove a finalizer of the pool as read."""

    def annotate_pool(self, pool: IPPool, key: str, value: str | None) -> Write:
        """Set or remove one annotation of a pool as read."""

    def patch_pool_status(
        self,
        namespace: str,
        kind: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Write:
        """Merge-patch a pool's status (`Outcome.CONFLICT`: changed since ``resource_version``)."""

    def set_secret_finalizer(
        self, namespace: str, name: str, finalizer: str, present: bool
    ) -> Write:
        """Add or remove a finalizer of a Secret (`Outcome.CONFLICT`: it changed meanwhile)."""


@dataclass
class PoolDeps:
    """What the pool reconciler uses (`reconcile_pool`, `purge_quarantined`).

    Attributes
    ----------
    settings:
        The operator settings.
    kube:
        The Kubernetes objects (pools, claims, IPAddresses, Secrets).
    versions:
        The served CAPI versions.
    cache:
        The informer cache (a pool's deletion waits until it shows there).
    queue:
        Where pool keys go, and the claims parked under a pool's token are woken.
    events:
        Where Events about pools are told.
    metrics:
        The Prometheus metrics.
    clients:
        The pools' backend clients.
    exhausted:
        The pools found with no free address (`bridge.runtime.waits.HoldOff`): forgotten
        when the pool has a free address or is gone.
    holds:
        Claims about to hold a pool (its deletion guard counts them).
    locks:
        Per-namespace locks of the decisions about Secrets.
    """

    settings: Settings
    kube: PoolApi
    versions: ServedVersions
    cache: Cache
    queue: Queue
    events: EventSink
    metrics: Metrics
    clients: PoolClients
    exhausted: HoldOff
    holds: PendingHolds
    locks: NamespaceLocks


def check_pool(deps: PoolDeps, pool: Pool) -> PoolStatus:
    """Check a pool against its IPAM and return its Ready status.

    Returns
    -------
    PoolStatus
        The full status (`pool_backends.pool_status`: per subnet and summed; Ready True
        ``PoolReady``; conditions of other types kept).

    Raises
    ------
    PoolError
        With the reason to show: ``InvalidSpec``, ``CredentialsNotFound``,
        ``AuthenticationFailed``, ``SubnetNotFound``, ``TLSVerificationFailed`` or
        ``BackendUnavailable``.
    """
    backend = deps.clients.backend_for(pool)
    try:
        infos = deps.metrics.call(
            BACKEND_NAMES[pool.kind], "describe_subnets", backend.describe_subnets
        )
    except BackendError as exc:
        raise pool_error_from(exc, pool.display) from exc
    free = sum(info.free for info in infos)
    deps.metrics.pool_free.labels(f"{pool.namespace}/{pool.name}", pool.kind).set(free)
    total = sum(info.total for info in infos)
    deps.metrics.pool_total.labels(f"{pool.namespace}/{pool.name}", pool.kind).set(total)
    if free > 0:
        deps.exhausted.lift(pool.key)
    return pool_status(pool, infos)


def users_of(deps: PoolDeps, namespace: str, kind: str, name: str) -> list[str]:
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
    version = deps.versions.address
    found: set[str] = set()
    if namespace:
        claims = deps.kube.list_claims(version, (namespace,))
        addresses = deps.kube.list_ip_addresses(version, namespace)
    else:
        watched = deps.settings.namespaces
        claims = deps.kube.list_claims(version, watched)
        addresses = [
            item for ns in watched or (None,) for item in deps.kube.list_ip_addresses(version, ns)
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


def needs_check(pool: Pool, *, listing: bool) -> bool:
    """Return True when a pool event calls for a reconcile (not our own status write).

    A pool needs one when it is found at start-up (``listing``), is being deleted, has no
    Ready condition yet (new, or recreated by ``clusterctl move`` without status), or its
    spec changed since the last check (``status.observedGeneration`` behind
    ``metadata.generation``). Otherwise the periodic refresh keeps its status current.
    """
    if listing or pool.deleting:
        return True
    if pool.status.condition(READY) is None:
        return True
    return pool.observed_generation != pool.generation


#: A Secret by ``(namespace, name)``.
SecretId = tuple[str, str]


def _recorded_secrets(pool: Pool) -> set[SecretId]:
    """Return the ``(namespace, name)`` of the Secrets a pool's `SECRETS_ANNOTATION` names."""
    own = pool.metadata.namespace
    raw = pool.metadata.annotations.get(SECRETS_ANNOTATION, "")
    refs: set[SecretId] = set()
    for entry in raw.split(","):
        namespace, _, name = entry.rpartition("/")
        if name and (namespace or own):
            refs.add((namespace or own, name))
    return refs


def _annotation(refs: set[SecretId], own: str) -> str:
    """Return the `SECRETS_ANNOTATION` value naming ``refs`` (short names in ``own``)."""
    return ",".join(sorted(name if ns == own else f"{ns}/{name}" for ns, name in refs))


def _secrets_of(pool: Pool) -> set[SecretId]:
    """Return the Secrets a pool object reads (or, when its spec is unreadable, protected)."""
    if pool.spec is None:
        return _recorded_secrets(pool)  # unreadable spec: keep what it held
    return set(pool.secret_refs)


def _read_by_pools(deps: PoolDeps, namespace: str, *, besides: tuple[str, str, str]) -> set[str]:
    """Return the Secrets of ``namespace`` that pools read, but pool ``(namespace, kind, name)``.

    The namespaced pools of ``namespace`` and every Global pool may read them.
    """
    read: set[str] = set()
    for kind in capi.POOL_KINDS:
        is_global = kind in capi.GLOBAL_POOL_KINDS
        for body in deps.kube.list_pools(kind, () if is_global else (namespace,)):
            other = IPPool.from_body(body, kind)
            if other.key == besides:
                continue
            read.update(name for ns, name in _secrets_of(other) if ns == namespace)
    return read


def _release_secrets(deps: PoolDeps, refs: set[SecretId], besides: tuple[str, str, str]) -> bool:
    """Remove `CREDENTIALS_FINALIZER` from the Secrets ``refs`` that no pool but ``besides`` reads.

    Takes the lock of each Secret's namespace (`PoolDeps.locks`). Returns False when a
    Secret changed between its read and the write (409 Conflict): it may still carry the
    finalizer, so the caller keeps what remembers it (the pool's finalizer, its
    `SECRETS_ANNOTATION`) and retries. The other Secrets are let go all the same.
    """
    released = True
    for namespace in sorted({ns for ns, _ in refs}):
        names = {name for ns, name in refs if ns == namespace}
        with deps.locks.holding(namespace):
            for name in sorted(names - _read_by_pools(deps, namespace, besides=besides)):
                write = deps.kube.set_secret_finalizer(
                    namespace, name, CREDENTIALS_FINALIZER, False
                )
                released = released and write.outcome is not Outcome.CONFLICT
    return released


def _protect_secrets(deps: PoolDeps, pool: Pool) -> bool:
    """Protect the Secrets the pool reads; let go of those it read before and no longer does.

    The pool's `SECRETS_ANNOTATION` names every Secret it put `CREDENTIALS_FINALIZER` on; it
    is widened before a Secret is protected (so none is ever protected unremembered) and
    narrowed after a Secret it stopped reading (``credentialsRef`` changed) was let go. A
    Secret is protected under its namespace's lock (`PoolDeps.locks`), as it is let go: a
    deleted pool that lets a Secret go has either seen this pool or lets go before it.

    Returns True when done; False when a write met 409 Conflict or the pool is gone
    (the caller looks at the pool again soon).
    """
    wanted, recorded = set(pool.secret_refs), _recorded_secrets(pool)
    if not wanted <= recorded:
        widened = deps.kube.annotate_pool(
            pool, SECRETS_ANNOTATION, _annotation(wanted | recorded, pool.namespace)
        )
        if widened.outcome in (Outcome.CONFLICT, Outcome.GONE):
            return False
    protected = True
    for namespace, name in pool.secret_refs:
        with deps.locks.holding(namespace):
            write = deps.kube.set_secret_finalizer(namespace, name, CREDENTIALS_FINALIZER, True)
        protected = protected and write.outcome is not Outcome.CONFLICT
    stale = recorded - wanted
    if stale:
        if not _release_secrets(deps, stale, besides=pool.key):
            return False  # the annotation keeps naming the Secret that may keep the finalizer
        deps.kube.annotate_pool(pool, SECRETS_ANNOTATION, _annotation(wanted, pool.namespace))
    return protected


#: Re-reads of a pool whose status write met 409 Conflict before the write is left to the
#: next check (each re-read means another writer just wrote; a handful never all lose).
STATUS_ATTEMPTS = 5


def _update_status(deps: PoolDeps, pool: Pool, status: PoolStatus) -> None:
    """Write the pool's status where it changed; post an Event when Ready changes.

    One writer per condition: the pool's check owns ``Ready`` and the status fields
    (usage, subnets, ``observedGeneration``), the drift audit owns ``InSync``
    (`audit`). Fields are merge-patched as they are (nobody else writes them;
    `pool_backends.status_patch`). The conditions list is replaced whole by a merge patch,
    so when Ready changed it is written merged into the list as read, guarded by that
    resourceVersion; on 409 Conflict (the audit wrote in between, after seconds of IPAM
    calls) the pool is read again and Ready merged into what it holds now. A
    resourceVersion guard with a re-read, rather than server-side apply with a field
    manager per writer: the guard is plain optimistic concurrency every API server and the
    in-memory one (`mock_kubernetes`) serve, while apply would first have to take over the
    conditions that merge patches of earlier versions own (managed fields,
    https://kubernetes.io/docs/reference/using-api/server-side-apply/#conflicts).
    """
    namespace, kind, name = pool.metadata.namespace, pool.kind, pool.name
    current = pool
    for _ in range(STATUS_ATTEMPTS):
        patch = status_patch(current.status, status)
        if not patch:
            break
        version = current.metadata.resource_version
        guard = version if "conditions" in patch and version else None
        written = deps.kube.patch_pool_status(namespace, kind, name, patch, resource_version=guard)
        if written.outcome is not Outcome.CONFLICT:
            break
        reread = deps.kube.get_pool(namespace, kind, name)
        if reread is None:
            return
        current = IPPool.from_body(reread, kind)
    else:
        log.info("pool %s/%s: status not written (it kept changing)", namespace, name)
    ready = status.condition(READY)
    if ready is not None and pool.ready[:2] != (ready.status, ready.reason):
        good = ready.status == "True"
        log.log(
            logging.INFO if good else logging.WARNING, "pool %s: %s", ready.reason, ready.message
        )
        deps.events.post(
            pool.as_object(), "Normal" if good else "Warning", ready.reason, ready.message
        )


def reconcile_pool(deps: PoolDeps, namespace: str, kind: str, name: str) -> Result:
    """Decide and do what one pool needs now (called by the work queue).

    A live pool: ``ProtectPool`` and the Secrets' `CREDENTIALS_FINALIZER` are ensured, the
    pool is checked against its IPAM, the status written where it changed (an Event when
    Ready changes), and when Ready the claims waiting for it are woken. A pool being deleted
    keeps ``ProtectPool`` while `users_of` finds anything, or a claim is about to hold it
    (``deps.holds``, between its look at the pool and its finalizer write): ``DeletionBlocked``
    naming them;
    then the finalizer goes, the Secrets are let go when no other pool reads them, and its
    backend client is closed.

    Returns
    -------
    Result
        Retry after `errors.retry_delay` of the failure's reason while not Ready or
        blocked; after 1 s when a write of the pool's or a Secret's finalizer met 409
        Conflict (a pool being deleted keeps ``ProtectPool`` until its Secrets were let
        go); done otherwise (the periodic refresh queues every pool again).

    ``namespace`` is ``""`` for a Global pool.

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found" (the queue logs and retries).
    """
    body = deps.kube.get_pool(namespace, kind, name)
    if body is None:
        deps.clients.backends.drop((namespace, kind, name))
        deps.exhausted.lift((namespace, kind, name))  # forgotten: the pool is gone
        deps.metrics.forget_pool(f"{namespace}/{name}", kind)
        deps.queue.wake(pool_token(namespace, kind, name))
        return Result.done()
    pool = IPPool.from_body(body, kind)
    if pool.deleting:
        return _reconcile_deleting(deps, pool)

    if capi.POOL_FINALIZER not in pool.metadata.finalizers:
        outcome = deps.kube.set_pool_finalizer(pool, capi.POOL_FINALIZER, True).outcome
        if outcome is Outcome.CONFLICT:
            return Result.requeue_after(1.0)  # changed since read: its watch event queues it too
        if outcome is Outcome.GONE:
            return Result.done()
    try:
        if not _protect_secrets(deps, valid(pool)):
            return Result.requeue_after(1.0)  # a Secret changed since read: protect it again
        status = check_pool(deps, pool)
    except PoolError as failure:
        if pool.ready[:2] != ("False", failure.reason):
            # A new failure: claims that waited for the pool's check learn what it found.
            deps.queue.wake(pool_token(namespace, kind, name))
        _update_status(deps, pool, pool_failed_status(pool, failure))
        return Result.requeue_after(retry_delay(deps.settings, failure.reason))
    was_ready = pool.ready[0] == "True"
    _update_status(deps, pool, status)
    token = pool_token(namespace, kind, name)
    if not was_ready:
        deps.queue.wake(token)  # the claims that waited for the pool to turn Ready
    elif status.ip_addresses is not None and status.ip_addresses.free > 0:
        deps.queue.wake(
            token, count=1
        )  # a claim waiting for an address tries; success wakes the next
    if deps.queue.parked(token):
        # Claims wait for an address: look again soon (one IPAM request per pool, not one
        # per claim), until they are served.
        return Result.requeue_after(retry_delay(deps.settings, Reason.POOL_EXHAUSTED))
    return Result.done()


#: How soon a pool being deleted looks again while the cache does not show its deletion yet,
#: or while a claim is about to hold it (``deps.holds``).
CACHE_LAG_SECONDS = 0.5


def _reconcile_deleting(deps: PoolDeps, pool: Pool) -> Result:
    """Keep a pool being deleted while anything may hold an entry in it; else let it go.

    A pool whose spec does not parse still goes: its Secrets are the ones its
    `SECRETS_ANNOTATION` names.
    """
    namespace, kind, name = pool.key
    deps.queue.wake(pool_token(namespace, kind, name))  # its waiting claims learn it is going
    cached = deps.cache.pools.get((kind, namespace, name))
    if cached is not None and not IPPool.from_body(cached, kind).deleting:
        # Claims decide from the cache: until it shows the deletion, a claim may still see
        # the pool live and register in it. Its watch event queues the pool again.
        return Result.requeue_after(CACHE_LAG_SECONDS)
    pending = deps.holds.of((namespace, kind, name))
    users = users_of(deps, namespace, kind, name) + [f"IPAddressClaim {key}" for key in pending]
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        error = PoolError(
            Reason.DELETION_BLOCKED,
            f"pool is being deleted but {len(users)} object(s) may still hold an address in "
            f"it: {shown}; it goes once their claims are released",
            needs_person=False,
        )
        _update_status(deps, pool, pool_failed_status(pool, error))
        if pending:  # claims in flight settle within moments: look again soon
            return Result.requeue_after(CACHE_LAG_SECONDS)
        # Each release queues the pool again; this retry is only the safety net.
        return Result.requeue_after(deps.settings.requeue_config_error_seconds)
    held = _recorded_secrets(pool) | set(pool.secret_refs)
    # Under the namespace locks (`PoolDeps.locks`): two pools reading one Secret,
    # deleted at once, must not each see the other and both keep its finalizer.
    if not _release_secrets(deps, held, besides=(namespace, kind, name)):
        # A Secret changed since read and may keep its finalizer: the pool, and with it
        # what remembers the Secret, stays until it is let go.
        return Result.requeue_after(1.0)
    if deps.kube.set_pool_finalizer(pool, capi.POOL_FINALIZER, False).outcome is Outcome.CONFLICT:
        return Result.requeue_after(1.0)  # changed since read: decided again from what it is now
    deps.clients.backends.drop((namespace, kind, name))
    deps.exhausted.lift((namespace, kind, name))
    deps.metrics.forget_pool(f"{namespace}/{name}", kind)
    log.info("pool %s/%s: nothing holds an address in it any more; let go", namespace, name)
    return Result.done()


def purge_quarantined(deps: PoolDeps, namespace: str, kind: str, name: str) -> list[str]:
    """Delete a pool's IPAM entries whose reuse grace period ended.

    Run by the leader for every pool at start-up, then every
    ``IPAM_BRIDGE_QUARANTINE_PURGE_SECONDS`` for the pools with
    ``addressReuseGracePeriodSeconds`` > 0 (`bridge.handlers.resync.purge_forever`). The
    quarantine mark lives in the IPAM (`backends.base.quarantine_mark`), so nothing here
    depends on memory: a restart or a new leader purges what is due. Only this management
    cluster's entries (and the previous release's) are purged (``settings.cluster_id``):
    another cluster purges its own. When entries were
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
    body = deps.kube.get_pool(namespace, kind, name)
    if body is None:
        return []
    pool = IPPool.from_body(body, kind)
    if pool.spec is None or pool.deleting:
        return []
    backend = deps.clients.backend_for(pool)
    purged = deps.metrics.call(
        BACKEND_NAMES[pool.kind],
        "purge_quarantined",
        lambda: backend.purge_quarantined(time.time(), deps.settings.cluster_id),
    )
    if purged:
        log.info(
            "pool %s: quarantine ended for %s; entries deleted", pool.display, ", ".join(purged)
        )
        deps.exhausted.lift(pool.key)
        deps.queue.wake(pool_token(pool.namespace, pool.kind, pool.name), count=1)
        deps.queue.add(pool_key(pool.namespace, pool.kind, pool.name))
    return list(purged)
