"""What an IPAddressClaim needs, decided from what it is now: the core of the operator.

`reconcile_claim` is called by the work queue for every sight of a claim (a watch event, the
start-up listing, the periodic resync, a wake-up) and makes the same decision from the
claim's current state each time (``docs/architecture.md``, "The flow of a claim"):

- not ours (``spec.poolRef`` names another provider's kind): nothing, never a write;
- gone, or made again under its name (another uid), while an IPAddress of ours names it (its
  events queue the claim: controller-runtime's ``Owns()``): that IPAddress, live or being
  deleted, is released in the IPAM and deleted once the API server confirms its claim is
  gone (a DELETE in flight wins over our finalizer write, real-cluster.md 13e; the garbage
  collector leaves the IPAddress to its pool, 13f); a pass that finds its own claim gone by
  a write after it registered an address undoes it so at once;
- being deleted and carrying our ``ReleaseAddress`` finalizer: release (unless paused): free the
  entry in the IPAM where the IPAddress says it was registered, delete the IPAddress (its
  ``ProtectAddress`` finalizer first), remove ``ReleaseAddress``;
- bound (its IPAddress exists and is its own: owned by its uid, not vanishing): make sure
  status says so (no backend call, no Cluster read when it already does);
- else: wait while paused or while the pool is missing or not Ready; add ``ReleaseAddress``
  (a claim found gone by that write stops there, before any IPAM call; from its look at the
  pool to that write it counts in the pool's deletion guard, `bridge.runtime.holds`);
  allocate in the IPAM by hostname (find first, so a repeat never makes a second entry; the
  address of the ``ipam.cluster.x-k8s.io/requested-address`` annotation when set);
  create the IPAddress (one that exists is adopted when it is this claim's, of this pool, at
  the address the IPAM gave); write ``status.addressRef`` and Ready. A claim rebuilt from
  its IPAddress (``clusterctl move``, a restore: no ``status.addressRef``) first writes this
  cluster as its entry's owner, with one IPAM call.

Every entry names its owner (`owner_of`: this management cluster's ``settings.cluster_id``
and the claim). An entry under the claim's hostname that another cluster or claim owns is
never taken: the claim waits, Ready=False ``HostnameTaken`` (`backends.base.may_adopt`).

Every write's outcome (`gateway.Write`: written, unchanged, gone, conflict) decides what
follows; a release that stopped before its last step is finished from what the IPAM and the
IPAddress show, never guessed. A claim goes without an IPAM release only on positive evidence of
a ``clusterctl move`` (its ``delete-for-move`` annotation on the claim or its IPAddress as the
API server has them) or when its pool is gone.

A claim may reference a Global (cluster-scoped) pool from any namespace: the pool is looked
up without a namespace (`bridge.capi.pool_namespace`), the hostname stays
``<claim>.<claim namespace>``. A pool with ``addressReuseGracePeriodSeconds`` releases into
quarantine: the IPAM entry stays, marked until the grace period ends.

Waiting is quiet: a claim that waits writes its status only when the condition it shows
changes, and is parked in the work queue under what ends the wait (its Cluster, its pool)
instead of being retried through kopf (whose retries write progress annotations on the
claim at every attempt).

A claim's IPAM work takes a place in its IPAM server's limit (`backends.flowcontrol`): when
the server has none free, the claim parks under `bridge.objects.keys.endpoint_token` (no API
request, no status change, no worker held) and is woken when a place frees
(`bridge.runtime.waits.Places`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kubernetes.client import ApiException
from pydantic import ValidationError

from backends.base import Allocation, EntryOwner
from backends.errors import AddressUnavailableError, BackendError, EntryOwnedError
from backends.flowcontrol import FlowControl, endpoint_key
from bridge import capi
from bridge.capi import Claim, Cluster, Reason
from bridge.metrics import Metrics
from bridge.models import IPAddress, IPPool
from bridge.objects.cache import Cache
from bridge.objects.keys import claim_key, cluster_token, endpoint_token, pool_key, pool_token
from bridge.reconcilers.backend_clients import PoolClients
from bridge.reconcilers.context import Queue, ServedVersions
from bridge.reconcilers.control_plane import allocates_while_paused
from bridge.reconcilers.errors import (
    ClaimError,
    PoolError,
    claim_error_from,
    exhausted_message,
    retry_delay,
)
from bridge.reconcilers.pool_backends import (
    BACKEND_NAMES,
    Pool,
    location_of,
    valid,
    with_location,
)
from bridge.runtime.events import EventSink
from bridge.runtime.expectations import GONE
from bridge.runtime.gateway import Outcome, Write
from bridge.runtime.holds import PendingHolds
from bridge.runtime.store import MISSING, Store
from bridge.runtime.waits import HoldOff, Places
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

__all__ = ["ClaimApi", "ClaimDeps", "owner_of", "reconcile_claim"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClaimApi(Protocol):
    """The Kubernetes reads and writes of the claim reconciler (`bridge.objects.client`)."""

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a claim, or None."""

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an IPAddress, or None."""

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool, or None."""

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a CAPI Cluster, or None."""

    def set_claim_finalizer(self, claim: Claim, finalizer: str, present: bool) -> Write:
        """Add or remove a finalizer of the claim as read."""

    def patch_claim_status(
        self,
        version: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Write:
        """Merge-patch the claim's status (guarded by ``resource_version`` when given)."""

    def create_ip_address(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create an IPAddress (a conflict carries the existing one)."""

    def delete_ip_address(
        self, version: str, namespace: str, name: str, current: Mapping[str, Any] | None = None
    ) -> Write:
        """Delete an IPAddress, our finalizer first."""


@dataclass
class ClaimDeps:
    """What the claim reconciler uses (`reconcile_claim`).

    Attributes
    ----------
    settings:
        The operator settings (retry delays).
    kube:
        The Kubernetes objects (claims, IPAddresses; pools and Clusters the cache lacks).
    versions:
        The served CAPI versions (and whether v1beta1 claims keep ``status.v1beta2``).
    cache:
        The informer cache a claim is decided from.
    queue:
        Where keys go: a pool to look at again, a claim whose status write showed a change.
    events:
        Where Events about claims are told.
    metrics:
        The Prometheus metrics.
    clients:
        The pools' backend clients.
    flow:
        The flow control per IPAM server (`backends.flowcontrol.FlowControl`): a claim's
        IPAM work takes a place in its server's limit.
    places:
        The claims parked for a place at an IPAM server (`bridge.runtime.waits.Places`).
    exhausted:
        The pools found with no free address (`bridge.runtime.waits.HoldOff`): their
        claims wait without an IPAM call.
    holds:
        Claims between their look at their pool and their finalizer write (counted by a
        pool's deletion guard, `bridge.runtime.holds.PendingHolds`).
    """

    settings: Settings
    kube: ClaimApi
    versions: ServedVersions
    cache: Cache
    queue: Queue
    events: EventSink
    metrics: Metrics
    clients: PoolClients
    flow: FlowControl
    places: Places
    exhausted: HoldOff
    holds: PendingHolds


class _Wait(Exception):  # noqa: N818 - control flow: the claim must wait
    """The claim waits; ``decision`` says for what (and the status to show, if any)."""

    def __init__(self, decision: Result, error: ClaimError | None = None) -> None:
        super().__init__(error.message if error else "waiting")
        self.decision = decision
        self.error = error


def owner_of(settings: Settings, claim: Claim) -> EntryOwner:
    """Return the owner written on the claim's IPAM entry: this management cluster, the claim.

    ``settings.cluster_id`` is the identity resolved at start-up
    (`bridge.cluster_id.resolve_cluster_id`); the claim is named ``<namespace>/<name>``.
    """
    return EntryOwner(cluster_id=settings.cluster_id, claim=claim.key)


# -- the decision --------------------------------------------------------------------------


def reconcile_claim(deps: ClaimDeps, namespace: str, name: str) -> Result:
    """Decide and do what one claim needs now (called by the work queue).

    Parameters
    ----------
    deps:
        What the claim reconciler uses.
    namespace, name:
        The claim.

    Returns
    -------
    Result
        Done, a retry after a delay (`errors.retry_delay`), or a wait parked under the
        claim's Cluster or pool.

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found" and conflicts (the queue logs and retries).

    Notes
    -----
    Whatever the pass decides (or raises), a place the claim was woken for and did not
    take goes to the next claim parked for it (`bridge.runtime.waits.Places.passed`).
    """
    try:
        return _reconcile(deps, namespace, name)
    finally:
        deps.places.passed(claim_key(namespace, name))


def _reconcile(deps: ClaimDeps, namespace: str, name: str) -> Result:
    """Decide and do what the claim needs (`reconcile_claim`, which settles its admission)."""
    typed = _claim_of(deps, namespace, name)
    if typed is None:
        deps.metrics.pending(f"{namespace}/{name}", None)
        return _orphan(deps, namespace, name)
    claim = typed[1]
    if claim is None:
        return Result.done()  # no poolRef kind/name: not a claim we can serve
    if not claim.pool_ref.is_ours:
        return Result.done()
    if (expected := _expected(deps, claim)) is not None:
        return expected
    try:
        if claim.deleting:
            return _release(deps, claim)
        return _reconcile_live(deps, claim)
    except _Wait as wait:
        if wait.error is not None:
            reason, message = wait.error.reason, wait.error.message
            _update_status(deps, claim, ready=False, reason=reason, message=message)
            deps.metrics.pending(claim.key, reason)
        return wait.decision
    except ClaimError as error:
        _update_status(deps, claim, ready=False, reason=error.reason, message=error.message)
        deps.metrics.pending(claim.key, error.reason)
        return Result.requeue_after(error.delay)
    except ApiException as exc:
        if exc.status == 409:  # the claim changed under us: its watch event queues it again
            return Result.requeue_after(1.0)
        raise


def _expected(deps: ClaimDeps, claim: Claim) -> Result | None:
    """Return a wait while the cache is older than our last write of the claim or its IPAddress.

    Our write's answer is recorded (`bridge.runtime.expectations.Expectations.wrote`); until
    the watch brings that version (or the store holds it, or the wait lapses), the pass parks
    instead of acting on the older one (kube-controller-manager's expectations). None:
    nothing to wait for.
    """
    expectations = deps.cache.expectations
    for store, key in (
        (deps.cache.claims, ("ipaddressclaims", claim.namespace, claim.name)),
        (deps.cache.addresses, ("ipaddresses", claim.namespace, claim.address_ref or claim.name)),
    ):
        if left := expectations.pending(key, store.version(key[1:]) or GONE):
            return Result.wait(expectations.token(key), at_most=left)
    return None


def _paused(deps: ClaimDeps, claim: Claim) -> None:
    """Raise `_Wait` while the claim or its Cluster is paused, or its Cluster is missing.

    The Cluster comes from ``spec.clusterName`` or the cluster-name label. A claim being
    deleted whose Cluster is gone proceeds, so a cluster teardown cannot deadlock
    (https://github.com/kubernetes-sigs/cluster-api-ipam-provider-in-cluster/issues/289).
    A paused claim is woken by its own update (the annotation removed), a claim of a
    paused or missing Cluster by that Cluster's watch.
    Exception: the live control-plane endpoint claim of a paused Cluster that has no
    endpoint yet is allocated (`control_plane.allocates_while_paused`); none is ever
    released while paused.
    """
    if capi.PAUSED_ANNOTATION in claim.annotations:
        raise _Wait(Result.done())
    if not claim.cluster_name:
        return
    token = cluster_token(claim.namespace, claim.cluster_name)
    cluster_name = claim.cluster_name
    found = _cached(
        deps.cache.clusters,
        (claim.namespace, cluster_name),
        lambda: deps.kube.get_cluster(claim.namespace, cluster_name),
    )
    if found is None:
        if claim.deleting:
            return
        raise _Wait(
            Result.wait(token),
            ClaimError(
                Reason.ALLOCATION_FAILED,
                f"Cluster {claim.namespace}/{claim.cluster_name} not found; waiting for it",
                delay=0,
            ),
        )
    cluster = Cluster.from_body(found)
    if cluster.is_paused:
        if allocates_while_paused(claim, cluster):
            return  # a Cluster's endpoint claim: that Cluster waits for it
        raise _Wait(Result.wait(token))


def _names_claim(address: IPAddress, claim: Claim) -> bool:
    """Return True when ``address`` names the claim and its pool (``claimRef``, ``poolRef``).

    Any claim of that name: a predecessor deleted and made again under the same name is
    named too (`_belongs_to` tells them apart).
    """
    spec = address.spec
    return (
        spec.claim_ref.name == claim.name
        and spec.pool_ref.name == claim.pool_ref.name
        and spec.pool_ref.kind == claim.pool_ref.kind
    )


def _claim_owner(address: IPAddress) -> str | None:
    """Return the uid of the IPAddress's ``IPAddressClaim`` owner reference; None: it has none.

    Every IPAddress the operator makes names its claim there (`capi.build_ip_address`);
    the garbage collector drops the reference once that claim is gone and the pool still
    owns the IPAddress (real-cluster.md 13f).
    """
    return next(
        (ref.uid for ref in address.metadata.owner_references if ref.kind == "IPAddressClaim"),
        None,
    )


def _belongs_to(address: IPAddress, claim: Claim) -> bool:
    """Return True when ``address`` is this claim's: named by it, owned by its uid.

    An IPAddress of a predecessor of the same name (another uid, or its reference dropped
    by the garbage collector) is not.
    """
    return _names_claim(address, claim) and _claim_owner(address) == claim.uid


def _binds(address: IPAddress, claim: Claim) -> bool:
    """Return True when a live claim may be bound to (or stay bound to) ``address``.

    It must be this claim's (`_belongs_to`) and not vanishing: an IPAddress being deleted
    binds only while our ``ProtectAddress`` holds it (the contract keeps the IPAddress while
    its claim lives); without it, it goes whenever the other finalizers do.
    """
    meta = address.metadata
    held = not meta.deleting or capi.ADDRESS_FINALIZER in meta.finalizers
    return held and _belongs_to(address, claim)


def _parse_address(body: Mapping[str, Any] | None) -> IPAddress | None:
    """Return an IPAddress body as read, parsed; None when absent or not an IPAddress's shape."""
    if body is None:
        return None
    try:
        return IPAddress.model_validate(body)
    except ValidationError:
        return None


def _cached(
    part: Store,
    key: tuple[str, ...],
    read: Callable[[], Mapping[str, Any] | None],
    version: str | None = None,
) -> Mapping[str, Any] | None:
    """Return an object from the operator's cache (`bridge.objects.cache`), or read it.

    The API is read only when the cache cannot tell: before its initial listing was seen,
    or when the object was watched in another served ``version`` than the one asked for.

    The result may be the cache's shared dict: never modify it.
    """
    found = part.lookup(key)
    if found == MISSING:
        return None
    if isinstance(found, str):
        return read()
    served = str(found.get("apiVersion") or "").rsplit("/", 1)[-1]
    if version is not None and served and served != version:
        return read()
    return found


def _typed(
    part: Store,
    key: tuple[str, ...],
    parse: Callable[[Mapping[str, Any]], tuple[str, T]],
    read: Callable[[], Mapping[str, Any] | None],
    version: str | None = None,
) -> tuple[str, T] | None:
    """Return an object of the operator's cache typed by ``parse``, or read and type it.

    As `_cached`: the API is read only when the cache cannot tell, or when the object was
    watched in another served ``version`` than the one asked for (``parse`` returns the
    served version first: ``apiVersion``'s last part, ``""`` when absent). The cache keeps
    the typed value of an object's version (`Store.lookup_typed`): a pass that comes
    back to an unchanged object neither decodes nor validates it again.
    """
    found = part.lookup_typed(key, parse)
    if found == MISSING:
        return None
    if isinstance(found, str):
        body = read()
        return None if body is None else parse(body)
    if version is not None and found[0] and found[0] != version:
        body = read()
        return None if body is None else parse(body)
    return found


def _served(body: Mapping[str, Any]) -> str:
    """Return the served version of an object as read (``apiVersion``'s last part)."""
    return str(body.get("apiVersion") or "").rsplit("/", 1)[-1]


def _claim_typed(body: Mapping[str, Any]) -> tuple[str, Claim | None]:
    """Return a claim body's served version and its `Claim` (None: not a claim we serve)."""
    try:
        return _served(body), Claim.from_body(body)
    except ValueError:
        return _served(body), None


def _address_typed(body: Mapping[str, Any]) -> tuple[str, IPAddress | None]:
    """Return an IPAddress body's served version and its model (None: not its shape)."""
    return _served(body), _parse_address(body)


def _pool_typed(body: Mapping[str, Any]) -> tuple[str, IPPool]:
    """Return a pool body's served version and its `IPPool` (its spec's problem inside).

    Raises
    ------
    pydantic.ValidationError
        When ``metadata`` is malformed (`IPPool.from_body`).
    """
    return _served(body), IPPool.from_body(body)


def _claim_of(deps: ClaimDeps, namespace: str, name: str) -> tuple[str, Claim | None] | None:
    """Return the claim as last seen (cache, else one GET), typed; None when it is gone.

    The second item is None for an object that is not a claim the operator can serve
    (``spec.poolRef`` lacks a kind or a name).
    """
    version = deps.versions.address
    return _typed(
        deps.cache.claims,
        (namespace, name),
        _claim_typed,
        lambda: deps.kube.get_claim(version, namespace, name),
        version,
    )


def _last_seen(address: IPAddress) -> dict[str, Any]:
    """Return the metadata of an IPAddress as last seen (`gateway.Kube.delete_ip_address`).

    Its ``uid`` makes the DELETE carry ``preconditions.uid``: another object of the same
    name is never deleted in its place.
    """
    meta = address.metadata
    return {
        "metadata": {
            "finalizers": list(meta.finalizers),
            "resourceVersion": meta.resource_version,
            "uid": meta.uid,
        }
    }


def _cached_address(deps: ClaimDeps, namespace: str, name: str) -> IPAddress | None:
    """Return an IPAddress as last seen (cache, else one GET), typed; None when absent."""
    version = deps.versions.address
    typed = _typed(
        deps.cache.addresses,
        (namespace, name),
        _address_typed,
        lambda: deps.kube.get_ip_address(version, namespace, name),
        version,
    )
    return None if typed is None else typed[1]


def _address_of(deps: ClaimDeps, claim: Claim, *, binding: bool = True) -> IPAddress | None:
    """Return the claim's IPAddress when it exists and is the claim's, else None.

    ``binding``: one a live claim may be bound to (`_binds`); else any of the claim's own
    (`_belongs_to`), being deleted or not (a release deletes it).
    """
    address = _cached_address(deps, claim.namespace, claim.address_ref or claim.name)
    if address is not None and (_binds if binding else _belongs_to)(address, claim):
        return address
    return None


def _pool_of(deps: ClaimDeps, claim: Claim) -> Pool | None:
    """Return the claim's pool, or None when it is gone.

    Raises
    ------
    ClaimError
        ``PoolNotReady`` when the pool's spec is invalid.
    """
    ref = claim.pool_ref
    pool = _typed_pool(deps, ref.kind, _pool_ns(claim), ref.name)
    if pool is None:
        return None
    try:
        return valid(pool)
    except PoolError as exc:
        raise _not_ready(deps, claim, exc) from exc


def _typed_pool(deps: ClaimDeps, kind: str, namespace: str, name: str) -> Pool | None:
    """Return a pool as last seen (cache, else one GET), typed (its spec's problem inside).

    None when it is gone. A body without ``kind`` is typed as ``kind``.
    """
    found = _typed(
        deps.cache.pools,
        (kind, namespace, name),
        _pool_typed,
        lambda: deps.kube.get_pool(namespace, kind, name),
    )
    if found is None:
        return None
    pool = found[1]
    if not pool.kind:
        return pool.model_copy(update={"kind": kind})
    return pool


def _not_ready(deps: ClaimDeps, claim: Claim, exc: PoolError) -> ClaimError:
    return ClaimError(
        Reason.POOL_NOT_READY,
        exc.message,
        delay=retry_delay(deps.settings, exc.reason if exc.needs_person else ""),
    )


@contextmanager
def _admitted(deps: ClaimDeps, claim: Claim, pool: Pool) -> Iterator[None]:
    """Run the enclosed IPAM work of ``claim`` once its pool's IPAM server admits it.

    ``pool`` is where the work goes (for a release, the recorded location). The server is
    ``scheme://host:port`` of ``spec.endpoint`` (`backends.transport.endpoint_key`, as the
    transport's registry keys it). The place is given back whatever the block does; its
    exception propagates unchanged.

    Raises
    ------
    _Wait
        Before the block runs, when the server is full: the claim parks under
        `bridge.objects.keys.endpoint_token` without a status write.
    backends.errors.EndpointUnavailableError
        Before the block runs, while the server's circuit breaker is open.
    """
    endpoint = endpoint_key(pool.endpoint)
    token = endpoint_token(endpoint)
    key = claim_key(claim.namespace, claim.name)
    if not (deps.places.may_take(token, key) and deps.flow.try_admit(endpoint)):
        raise _Wait(deps.places.wait(token, key))
    deps.places.took(token, key)
    with deps.flow.held(endpoint):
        yield


def _backend_error(deps: ClaimDeps, exc: BackendError, pool: Pool) -> ClaimError:
    return claim_error_from(
        exc,
        pool.display,
        retry_seconds=deps.settings.requeue_seconds,
        config_error_seconds=deps.settings.requeue_config_error_seconds,
        exhausted_seconds=deps.settings.requeue_exhausted_seconds,
    )


def _pool_ns(claim: Claim) -> str:
    """Return the namespace of the claim's pool: its own, or ``""`` for a Global pool."""
    return capi.pool_namespace(claim.pool_ref.kind, claim.namespace)


def _pool_display(claim: Claim) -> str:
    if claim.pool_ref.is_global:
        return f"{claim.pool_ref.kind} {claim.pool_ref.name}"
    return f"{claim.pool_ref.kind} {claim.namespace}/{claim.pool_ref.name}"


def _requested_address(deps: ClaimDeps, claim: Claim) -> str | None:
    """Return the normalised address the claim's requested-address annotation asks for.

    Raises
    ------
    ClaimError
        ``AllocationFailed`` when the annotation is not an IP address (a person must fix
        it; the annotation's change queues the claim again).
    """
    raw = claim.annotations.get(capi.REQUESTED_ADDRESS_ANNOTATION)
    if raw is None or not raw.strip():
        return None
    try:
        return str(ipaddress.ip_address(raw.strip()))
    except ValueError:
        raise ClaimError(
            Reason.ALLOCATION_FAILED,
            f"annotation {capi.REQUESTED_ADDRESS_ANNOTATION} {raw!r} is not an IP address",
            delay=deps.settings.requeue_config_error_seconds,
        ) from None


def _unavailable(deps: ClaimDeps, exc: AddressUnavailableError, pool: Pool) -> ClaimError:
    """Return the error of an unavailable requested address: names the address and its holder.

    Nothing was registered; the claim waits (a person frees the address or changes the
    annotation, whose change is an event of the claim) and looks again only after
    ``requeue_config_error_seconds``.
    """
    message = f"{pool.display}: requested address {exc.address} is not available: {exc.message}"
    if exc.holder and exc.holder not in exc.message:
        message += f" (held by {exc.holder})"
    return ClaimError(
        Reason.ALLOCATION_FAILED, message, delay=deps.settings.requeue_config_error_seconds
    )


def _taken(deps: ClaimDeps, exc: EntryOwnedError, pool: Pool) -> ClaimError:
    """Return the error of a hostname whose entry another management cluster or claim owns.

    Nothing was registered or changed: the entry is never adopted, released or repaired by
    this cluster. The message names the hostname, the entry's address, its owner (cluster id
    and claim) and the fix; the claim looks again only after
    ``requeue_config_error_seconds`` (a person must act), writing nothing while nothing
    changes.
    """
    owner = exc.owner
    cluster = (
        f"management cluster {owner.cluster_id}"
        if owner.cluster_id
        else "a management cluster of the previous release (no cluster id)"
    )
    message = (
        f"hostname {exc.hostname} is registered in {pool.display} at {exc.address} by claim "
        f"{owner.claim} of {cluster}: not adopted. Set spec.hostnameSuffix on "
        f"{pool.display} (a suffix of this management cluster's own) so that its hostnames "
        "differ, or remove that entry if nothing uses it"
    )
    return ClaimError(
        Reason.HOSTNAME_TAKEN, message, delay=retry_delay(deps.settings, Reason.HOSTNAME_TAKEN)
    )


# -- allocation ----------------------------------------------------------------------------


def _reconcile_live(deps: ClaimDeps, claim: Claim) -> Result:
    """Bind a live claim: answer from its IPAddress, or allocate one.

    A claim whose ``status.addressRef`` names its IPAddress costs no backend call. One
    without it whose IPAddress exists (rebuilt by ``clusterctl move`` or a restore, or a
    pass that stopped before its status write) first writes this cluster as the owner of
    the IPAM entry its IPAddress names (`_restamp`), then is shown bound.

    From its look at its pool to its finalizer write the claim counts in ``deps.holds``, so
    a pool's deletion guard never lets go of a pool this claim is about to register in.
    """
    address = _address_of(deps, claim)
    if address is not None and claim.address_ref is not None:
        return _update_bound(deps, claim, address)
    if address is None and (decided := _not_bound_to(deps, claim)) is not None:
        return decided

    _paused(deps, claim)
    ref = claim.pool_ref
    with deps.holds.holding((_pool_ns(claim), ref.kind, ref.name), claim.key):
        pool = _ready_pool(deps, claim)
        held = _add_finalizer(deps, claim, pool)
    if isinstance(held, Result):
        return held
    if address is not None:
        return _restamp(deps, held, pool, address)
    return _allocate(deps, held, pool)


def _restamp(deps: ClaimDeps, claim: Claim, pool: Pool, address: IPAddress) -> Result:
    """Write this cluster as the owner of the entry a rebuilt claim's IPAddress names; bind it.

    One backend call: ``allocate`` of the hostname the IPAddress was registered under, at
    its address, where its annotations say (`pool_backends.with_location`), with
    ``adopt`` that address: the IPAM returns the entry it holds there (its owner fields
    rewritten when another cluster, e.g. the source of a ``clusterctl move``, or the previous
    release wrote them), or registers the address again if the entry is gone. Nothing is
    counted as an allocation.

    Raises
    ------
    ClaimError
        ``HostnameTaken`` when the hostname's entry is at another address and owned by
        another cluster or claim; ``AllocationFailed`` when another entry holds the address;
        the pool's errors as for an allocation.
    _Wait
        When the pool's IPAM server is full.
    """
    hostname, where = _registered_at(claim, pool, address)
    held = str(address.spec.address or "")
    labels = (f"{pool.namespace}/{claim.pool_ref.name}", claim.pool_ref.kind)
    try:
        with _admitted(deps, claim, where):
            backend = deps.clients.backend_for(where, reuse=True)
            deps.metrics.call(
                BACKEND_NAMES[pool.kind],
                "allocate",
                lambda: backend.allocate(
                    hostname, owner_of(deps.settings, claim), held or None, adopt=held or None
                ),
            )
    except PoolError as exc:
        raise _not_ready(deps, claim, exc) from exc
    except EntryOwnedError as exc:
        deps.metrics.allocations.labels(*labels, Reason.HOSTNAME_TAKEN).inc()
        raise _taken(deps, exc, pool) from exc
    except AddressUnavailableError as exc:
        raise _unavailable(deps, exc, pool) from exc
    except BackendError as exc:
        raise _backend_error(deps, exc, pool) from exc
    log.info("claim %s: rebuilt from IPAddress %s (%s)", claim.key, address.metadata.name, held)
    return _update_bound(deps, claim, address, check_pause=False)


def _not_bound_to(deps: ClaimDeps, claim: Claim) -> Result | None:
    """Decide about an IPAddress of the claim's name that names it but does not bind it.

    A predecessor's (another claim uid, or none: its claim gone) is released and deleted
    when the API server confirms it (`_verified_orphan`), in this claim's pass, serialised;
    the claim is then looked at again. The claim's own, vanishing (being deleted, not held
    by ``ProtectAddress``), is waited for: its deletion queues the claim (`Owns()`).

    Returns
    -------
    Result or None
        What ends the pass; None when there is no such IPAddress (allocate as usual).
    """
    address = _cached_address(deps, claim.namespace, claim.name)
    if address is None or not _names_claim(address, claim):
        return None
    if _belongs_to(address, claim):
        return Result.done()  # vanishing: its DELETED event queues the claim again
    orphan = _verified_orphan(deps, claim.namespace, claim.name)
    if orphan is None:
        return None
    decided = _release_orphan(deps, orphan, "its claim is gone (another has its name)")
    return Result.requeue_after(0.0) if decided == Result.done() else decided


def _ready_pool(deps: ClaimDeps, claim: Claim) -> Pool:
    """Return the claim's pool when it is Ready for its current spec and not being deleted.

    Raises
    ------
    _Wait
        Parked under the pool's token while it is missing, being deleted or not Ready.
    ClaimError
        ``PoolNotReady`` when the pool's spec is invalid.
    """
    # Woken when the pool turns Ready (its reconcile) or is created; the resync is the net.
    waiting = Result.wait(pool_token(_pool_ns(claim), claim.pool_ref.kind, claim.pool_ref.name))
    pool = _pool_of(deps, claim)
    if pool is None:
        raise _Wait(
            waiting,
            ClaimError(Reason.POOL_NOT_READY, f"{_pool_display(claim)} not found", delay=0),
        )
    if pool.deleting:
        raise _Wait(
            waiting,
            ClaimError(Reason.POOL_NOT_READY, f"{pool.display} is being deleted", delay=0),
        )
    ready, _, message = pool.ready
    checked = pool.observed_generation == pool.generation
    if ready != "True" or not checked:
        # Only a pool whose current spec was checked Ready is asked for an address: claims of
        # a broken pool (credentials, subnet, IPAM down) wait for it instead of each asking
        # the IPAM (and each failing a login), and get no finalizer, so they never hold the
        # pool's deletion. A pool not checked yet (just created or changed) is waited for
        # without a status write: its check wakes the claim within moments.
        if ready != "False" or not checked:
            raise _Wait(waiting)
        raise _Wait(
            waiting,
            ClaimError(Reason.POOL_NOT_READY, f"{pool.display} is not ready: {message}", delay=0),
        )
    return pool


def _add_finalizer(deps: ClaimDeps, claim: Claim, pool: Pool) -> Claim | Result:
    """Put ``ReleaseAddress`` on the claim before anything is allocated (the contract).

    Returns
    -------
    Claim or Result
        The claim as stored after the write (or as read when it carried the finalizer);
        `Result.done` when the claim is gone (nothing may be allocated for it), a retry
        in one second when it changed since it was read (its watch event queues it too).

    Raises
    ------
    _Wait
        When the pool's IPAM server is full: parked before any write.
    """
    if capi.CLAIM_FINALIZER in claim.finalizers:
        return claim
    endpoint = endpoint_key(pool.endpoint)
    token, key = endpoint_token(endpoint), claim_key(claim.namespace, claim.name)
    if not deps.places.may_take(token, key):
        # Its IPAM server is busy: wait for a place before writing anything.
        raise _Wait(deps.places.wait(token, key))
    written = deps.kube.set_claim_finalizer(claim, capi.CLAIM_FINALIZER, True)
    return _after_finalizer_write(deps, claim, written)


def _after_finalizer_write(deps: ClaimDeps, claim: Claim, written: Write) -> Claim | Result:
    """Return the claim after a write of its finalizer, or the result that ends the pass.

    `Outcome.GONE`: done (the claim no longer exists; nothing is done for it).
    `Outcome.CONFLICT`: requeued after one second. Else the claim as stored, or ``claim``.
    """
    if written.outcome is Outcome.GONE:
        deps.metrics.pending(claim.key, None)
        return Result.done()
    if written.outcome is Outcome.CONFLICT:
        return Result.requeue_after(1.0)
    return _parsed(written.obj, claim)


def _parsed(stored: Mapping[str, Any] | None, claim: Claim) -> Claim:
    """Return the claim as a write returned it (``stored``), or ``claim`` when there is none."""
    return claim if stored is None else claim.updated(stored)


def _allocate(deps: ClaimDeps, claim: Claim, pool: Pool) -> Result:
    """Register the claim's hostname in the IPAM (find first) and bind the claim to it."""
    requested = _requested_address(deps, claim)
    if requested is None and deps.exhausted.held(pool.key):
        raise _wait_for_address(deps, pool)
    hostname = capi.hostname_for(claim, pool.hostname_suffix)
    labels = (f"{pool.namespace}/{claim.pool_ref.name}", claim.pool_ref.kind)
    try:
        with _admitted(deps, claim, pool):
            backend = deps.clients.backend_for(pool, reuse=True)
            allocation = deps.metrics.call(
                BACKEND_NAMES[pool.kind],
                "allocate",
                lambda: backend.allocate(hostname, owner_of(deps.settings, claim), requested),
            )
    except PoolError as exc:
        raise _not_ready(deps, claim, exc) from exc
    except EntryOwnedError as exc:
        deps.metrics.allocations.labels(*labels, Reason.HOSTNAME_TAKEN).inc()
        raise _taken(deps, exc, pool) from exc
    except AddressUnavailableError as exc:
        deps.metrics.allocations.labels(*labels, Reason.ALLOCATION_FAILED).inc()
        raise _unavailable(deps, exc, pool) from exc
    except BackendError as exc:
        error = _backend_error(deps, exc, pool)
        deps.metrics.allocations.labels(*labels, error.reason).inc()
        if error.reason == Reason.POOL_EXHAUSTED and requested is None:
            deps.exhausted.hold(pool.key)
            raise _wait_for_address(deps, pool) from exc
        raise error from exc
    deps.exhausted.lift(pool.key)
    # One address was free; there may be more: the next waiting claim of the pool tries.
    deps.queue.wake(pool_token(pool.namespace, pool.kind, pool.name), count=1)
    try:
        created = _register(deps, claim, pool, allocation, hostname)
    except ApiException:
        if not _gone(deps, claim):
            raise
        return _undo_entry(deps, claim, pool, labels)
    if created is None:
        return Result.requeue_after(1.0)  # deleted right after a 409: the next pass creates it
    deps.metrics.allocations.labels(*labels, "success").inc()
    log.info("claim %s: %s registered as %s", claim.key, allocation.address, hostname)
    return _update_bound(deps, claim, created, check_pause=False)


def _register(
    deps: ClaimDeps, claim: Claim, pool: Pool, allocation: Allocation, hostname: str
) -> IPAddress | None:
    """Create the claim's IPAddress for ``allocation``; adopt an existing one that is its own.

    An IPAddress of that name that exists (409) is read: it is adopted when it is this
    claim's (`_binds`: named by it, owned by its uid, not vanishing) and holds the address
    the IPAM gave ``hostname`` (a pass that created it before a restart or a cache lag).

    Returns
    -------
    IPAddress or None
        The claim's IPAddress; None when the existing one was deleted right after the 409,
        or names the claim but is a predecessor's or vanishing (the next pass decides).

    Raises
    ------
    ClaimError
        ``AllocationFailed`` when the existing IPAddress is not this claim's: one name is
        never handed to two addresses; a person must look.
    """
    new = capi.build_ip_address(
        claim,
        version=deps.versions.address,
        pool_uid=pool.uid,
        address=allocation.address,
        # The subnet's own: the backend folds the entry's and the pool's overrides in.
        prefix=allocation.prefix,
        gateway=allocation.gateway,
        hostname=hostname,
        location=location_of(pool),
    )
    written = deps.kube.create_ip_address(deps.versions.address, new)
    found = _parse_address(written.obj)
    if written.outcome is Outcome.CONFLICT and written.obj is None:
        return None
    conflict = written.outcome is Outcome.CONFLICT
    if conflict and found is not None and _names_claim(found, claim) and not _binds(found, claim):
        return None  # a predecessor's or a vanishing one: the next pass decides about it
    if written.outcome is Outcome.CONFLICT and not (
        found is not None
        and _binds(found, claim)
        and _same_address(str(found.spec.address or ""), allocation.address)
    ):
        raise ClaimError(
            Reason.ALLOCATION_FAILED,
            f"IPAddress {claim.namespace}/{claim.name} already exists and does not belong "
            f"to this claim and pool; {allocation.address} stays registered as {hostname}",
            delay=retry_delay(deps.settings, Reason.POOL_NOT_READY),
        )
    if found is None:
        raise ClaimError(
            Reason.ALLOCATION_FAILED,
            f"IPAddress {claim.namespace}/{claim.name} as stored is not an IPAddress",
            delay=retry_delay(deps.settings, Reason.POOL_NOT_READY),
        )
    return found


def _same_address(one: str, other: str) -> bool:
    """Return True when two textual IP addresses are the same address."""
    try:
        return ipaddress.ip_address(one) == ipaddress.ip_address(other)
    except ValueError:
        return one == other


def _wait_for_address(deps: ClaimDeps, pool: Pool) -> _Wait:
    """Park a claim of an exhausted pool until an address is freed; show ``PoolExhausted``.

    The claim is woken by a release in the pool, or by the pool's own probe of its IPAM
    (`bridge.reconcilers.pools.reconcile_pool` looks again every ``requeue_exhausted_seconds``
    while claims wait, and wakes one when an address is free): waiting claims poll neither
    the API nor the IPAM.
    """
    deps.queue.add(
        pool_key(pool.namespace, pool.kind, pool.name),
        after=retry_delay(deps.settings, Reason.POOL_EXHAUSTED),
    )
    return _Wait(
        Result.wait(pool_token(pool.namespace, pool.kind, pool.name)),
        ClaimError(Reason.POOL_EXHAUSTED, exhausted_message(pool.display), delay=0),
    )


def _update_bound(
    deps: ClaimDeps,
    claim: Claim,
    address: IPAddress,
    *,
    check_pause: bool = True,
) -> Result:
    """Show a claim as bound to ``address``; no write (and no Cluster read) when it already is.

    A claim recreated without status (``clusterctl move``) is rebuilt from its IPAddress, once
    its Cluster is not paused. The ``ReleaseAddress`` finalizer is put back if missing.
    """
    deps.metrics.pending(claim.key, None)
    name = address.metadata.name
    message = f"address {address.spec.address}/{address.spec.prefix} from {_pool_display(claim)}"
    status = _status(deps, claim, ready=True, reason=Reason.ALLOCATED, message=message, ref=name)
    missing_finalizer = capi.CLAIM_FINALIZER not in claim.finalizers
    if not _changes(claim, status) and not missing_finalizer:
        return Result.done()
    if check_pause:
        _paused(deps, claim)
    if missing_finalizer:
        written = deps.kube.set_claim_finalizer(claim, capi.CLAIM_FINALIZER, True)
        if written.outcome is Outcome.GONE:
            return _undo(deps, claim)
        held = _after_finalizer_write(deps, claim, written)
        if isinstance(held, Result):
            return held
        claim = held
    if not _update_status(
        deps, claim, ready=True, reason=Reason.ALLOCATED, message=message, ref=name
    ):
        return _undo(deps, claim)
    return Result.done()


def _gone(deps: ClaimDeps, claim: Claim) -> bool:
    """Return True when the API server has no claim of this name and uid (one GET)."""
    body = deps.kube.get_claim(deps.versions.address, claim.namespace, claim.name)
    return body is None or not _is_this_claim(body, claim)


def _is_this_claim(body: Mapping[str, Any], claim: Claim) -> bool:
    """Return True when ``body`` (a claim as read) is ``claim`` itself (its uid)."""
    return str((body.get("metadata") or {}).get("uid") or "") == claim.uid


def _undo_entry(deps: ClaimDeps, claim: Claim, pool: Pool, labels: tuple[str, str]) -> Result:
    """Release the entry just registered for a claim gone before its IPAddress was created.

    The IPAddress create failed (e.g. 403: the namespace is being terminated) and the claim
    is gone (`_gone`): no IPAddress names the entry for a later pass to find, so this pass
    releases it now (`_release_in_ipam`, this claim's entry only), with one log line.
    """
    hostname, _, had = _release_in_ipam(deps, claim, pool, None, labels)
    _log_release(
        claim,
        "released",
        f"its claim is gone and its IPAddress could not be created; {hostname} "
        + ("released" if had else "was not registered"),
    )
    return Result.done()


def _undo(deps: ClaimDeps, claim: Claim) -> Result:
    """Undo at once what was done for a claim found gone after its address was registered.

    A 200 on our finalizer write does not keep the claim: a DELETE in flight that read it
    without finalizers removes it anyway (real-cluster.md 13e). Its IPAddress (this claim's,
    checked against the API server, `_verified_orphan`) is released in the IPAM and deleted
    (`_release_orphan`), with one log line as every release.
    """
    orphan = _verified_orphan(deps, claim.namespace, claim.name)
    if orphan is None:
        return Result.done()
    return _release_orphan(deps, orphan, "its claim is gone (found by a write of ours)")


# -- release -------------------------------------------------------------------------------


def _release(deps: ClaimDeps, claim: Claim) -> Result:
    """Release a claim being deleted that carries our ``ReleaseAddress`` finalizer.

    Every decision is one INFO log line ``release of claim <ns>/<name>: <decision>: ...``
    (released; skipped and why; waiting and on what).

    Raises
    ------
    _Wait, ClaimError, kubernetes.client.ApiException
        As `_release_decided` (logged here).
    """
    if capi.CLAIM_FINALIZER not in claim.finalizers:
        return Result.done()  # nothing of ours holds the claim
    try:
        return _release_decided(deps, claim)
    except _Wait as wait:
        _log_release(claim, "waiting", _waiting_on(wait))
        raise
    except ClaimError as error:
        _log_release(
            claim, "waiting", f"{error.reason}: {error.message}; again in {error.delay:g} s"
        )
        raise
    except ApiException as exc:
        _log_release(claim, "waiting", f"the API server answered {exc.status} {exc.reason}")
        raise


def _log_release(claim: Claim, decision: str, message: str) -> None:
    """Log one release decision of a deleted claim (one INFO line)."""
    log.info("release of claim %s: %s: %s", claim.key, decision, message)


def _waiting_on(wait: _Wait) -> str:
    """Return what a release's `_Wait` waits on, for its log line."""
    if wait.error is not None:
        return f"{wait.error.reason}: {wait.error.message}"
    decision = wait.decision
    if decision.wake_on:
        return "until woken by " + ", ".join(str(token) for token in decision.wake_on)
    return f"again in {decision.after:g} s" if decision.after is not None else "until queued"


def _release_decided(deps: ClaimDeps, claim: Claim) -> Result:
    """Release the claim (`_release`): free its IPAM entry, delete its IPAddress, let it go.

    Proceeds when the Cluster is gone; waits while paused. When the pool no longer exists the
    IPAM cannot be reached (its server URL and credentials went with it): the address is left in
    the IPAM, a Warning says so, and the claim is let go.

    The release is skipped (the IPAM entry kept) only on positive evidence of a
    ``clusterctl move``: its annotation (`capi.MOVE_ANNOTATION`) on the claim or its
    IPAddress as the API server has them. Whenever the cache does not show the claim's
    IPAddress (bound or not: a leader may have stopped between the IPAddress's create and
    the status write), or shows that annotation, the claim and its IPAddress are read from
    the API (`_from_api`): the cache can say "absent" wrongly, and letting a claim go
    without a release, or leaving its IPAddress behind, cannot be undone.
    """
    _paused(deps, claim)
    address = _address_of(deps, claim, binding=False)
    labels = (f"{_pool_ns(claim)}/{claim.pool_ref.name}", claim.pool_ref.kind)
    problem = None
    if address is None or _moved(claim.annotations, address):
        read = _from_api(deps, claim)
        if read is None:
            _log_release(claim, "done", "the claim or our finalizer is gone")
            return Result.done()
        claim, address, problem, moved = read
        if moved is not None:
            message = (
                f"{moved} carries {capi.MOVE_ANNOTATION} (clusterctl move): the IPAM entry "
                f"of {claim.key} is left as it is, for the moved claim"
            )
            return _finish_release(deps, claim, Reason.RELEASE_SKIPPED, message, labels, "skipped")

    pool = _pool_of(deps, claim)
    registered = address.spec.address if address is not None else None
    if pool is None:
        if address is not None:
            _delete_address(deps, claim, address)
        message = (
            f"{_pool_display(claim)} is gone; address {registered or '(none)'} could "
            "not be released in the IPAM"
        )
        return _finish_release(deps, claim, Reason.RELEASE_SKIPPED, message, labels, "skipped")

    if problem is not None:
        log.warning("claim %s: %s", claim.key, problem)
        deps.events.post(claim.as_object(), "Warning", Reason.ADDRESS_CONFLICT, problem)
    hostname, until, released = _release_in_ipam(deps, claim, pool, address, labels)
    if address is not None:
        _delete_address(deps, claim, address)
    message = _released_message(pool, registered or hostname, hostname, released, until)
    if problem is not None:
        message += f" ({problem})"
    decision = _finish_release(deps, claim, Reason.RELEASED, message, labels, "success")
    if until is None:
        # An address was freed: the longest waiting claim of this pool may now get it.
        deps.exhausted.lift(pool.key)
        deps.queue.wake(pool_token(pool.namespace, pool.kind, pool.name), count=1)
    return decision


def _moved(annotations: Mapping[str, str], address: IPAddress | None) -> bool:
    """Return True when the claim's or its IPAddress's annotations show a clusterctl move."""
    if capi.MOVE_ANNOTATION in annotations:
        return True
    return address is not None and capi.MOVE_ANNOTATION in address.metadata.annotations


def _from_api(
    deps: ClaimDeps, claim: Claim
) -> tuple[Claim, IPAddress | None, str | None, str | None] | None:
    """Read the claim and its IPAddress from the API server (GET, never the cache).

    Returns
    -------
    tuple or None
        None when the claim is gone, is another object of its name (another uid), or no
        longer carries our finalizer. Else the claim as read; its IPAddress when it exists
        and names the claim and its pool (`_names_claim`: its own, or a predecessor's of
        its name, which holds the same hostname's entry; None when absent, not valid, or
        another claim's); why an
        IPAddress that exists is not used (None: no such problem); and which object carries
        `capi.MOVE_ANNOTATION` (None: neither).

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found".
    """
    version = deps.versions.address
    body = deps.kube.get_claim(version, claim.namespace, claim.name)
    read = _claim_typed(body)[1] if body is not None else None
    if read is None or read.uid != claim.uid or capi.CLAIM_FINALIZER not in read.finalizers:
        return None
    name = read.address_ref or read.name
    what = f"IPAddress {read.namespace}/{name}"
    found = deps.kube.get_ip_address(version, read.namespace, name)
    address = _parse_address(found)
    annotations = (found or {}).get("metadata", {}).get("annotations") or {}
    moved = f"claim {read.key}" if capi.MOVE_ANNOTATION in read.annotations else None
    if moved is None and isinstance(annotations, Mapping) and capi.MOVE_ANNOTATION in annotations:
        moved = what
    problem = None
    if found is not None and address is None:
        problem = f"{what} is not a valid IPAddress: left as it is, not deleted"
    elif address is not None and not _names_claim(address, read):
        ref = address.spec.claim_ref.name
        problem = f"{what} is another claim's ({ref}): left as it is, not deleted"
        address = None
    return read, address, problem, moved


def _orphan(deps: ClaimDeps, namespace: str, name: str) -> Result:
    """Release what an IPAddress of ours holds whose claim is gone (the claim's key, gone).

    Its claim may be gone with its finalizer still on (a DELETE in flight wins over our
    finalizer write, real-cluster.md 13e), or let go by hand; its IPAddress, live (the pool
    still owns it: the garbage collector only drops the claim from its owners, 13f) or being
    deleted, still names its IPAM entry. Such an IPAddress (named after the claim, of one of
    our pool kinds, without `capi.MOVE_ANNOTATION`) is checked against the API server
    (`_verified_orphan`), then released as a claim's (`_release_orphan`). IPAddress events
    queue their claim's key (`Owns()`), so this runs in that key's pass, serialised with a
    claim made again under the name.
    """
    cached = _cached_address(deps, namespace, name)
    if cached is None or not _orphan_shaped(cached, name):
        return Result.done()
    expectations, key = deps.cache.expectations, ("ipaddresses", namespace, name)
    if left := expectations.pending(key, deps.cache.addresses.version(key[1:]) or GONE):
        # Our own write of it (a release's deletion) is on its way: its event decides.
        return Result.wait(expectations.token(key), at_most=left)
    orphan = _verified_orphan(deps, namespace, name)
    if orphan is None:
        return Result.done()
    return _release_orphan(deps, orphan, "its claim is gone")


def _orphan_shaped(address: IPAddress, name: str) -> bool:
    """Return True for an IPAddress of ours, named after claim ``name``, not being moved."""
    meta, ref = address.metadata, address.spec.pool_ref
    return (
        meta.name == name
        and address.spec.claim_ref.name == name
        and capi.MOVE_ANNOTATION not in meta.annotations
        and ref.api_group == capi.GROUP
        and ref.kind in capi.POOL_KINDS
    )


def _verified_orphan(deps: ClaimDeps, namespace: str, name: str) -> IPAddress | None:
    """Return the IPAddress ``name`` when the API server shows it an orphan, else None.

    Read from the API server (GET, never the cache): the IPAddress, of our shape
    (`_orphan_shaped`), and the claim of its name, which must not be the IPAddress's owner:
    absent, or another uid (a successor made again under the name), or the IPAddress names
    no claim owner any more (the garbage collector dropped it: that claim is gone).

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found".
    """
    version = deps.versions.address
    address = _parse_address(deps.kube.get_ip_address(version, namespace, name))
    if address is None or not _orphan_shaped(address, name):
        return None
    owner = _claim_owner(address)
    body = deps.kube.get_claim(version, namespace, name)
    if body is not None and owner is not None:
        uid = str((body.get("metadata") or {}).get("uid") or "")
        if uid == owner:
            return None  # its claim exists: that claim's pass decides
    return address


def _release_orphan(deps: ClaimDeps, address: IPAddress, why: str) -> Result:
    """Release an orphan IPAddress's IPAM entry where its annotations say, then delete it.

    Waits (and keeps it) while its Cluster (the cluster-name label) is paused: a
    ``clusterctl move`` deletes claims before it annotates their IPAddresses. One INFO line
    says what was decided, as for every release (`_log_release`).

    Returns
    -------
    Result
        Done; a wait while paused or the IPAM server is full; a retry after a failure of
        the IPAM (the IPAddress is kept, so a later pass finds it again).

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found" and conflicts.
    """
    meta, ref = address.metadata, address.spec.pool_ref
    claim = Claim.from_body(
        {
            "apiVersion": address.api_version,
            "metadata": {
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": _claim_owner(address) or "",
                "labels": dict(meta.labels),
                "deletionTimestamp": meta.deletion_timestamp or "orphan",
            },
            "spec": {"poolRef": {"apiGroup": ref.api_group, "kind": ref.kind, "name": ref.name}},
        }
    )
    try:
        _paused(deps, claim)
        pool = _pool_of(deps, claim)
        message = f"{_pool_display(claim)} is gone; {address.spec.address} left in the IPAM"
        if pool is not None:
            labels = (f"{_pool_ns(claim)}/{ref.name}", ref.kind)
            hostname, until, released = _release_in_ipam(deps, claim, pool, address, labels)
            registered = address.spec.address or hostname
            message = _released_message(pool, registered, hostname, released, until)
        _delete_address(deps, claim, address)
    except _Wait as wait:
        _log_release(claim, "waiting", f"{why}: {_waiting_on(wait)}")
        return wait.decision
    except ClaimError as error:
        _log_release(claim, "waiting", f"{why}: {error.reason}: {error.message}")
        return Result.requeue_after(error.delay)
    _log_release(claim, "released", f"{why}; IPAddress {meta.name} deleted; {message}")
    return Result.done()


def _registered_at(claim: Claim, pool: Pool, address: IPAddress | None) -> tuple[str, Pool]:
    """Return the hostname and the pool location the claim's entry was registered under.

    What the IPAddress's annotations record (`capi.HOSTNAME_ANNOTATION`,
    `capi.LOCATION_ANNOTATION`, through `pool_backends.with_location`), else the claim's
    hostname in the pool as it is now (no IPAddress, or one without the annotations).
    """
    annotations = address.metadata.annotations if address is not None else {}
    hostname = annotations.get(capi.HOSTNAME_ANNOTATION) or capi.hostname_for(
        claim, pool.hostname_suffix
    )
    return hostname, with_location(pool, annotations.get(capi.LOCATION_ANNOTATION))


def _release_in_ipam(
    deps: ClaimDeps,
    claim: Claim,
    pool: Pool,
    address: IPAddress | None,
    labels: tuple[str, str],
) -> tuple[str, float | None, bool]:
    """Release the claim's entry where its allocation went (the IPAddress's location).

    With a grace period the entry stays in the IPAM, quarantined until then.

    Returns
    -------
    tuple
        The hostname released, the POSIX time its quarantine ends (None: released at
        once), and whether the IPAM had it.

    Raises
    ------
    ClaimError
        When the pool's client cannot be built or the IPAM call fails (counted).
    _Wait
        When the pool's IPAM server is full.
    """
    hostname, where = _registered_at(claim, pool, address)
    until = time.time() + pool.grace_period_seconds if pool.grace_period_seconds > 0 else None
    owner = owner_of(deps.settings, claim)
    held = address.spec.address if address is not None else None
    try:
        with _admitted(deps, claim, where):
            backend = deps.clients.backend_for(where, reuse=True)
            released = deps.metrics.call(
                BACKEND_NAMES[pool.kind],
                "release",
                lambda: backend.release(hostname, owner, until, address=held),
            )
    except PoolError as exc:
        deps.metrics.releases.labels(*labels, Reason.POOL_NOT_READY).inc()
        raise _not_ready(deps, claim, exc) from exc
    except BackendError as exc:
        error = _backend_error(deps, exc, pool)
        deps.metrics.releases.labels(*labels, error.reason).inc()
        raise error from exc
    return hostname, until, bool(released)


def _released_message(
    pool: Pool, what: str, hostname: str, released: bool, until: float | None
) -> str:
    """Return what a release did, for the log."""
    if not released:
        return f"{hostname} was not registered in {pool.display}; nothing to release"
    if until is not None:
        return (
            f"released {what} in {pool.display}; quarantined for "
            f"{pool.grace_period_seconds} s before it may be handed out again"
        )
    return f"released {what} in {pool.display}"


def _delete_address(deps: ClaimDeps, claim: Claim, address: IPAddress) -> None:
    """Delete the claim's IPAddress (gone already is success).

    Raises
    ------
    _Wait
        A retry in one second when a 409 Conflict persists (the next pass decides again
        from the IPAM and the IPAddress).
    """
    deleted = deps.kube.delete_ip_address(
        deps.versions.address, claim.namespace, address.metadata.name, _last_seen(address)
    )
    if deleted.outcome is Outcome.CONFLICT:
        raise _Wait(Result.requeue_after(1.0))


def _finish_release(
    deps: ClaimDeps,
    claim: Claim,
    reason: Reason,
    message: str,
    labels: tuple[str, str],
    result: str,
) -> Result:
    """Remove ``ReleaseAddress`` from the claim, count, warn when skipped, queue the pool.

    A 409 on the finalizer write (the claim changed since it was read) reads the claim again
    from the API server and decides from it (`_let_go`), never releasing again; only when
    409s persist is the pass retried in one second (counting nothing). The decision is
    logged as one INFO line.
    """
    if not _let_go(deps, claim):
        _log_release(claim, "waiting", f"{reason}, but our finalizer's removal met 409s: again")
        return Result.requeue_after(1.0)
    deps.metrics.releases.labels(*labels, result).inc()
    deps.metrics.pending(claim.key, None)
    _log_release(claim, "skipped" if reason == Reason.RELEASE_SKIPPED else "released", message)
    if reason == Reason.RELEASE_SKIPPED:
        deps.events.post(claim.as_object(), "Warning", reason, message)
    # A release that went as it should posts no Event: the claim is going away.
    # A pool being deleted waits for its claims: look at it again now. A live pool is not
    # checked per release (its periodic refresh keeps its usage current).
    ref = claim.pool_ref
    cached = deps.cache.pools.lookup_typed((ref.kind, _pool_ns(claim), ref.name), _pool_typed)
    if isinstance(cached, str) or cached[1].deleting:
        deps.queue.add(pool_key(_pool_ns(claim), ref.kind, ref.name))
    return Result.done()


def _let_go(deps: ClaimDeps, claim: Claim) -> bool:
    """Remove ``ReleaseAddress`` from a released claim; return False while 409s persist.

    On 409 Conflict the claim is read again from the API server (a Kubernetes client's
    conflict retry: read, decide, write again): gone, another uid under its name, or without
    our finalizer, it is let go already (True); else the removal is written again on the
    claim as read, at most `STATUS_ATTEMPTS` times.
    """
    current = claim
    for _ in range(STATUS_ATTEMPTS):
        written = deps.kube.set_claim_finalizer(current, capi.CLAIM_FINALIZER, False)
        if written.outcome is not Outcome.CONFLICT:
            return True
        body = deps.kube.get_claim(deps.versions.address, claim.namespace, claim.name)
        read = _claim_typed(body)[1] if body is not None else None
        if read is None or read.uid != claim.uid or capi.CLAIM_FINALIZER not in read.finalizers:
            return True
        current = read
    return False


# -- status --------------------------------------------------------------------------------


def _status(
    deps: ClaimDeps,
    claim: Claim,
    *,
    ready: bool,
    reason: Reason,
    message: str,
    ref: str | None = None,
) -> dict[str, Any]:
    return capi.claim_status(
        claim,
        ready=ready,
        reason=reason,
        message=message,
        address_ref=ref,
        v1beta2_kept=deps.versions.v1beta2_kept is not False,
    )


def _changes(claim: Claim, status: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keys of ``status`` whose value differs from the claim's current status."""
    current = claim.status
    return {key: value for key, value in status.items() if current.get(key) != value}


def _changed_since(before: Claim, after: Claim) -> bool:
    """Return True when ``after`` differs from ``before`` in what a claim's decision reads.

    Compared: the deletion, the generation (the spec), annotations and labels (not
    finalizers: a pass may have written its own).
    """
    return (
        before.deleting != after.deleting
        or before.generation != after.generation
        or before.annotations != after.annotations
        or before.labels != after.labels
    )


#: Re-reads of a claim whose status write met 409 Conflict before the write is left to the
#: claim's next pass (each re-read means another writer just wrote).
STATUS_ATTEMPTS = 5


class _ClaimGone(Exception):  # noqa: N818 - control flow: the claim no longer exists
    """A write or a read of the claim found it gone (404, or another uid under its name)."""


def _write_status(
    deps: ClaimDeps,
    claim: Claim,
    *,
    ready: bool,
    reason: Reason,
    message: str,
    ref: str | None,
) -> Claim | None:
    """Merge-patch the claim's status guarded by its resourceVersion; return it as stored.

    On 409 Conflict the claim is read again from the API: when what the decision rests on
    changed (`_changed_since`: a deletion, the spec, annotations, labels) nothing is
    written and the claim is queued to decide again; else the status is merged into the
    claim as it is now and written again, guarded by that version (at most
    `STATUS_ATTEMPTS` writes; then the claim is queued). None: not written (queued).

    Raises
    ------
    _ClaimGone
        When the write answers 404, or the claim read again is gone or another object of
        its name (another uid).
    """
    key = claim_key(claim.namespace, claim.name)
    current = claim
    for _ in range(STATUS_ATTEMPTS):
        status = _status(deps, current, ready=ready, reason=reason, message=message, ref=ref)
        changed = _changes(current, status)
        if not changed:
            return current
        written = deps.kube.patch_claim_status(
            deps.versions.address,
            claim.namespace,
            claim.name,
            changed,
            resource_version=current.resource_version or None,
        )
        if written.outcome is Outcome.GONE:
            raise _ClaimGone
        if written.outcome is not Outcome.CONFLICT:
            return _parsed(written.obj, current)
        body = deps.kube.get_claim(deps.versions.address, claim.namespace, claim.name)
        if body is None or not _is_this_claim(body, claim):
            raise _ClaimGone  # gone, or another claim made again under its name
        fresh = current.updated(body)
        if _changed_since(claim, fresh):
            break
        current = fresh
    log.info("claim %s: status not written (the claim changed): deciding again", key)
    deps.queue.add(key)
    return None


def _update_status(
    deps: ClaimDeps,
    claim: Claim,
    *,
    ready: bool,
    reason: Reason,
    message: str,
    ref: str | None = None,
) -> bool:
    """Write the claim's Ready condition (and addressRef) where it changed; Event on change.

    Returns False when the claim was found gone (`_write_status`), else True.

    An unchanged status is never written again. The write is guarded by the resourceVersion
    the status was merged into (`_write_status`), so a condition another writer added since
    is never dropped. On a v1beta1 claim the first write shows whether the served schema
    keeps ``status.v1beta2`` (CAPI >= 1.9): the API server returns what it stored, and what
    it pruned is never written again.
    """
    status = _status(deps, claim, ready=ready, reason=reason, message=message, ref=ref)
    changed = _changes(claim, status)
    if not changed:
        return True
    try:
        stored = _write_status(deps, claim, ready=ready, reason=reason, message=message, ref=ref)
    except _ClaimGone:
        return False  # nobody is left to read its status or an Event
    if stored is None:
        return True  # decided again
    if claim.version == "v1beta1" and "v1beta2" in changed:
        kept = "v1beta2" in stored.status
        if deps.versions.v1beta2_kept != kept:
            deps.versions.v1beta2_kept = kept
            log.info(
                "the served v1beta1 IPAddressClaim schema %s status.v1beta2",
                "keeps" if kept else "prunes",
            )
    before = claim.ready
    # An Event tells a person what changed: a wait or a failure, and the end of one. The
    # plain success path (no condition before) posts none: its Ready condition says it all,
    # and an allocation stays at three API writes (finalizer, IPAddress, status).
    if before != ("True" if ready else "False", reason) and (not ready or before[0] is not None):
        deps.events.post(claim.as_object(), "Normal" if ready else "Warning", reason, message)
    return True
