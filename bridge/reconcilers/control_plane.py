"""Control-plane endpoints of workload clusters from the IPAM.

A CAPI ``Cluster`` (``cluster.x-k8s.io`` v1beta2 or v1beta1) opts in with annotations:

- `POOL_ANNOTATION` ``<Kind>/<name>``: one of our pool kinds (a namespaced pool of the
  Cluster's namespace, or a Global pool); a kind that is not ours is left to other providers;
- `VARIABLES_ANNOTATION` ``<name>[,<name>...]``: ClusterClass topology variables
  (``spec.topology.variables``) that receive the address as a string;
- `UNPAUSE_ANNOTATION` ``"true"``: the Cluster was created with ``spec.paused: true`` to wait
  for its endpoint; it is unpaused in the write that gives it the endpoint;
- `HOST_ANNOTATION` ``dns``: with an Infoblox pool that sets ``dnsZone``, the endpoint's
  ``host`` is the FQDN of the host record (``<claim hostname>.<zone>``) instead of the address.

`reconcile_cluster` decides from the Cluster as it is now (level-triggered; a resync, a
restart or a repeated event leads to the same result and no extra write):

1. it ensures the IPAddressClaim `endpoint_claim_name` in the Cluster's namespace (poolRef
   from the annotation, ``spec.clusterName``, the cluster-name label, `ENDPOINT_LABEL`, an
   owner reference to the Cluster: it moves with the Cluster and goes with it), which
   `bridge.reconcilers.claims` serves like any claim, allocating it even while the Cluster is paused
   (`allocates_while_paused`). A Cluster whose endpoint is already set gets no claim (an
   address it could not use): a Warning says so, unless it is paused (a ``clusterctl move``
   creates the Cluster before its claim);
2. once that claim is bound (``status.addressRef`` and its IPAddress), a Cluster without a
   ClusterClass (no ``spec.topology``: the class's patches carry the address otherwise) first
   gets the address into the objects it names (`bridge.reconcilers.endpoint_targets`): the
   InfraCluster of ``spec.infrastructureRef`` and the KubeadmControlPlane of
   ``spec.controlPlaneRef`` (kube-vip, certSANs), one patch each, each only where empty;
3. then it patches the Cluster once: ``spec.controlPlaneEndpoint`` (host; port kept, else
   `DEFAULT_PORT`), the listed topology variables, and ``spec.paused: false`` when asked,
   last: a Cluster to unpause is written only once every place holds the address, so CAPI
   creates no Machine before kube-vip knows it. Each patch carries the resourceVersion read,
   so it never overwrites what changed meanwhile, and a value already set to another one is
   never touched (Warning Event instead).

Bad input (a malformed annotation, a claim of that name that is not this Cluster's, a pool
the claim waits for, a write the API server refuses) is a Warning Event on the Cluster, told
once per problem (`context.Notices`), and nothing else. Removing the annotation leaves
the claim and the endpoint as they are.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client import ApiException
from pydantic import ValidationError

from bridge import capi
from bridge.capi import (
    CLUSTER_GROUP,
    CLUSTER_NAME_LABEL,
    GROUP,
    POOL_KINDS,
    Claim,
    Cluster,
    ObjectRef,
    PoolRef,
)
from bridge.models import IPAddress, IPPool
from bridge.reconcilers.context import Notices, ServedVersions
from bridge.reconcilers.endpoint_targets import TargetPlan, plan_control_plane, plan_infra_cluster
from bridge.runtime.events import EventSink
from bridge.runtime.gateway import NotServedError, Outcome, Resource, Write, api_status_message
from bridge.runtime.workqueue import Result

__all__ = [
    "CLAIM_SUFFIX",
    "DEFAULT_PORT",
    "ENDPOINT_LABEL",
    "HOST_ANNOTATION",
    "KCP_GROUP",
    "POOL_ANNOTATION",
    "UNPAUSE_ANNOTATION",
    "VARIABLES_ANNOTATION",
    "AnnotationError",
    "ClusterApi",
    "ClusterDeps",
    "EndpointReason",
    "EndpointRequest",
    "Plan",
    "TargetApi",
    "allocates_while_paused",
    "build_claim",
    "endpoint_claim_name",
    "is_endpoint_claim",
    "parse_request",
    "plan_patch",
    "reconcile_cluster",
    "wants_endpoint",
]

log = logging.getLogger(__name__)

#: ``<Kind>/<name>`` of the pool the Cluster's control-plane endpoint comes from.
POOL_ANNOTATION = "ipam.cluster.x-k8s.io/control-plane-endpoint-pool"
#: Comma-separated ClusterClass variables that receive the address (a string).
VARIABLES_ANNOTATION = "ipam.cluster.x-k8s.io/control-plane-endpoint-variables"
#: ``"true"``: set ``spec.paused: false`` in the write that sets the endpoint.
UNPAUSE_ANNOTATION = "ipam.cluster.x-k8s.io/control-plane-endpoint-unpause"
#: ``dns``: the endpoint's host is the DNS name of the address (Infoblox with ``dnsZone``);
#: ``address`` (the default): the address itself.
HOST_ANNOTATION = "ipam.cluster.x-k8s.io/control-plane-endpoint-host"
#: Label on the claims this module creates (value ``"true"``).
ENDPOINT_LABEL = "ipam.cluster.x-k8s.io/control-plane-endpoint"
#: Name of a Cluster's endpoint claim: ``<cluster>`` + this (`endpoint_claim_name`).
CLAIM_SUFFIX = "-control-plane-endpoint"
#: ``spec.controlPlaneEndpoint.port`` written when the Cluster sets none (kube-apiserver's).
DEFAULT_PORT = 6443
#: Longest claim name: a DNS label, because the claim's name is the first label of its
#: hostname in the IPAM (``<claim>.<namespace>``, a DNS host record with Infoblox).
MAX_CLAIM_NAME = 63

_KIND = re.compile(r"^[A-Za-z]([-A-Za-z0-9]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VARIABLE = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.]*$")


class EndpointReason(enum.StrEnum):
    """Reasons of the Events ipam-bridge posts on Clusters."""

    #: Normal: the endpoint claim was created.
    CLAIMED = "ControlPlaneEndpointClaimed"
    #: Normal: the Cluster got its endpoint (and variables, unpause) in one write.
    SET = "ControlPlaneEndpointSet"
    #: Warning: an annotation cannot be read; nothing is done.
    INVALID = "InvalidControlPlaneEndpointAnnotation"
    #: Warning: the endpoint is already set to another host; it is left as it is.
    CONFLICT = "ControlPlaneEndpointConflict"
    #: Warning: the endpoint claim waits (pool missing or not ready, exhausted...).
    PENDING = "ControlPlaneEndpointPending"
    #: Warning: a claim of the endpoint claim's name is not this Cluster's, or names
    #: another pool than the annotation.
    CLAIM_MISMATCH = "ControlPlaneEndpointClaimMismatch"
    #: Warning: the API server refused the claim or the Cluster patch (webhook, schema,
    #: RBAC): a person must look.
    REFUSED = "ControlPlaneEndpointRefused"
    #: Normal: an object the Cluster names (InfraCluster, KubeadmControlPlane) got the address.
    COPIED = "ControlPlaneEndpointCopied"
    #: Warning: the KubeadmControlPlane has Machines; writing would roll them out: not written.
    ROLLOUT = "ControlPlaneEndpointWouldRollOut"
    #: Warning: the operator may not read or patch an object the Cluster names (RBAC).
    FORBIDDEN = "ControlPlaneEndpointForbidden"
    #: Warning: the Cluster stays paused until every object it names holds the address.
    WAITING = "ControlPlaneEndpointWaiting"


class AnnotationError(ValueError):
    """An endpoint annotation of a Cluster cannot be read; the message says which and why."""


@dataclass(frozen=True)
class EndpointRequest:
    """What a Cluster's annotations ask for.

    Attributes
    ----------
    pool:
        The pool reference the endpoint claim gets (``apiGroup`` is ours).
    variables:
        Topology variable names that receive the address, in the order given.
    unpause:
        Set ``spec.paused: false`` in the write that sets the endpoint.
    host_dns:
        The endpoint's host is the address's FQDN (`HOST_ANNOTATION` ``dns``).
    """

    pool: PoolRef
    variables: tuple[str, ...] = ()
    unpause: bool = False
    host_dns: bool = False


def wants_endpoint(annotations: Mapping[str, str] | None) -> bool:
    """Return True when a Cluster carries `POOL_ANNOTATION` (cheap filter of its events)."""
    return POOL_ANNOTATION in (annotations or {})


def parse_request(annotations: Mapping[str, str] | None) -> EndpointRequest | None:
    """Read a Cluster's endpoint annotations.

    Returns
    -------
    EndpointRequest or None
        None when `POOL_ANNOTATION` is absent, or names a kind that is not one of ours
        (`bridge.capi.POOL_KINDS`: another provider may serve it).

    Raises
    ------
    AnnotationError
        When a value is malformed: the pool is not ``<Kind>/<name>`` (a DNS subdomain name),
        a variable name is empty or not a name, `UNPAUSE_ANNOTATION` is not ``true`` or
        ``false``, `HOST_ANNOTATION` is not ``dns`` or ``address``.
    """
    annotations = annotations or {}
    value = annotations.get(POOL_ANNOTATION)
    if value is None:
        return None
    kind, slash, name = value.strip().partition("/")
    if not slash or not _KIND.match(kind) or not _NAME.match(name) or len(name) > 253:
        raise AnnotationError(
            f"{POOL_ANNOTATION}: {value!r} is not <Kind>/<name> "
            f"(e.g. PHPIPAMIPPool/vip-pool; kinds: {', '.join(POOL_KINDS)})"
        )
    if kind not in POOL_KINDS:
        return None
    variables: list[str] = []
    raw = annotations.get(VARIABLES_ANNOTATION)
    if raw is not None:
        for item in raw.split(","):
            item = item.strip()
            if not item or not _VARIABLE.match(item) or len(item) > 256:
                raise AnnotationError(
                    f"{VARIABLES_ANNOTATION}: {raw!r} is not a comma-separated list of "
                    "variable names"
                )
            if item not in variables:
                variables.append(item)
    unpause = annotations.get(UNPAUSE_ANNOTATION, "false").strip().lower()
    if unpause not in ("true", "false"):
        raise AnnotationError(
            f'{UNPAUSE_ANNOTATION}: {annotations[UNPAUSE_ANNOTATION]!r} is not "true" or "false"'
        )
    host = annotations.get(HOST_ANNOTATION, "address").strip().lower()
    if host not in ("dns", "address"):
        raise AnnotationError(
            f'{HOST_ANNOTATION}: {annotations[HOST_ANNOTATION]!r} is not "dns" or "address"'
        )
    return EndpointRequest(
        pool=PoolRef(GROUP, kind, name),
        variables=tuple(variables),
        unpause=unpause == "true",
        host_dns=host == "dns",
    )


def endpoint_claim_name(cluster: str) -> str:
    """Return the name of a Cluster's endpoint claim: ``<cluster>-control-plane-endpoint``.

    A name longer than `MAX_CLAIM_NAME` (63, a DNS label: the claim's name starts its
    hostname in the IPAM) is shortened deterministically: the first 31 characters of the
    Cluster's name, 8 hex digits of its SHA-256, then `CLAIM_SUFFIX`. The same Cluster name
    always gives the same claim name (restarts, ``clusterctl move``).
    """
    name = f"{cluster}{CLAIM_SUFFIX}"
    if len(name) <= MAX_CLAIM_NAME:
        return name
    digest = hashlib.sha256(cluster.encode()).hexdigest()[:8]
    keep = MAX_CLAIM_NAME - len(CLAIM_SUFFIX) - len(digest) - 1
    return f"{cluster[:keep].rstrip('-.')}-{digest}{CLAIM_SUFFIX}"


def build_claim(cluster: Cluster, pool: PoolRef, version: str) -> dict[str, Any]:
    """Return the endpoint IPAddressClaim of ``cluster``.

    Parameters
    ----------
    cluster:
        The Cluster (its apiVersion, name, namespace and uid are used).
    pool:
        Its ``spec.poolRef``.
    version:
        The served claim version (``v1beta2`` or ``v1beta1``; CAPI < 1.8 prunes
        ``spec.clusterName``, the cluster-name label carries it then).

    The owner reference to the Cluster has neither ``controller`` nor ``blockOwnerDeletion``:
    the latter would need ``update`` on ``clusters/finalizers`` (OwnerReferencesPermission
    Enforcement) and only matters for foreground deletion; the garbage collector deletes the
    claim after its Cluster either way, and ``clusterctl move`` follows the reference.
    """
    name = cluster.name
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": endpoint_claim_name(name),
            "namespace": cluster.namespace,
            "labels": {CLUSTER_NAME_LABEL: name, ENDPOINT_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": cluster.api_version,
                    "kind": "Cluster",
                    "name": name,
                    "uid": cluster.uid,
                }
            ],
        },
        "spec": {"clusterName": name, "poolRef": pool.as_dict()},
    }


def is_endpoint_claim(claim: Claim) -> bool:
    """Return True for a Cluster's endpoint claim (made by `build_claim`).

    Recognised by `ENDPOINT_LABEL`, its name (`endpoint_claim_name` of its Cluster) and an
    owner reference to that Cluster (group ``cluster.x-k8s.io``, by name: ``clusterctl
    move`` changes UIDs).
    """
    cluster = claim.cluster_name
    return (
        claim.labels.get(ENDPOINT_LABEL) == "true"
        and cluster is not None
        and claim.name == endpoint_claim_name(cluster)
        and (CLUSTER_GROUP, "Cluster", cluster) in claim.owners
    )


def allocates_while_paused(claim: Claim, cluster: Cluster) -> bool:
    """Return True when ``claim`` is allocated although its Cluster is paused.

    Only a live endpoint claim of a Cluster that has no endpoint yet: that Cluster waits
    for it. A moved Cluster (``clusterctl move`` pauses it; its endpoint is set) follows
    the contract like every claim, so the target never allocates while the move copies the
    claim's IPAddress; and no claim is ever released while paused.
    """
    return (
        not claim.deleting
        and is_endpoint_claim(claim)
        and claim.cluster_name == cluster.name
        and not cluster.endpoint_host
    )


@dataclass(frozen=True)
class Plan:
    """The one Cluster write an endpoint needs.

    Attributes
    ----------
    patch:
        The merge patch (with the resourceVersion read), or None when nothing changes.
    conflict:
        Why nothing may be written (the endpoint is set to another host), else None.
    changes:
        What the patch does, for the Event (``endpoint 10.0.0.5:6443``, ``variable x``...).
    """

    patch: dict[str, Any] | None
    conflict: str | None = None
    changes: tuple[str, ...] = ()


def plan_patch(
    cluster: Cluster,
    *,
    host: str,
    address: str,
    variables: tuple[str, ...] = (),
    unpause: bool = False,
) -> Plan:
    """Return the patch that gives ``cluster`` its endpoint ``host``; pure.

    - ``spec.controlPlaneEndpoint``: ``host``, and ``port`` kept when set, else
      `DEFAULT_PORT` (v1.10's v1beta1 schema requires both);
    - each of ``variables`` in ``spec.topology.variables`` (a list of ``{name, value}`` in
      v1beta1 and v1beta2) set to ``address``: added, or its value replaced; other variables
      and fields of the item kept. Only when the Cluster has a ``spec.topology``;
    - ``spec.paused: false`` when ``unpause``, the Cluster is paused (``spec.paused``) and
      this patch sets the endpoint: a Cluster paused later (``clusterctl move``, a person)
      stays paused.

    An endpoint set to another host is a conflict: no patch at all.
    """
    current_host = cluster.endpoint_host
    if current_host and current_host != host:
        return Plan(
            None,
            conflict=f"spec.controlPlaneEndpoint.host is {current_host}, not {host}; "
            "it is left as it is",
        )
    port = cluster.endpoint_port or DEFAULT_PORT
    changes: list[str] = []
    wanted: dict[str, Any] = {}
    if current_host != host or not cluster.endpoint_port:
        wanted["controlPlaneEndpoint"] = {"host": host, "port": port}
        changes.append(f"endpoint {host}:{port}")
    if variables and cluster.variables is not None:
        items = [dict(item) for item in cluster.variables]
        changed = []
        for name in variables:
            item = next((i for i in items if i.get("name") == name), None)
            if item is None:
                items.append({"name": name, "value": address})
            elif item.get("value") != address:
                item["value"] = address
            else:
                continue
            changed.append(name)
        if changed:
            wanted["topology"] = {"variables": items}
            changes.append(f"variable{'s' if len(changed) > 1 else ''} {', '.join(changed)}")
    if unpause and "controlPlaneEndpoint" in wanted and cluster.paused:
        wanted["paused"] = False
        changes.append("unpaused")
    if not wanted:
        return Plan(None)
    patch = {"metadata": {"resourceVersion": cluster.resource_version}, "spec": wanted}
    return Plan(patch, changes=tuple(changes))


# -- the decision --------------------------------------------------------------------------


class ClusterApi(Protocol):
    """The Kubernetes reads and writes of the control-plane endpoint reconciler."""

    def read_cluster(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a CAPI Cluster as served in ``version``, or None."""

    def patch_cluster(
        self, version: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Write:
        """Merge-patch a Cluster (a stale resourceVersion answers `Outcome.CONFLICT`)."""

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a claim, or None."""

    def create_claim(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create a claim."""

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an IPAddress, or None."""

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool, or None."""


class TargetApi(Protocol):
    """Reads and writes of the objects a Cluster names (`bridge.objects.client.ObjectClient`)."""

    def referenced_resource(self, ref: ObjectRef) -> Resource:
        """Return the resource of ``ref``'s kind (raises `NotServedError`)."""

    def get_referenced(self, namespace: str, ref: ObjectRef) -> dict[str, Any] | None:
        """Return the object ``ref`` names, or None."""

    def patch_referenced(self, namespace: str, ref: ObjectRef, patch: Mapping[str, Any]) -> Write:
        """Merge-patch the object ``ref`` names (guarded by its resourceVersion): the write."""


@dataclass
class ClusterDeps:
    """What the control-plane endpoint reconciler uses (`reconcile_cluster`).

    Attributes
    ----------
    kube:
        The Kubernetes objects (Clusters, their endpoint claims and IPAddresses, pools).
    versions:
        The served CAPI versions (claims, Clusters).
    events:
        Where Events about Clusters are told.
    notices:
        Warnings already told, so that a steady problem is told once.
    targets:
        The objects a Cluster names (InfraCluster, KubeadmControlPlane); None: only the
        Cluster is written.
    """

    kube: ClusterApi
    versions: ServedVersions
    events: EventSink
    notices: Notices
    targets: TargetApi | None = None


def _warn(
    deps: ClusterDeps, cluster: Cluster, reason: EndpointReason, message: str, place: str = ""
) -> None:
    """Log and post a Warning Event on the Cluster, once while the message stays the same.

    ``place`` (an object the Cluster names) keeps that object's notice apart.
    """
    subject: tuple[str, ...] = ("cluster-endpoint", cluster.namespace, cluster.name)
    subject += (place,) if place else ()
    if deps.notices.first(subject, f"{reason}: {message}"):
        log.warning("Cluster %s: %s", cluster.key, message)
        deps.events.post(cluster.as_object(), "Warning", reason, message)


def _refused(deps: ClusterDeps, cluster: Cluster, exc: ApiException, what: str) -> Result:
    """Tell a write the API server refused for good (400, 403, 422); re-raise any other error.

    Such a refusal is fixed by a person, not by retrying: CAPI's Cluster webhook refusing a
    variable the ClusterClass does not define, a schema rule, RBAC, a terminating namespace.
    The next event of the Cluster decides again.
    """
    if exc.status not in (400, 403, 422):
        raise exc
    _warn(
        deps,
        cluster,
        EndpointReason.REFUSED,
        f"the API server refused {what}: {api_status_message(exc)}",
    )
    return Result.done()


def _forget_notice(deps: ClusterDeps, namespace: str, name: str, place: str = "") -> None:
    subject: tuple[str, ...] = ("cluster-endpoint", namespace, name)
    deps.notices.forget(subject + ((place,) if place else ()))


def reconcile_cluster(deps: ClusterDeps, namespace: str, name: str) -> Result:
    """Decide and do what a Cluster's control-plane endpoint needs now (the work queue's).

    Parameters
    ----------
    deps:
        What it uses (``deps.versions.cluster``: the served Cluster version; None turns
        endpoints off).
    namespace, name:
        The Cluster.

    Returns
    -------
    Result
        Done (the claim's events queue the Cluster again: `bridge.handlers.claims`), or a
        retry after a second when the Cluster changed between read and write (409).

    Raises
    ------
    kubernetes.client.ApiException
        On API failures other than "not found", conflicts (409: a retry) and refusals of the
        claim create or the Cluster patch (400, 403, 422: a Warning Event, `_refused`); the
        queue logs them and retries.
    """
    version = deps.versions.cluster
    if version is None:
        return Result.done()
    found = deps.kube.read_cluster(version, namespace, name)
    if found is None:
        _forget_notice(deps, namespace, name)
        return Result.done()
    cluster = Cluster.from_body(found)
    try:
        request = parse_request(cluster.annotations)
    except AnnotationError as exc:
        _warn(deps, cluster, EndpointReason.INVALID, str(exc))
        return Result.done()
    if request is None:
        _forget_notice(deps, namespace, name)
        return Result.done()
    body = deps.kube.get_claim(deps.versions.address, namespace, endpoint_claim_name(name))
    if body is None:
        return _create_claim(deps, cluster, request)
    claim = _endpoint_claim(deps, cluster, request, body)
    if claim is None or claim.deleting:
        return Result.done()  # a deletion's event queues the Cluster: a new claim then
    address = _bound_address(deps, claim)
    if address is None:
        _tell_pending(deps, cluster, claim)
        return Result.done()
    return _write_endpoint(deps, cluster, request, claim, address)


def _create_claim(deps: ClusterDeps, cluster: Cluster, request: EndpointRequest) -> Result:
    """Create the Cluster's endpoint claim, unless its endpoint is set or it is deleted."""
    namespace, claim_name = cluster.namespace, endpoint_claim_name(cluster.name)
    if cluster.deleting:
        return Result.done()
    if host := cluster.endpoint_host:
        # Never claim an address that could not be used. A paused Cluster with an endpoint
        # is most likely being moved (clusterctl creates it before its claim): it waits
        # quietly for the claim to arrive.
        if not cluster.is_paused:
            _warn(
                deps,
                cluster,
                EndpointReason.CONFLICT,
                f"spec.controlPlaneEndpoint.host is already {host}; no address is "
                f"claimed from {request.pool.kind} {request.pool.name}",
            )
        return Result.done()
    version = deps.versions.address
    try:
        created = deps.kube.create_claim(version, build_claim(cluster, request.pool, version))
    except ApiException as exc:
        return _refused(deps, cluster, exc, f"IPAddressClaim {namespace}/{claim_name}")
    if not created.written:  # made meanwhile (its event queues the Cluster again)
        return Result.requeue_after(1.0)
    message = (
        f"IPAddressClaim {namespace}/{claim_name} created for the control-plane endpoint "
        f"from {request.pool.kind} {request.pool.name}"
    )
    log.info("Cluster %s: %s", cluster.key, message)
    deps.events.post(cluster.as_object(), "Normal", EndpointReason.CLAIMED, message)
    return Result.done()


def _endpoint_claim(
    deps: ClusterDeps,
    cluster: Cluster,
    request: EndpointRequest,
    body: Mapping[str, Any],
) -> Claim | None:
    """Return the claim of the endpoint's name when it is this Cluster's, from its pool.

    Else None, with a Warning saying why (not an endpoint claim, another Cluster's, or
    from another pool than the annotation names).
    """
    namespace, name = cluster.namespace, cluster.name
    claim_name = endpoint_claim_name(name)
    try:
        claim: Claim | None = Claim.from_body(body)
    except ValueError:
        claim = None
    if claim is None or not is_endpoint_claim(claim) or claim.cluster_name != name:
        _warn(
            deps,
            cluster,
            EndpointReason.CLAIM_MISMATCH,
            f"IPAddressClaim {namespace}/{claim_name} exists and is not this Cluster's "
            "control-plane endpoint claim; nothing is done",
        )
        return None
    if claim.pool_ref != request.pool:
        _warn(
            deps,
            cluster,
            EndpointReason.CLAIM_MISMATCH,
            f"IPAddressClaim {namespace}/{claim_name} claims from {claim.pool_ref.kind} "
            f"{claim.pool_ref.name}, the annotation names {request.pool.kind} "
            f"{request.pool.name}; a claim's pool cannot change: delete the claim to claim "
            "from the new pool",
        )
        return None
    return claim


def _tell_pending(deps: ClusterDeps, cluster: Cluster, claim: Claim) -> None:
    """Warn on the Cluster while its endpoint claim shows Ready False (why it waits)."""
    ready, reason = claim.ready
    if ready != "False":
        return
    text = next(
        (str(c.get("message") or "") for c in _conditions(claim) if c.get("type") == "Ready"),
        "",
    )
    _warn(
        deps,
        cluster,
        EndpointReason.PENDING,
        f"IPAddressClaim {claim.key} waits: {reason}: {text}",
    )


def _write_endpoint(
    deps: ClusterDeps,
    cluster: Cluster,
    request: EndpointRequest,
    claim: Claim,
    address: tuple[str, str],
) -> Result:
    """Patch the Cluster with the endpoint (and variables, unpause) of its bound claim."""
    namespace, name = cluster.namespace, cluster.name
    ip, hostname = address
    host = ip
    if request.host_dns:
        fqdn = _fqdn(deps, claim, hostname)
        if fqdn is None:
            _warn(
                deps,
                cluster,
                EndpointReason.INVALID,
                f'{HOST_ANNOTATION}: "dns" needs an InfobloxIPPool of host records with a '
                f"dnsZone; {claim.pool_ref.kind} {claim.pool_ref.name} has none; the "
                "endpoint is not written",
            )
            return Result.done()
        host = fqdn
    plan = plan_patch(
        cluster, host=host, address=ip, variables=request.variables, unpause=request.unpause
    )
    if plan.conflict is not None:
        _warn(deps, cluster, EndpointReason.CONFLICT, plan.conflict)
        return Result.done()
    source = (
        f"address {ip} from {claim.pool_ref.kind} {claim.pool_ref.name} "
        f"(IPAddressClaim {namespace}/{claim.name})"
    )
    places = _Place.SETTLED
    if deps.targets is not None and cluster.variables is None:
        places = _write_places(deps, cluster, _Endpoint(ip, host, source))
        held = _hold_cluster(deps, cluster, plan, places)
        if held is not None:
            return held
    then = Result.requeue_after(_MISSING_SECONDS) if places is _Place.MISSING else Result.done()
    if plan.patch is None:
        _forget_notice(deps, namespace, name)
        return then
    try:
        written = deps.kube.patch_cluster(str(deps.versions.cluster), namespace, name, plan.patch)
    except ApiException as exc:
        return _refused(deps, cluster, exc, "the Cluster patch")
    if written.outcome is Outcome.CONFLICT:  # changed since read: decide again on what it is now
        return Result.requeue_after(1.0)
    stored = written.obj
    if stored is None:
        return Result.done()
    _forget_notice(deps, namespace, name)
    message = f"{', '.join(plan.changes)}: {source}"
    log.info("Cluster %s/%s: %s", namespace, name, message)
    deps.events.post(Cluster.from_body(stored).as_object(), "Normal", EndpointReason.SET, message)
    return then


def _conditions(claim: Claim) -> list[Mapping[str, Any]]:
    """Return the claim's conditions in the served shape (v1beta2 ones first on v1beta1)."""
    status = claim.status
    if claim.version == "v1beta1":
        return list((status.get("v1beta2") or {}).get("conditions") or []) or list(
            status.get("conditions") or []
        )
    return list(status.get("conditions") or [])


def _bound_address(deps: ClusterDeps, claim: Claim) -> tuple[str, str] | None:
    """Return ``(address, hostname)`` of a bound claim's IPAddress, else None.

    Bound: ``status.addressRef`` names an IPAddress whose ``spec.claimRef`` is the claim.
    The hostname is the one recorded on the IPAddress (`bridge.capi.HOSTNAME_ANNOTATION`),
    else the claim's default (`bridge.capi.hostname_for`).
    """
    if not claim.address_ref:
        return None
    body = deps.kube.get_ip_address(deps.versions.address, claim.namespace, claim.address_ref)
    try:
        address = None if body is None else IPAddress.model_validate(body)
    except ValidationError:
        address = None
    if address is None or address.spec.claim_ref.name != claim.name or not address.spec.address:
        return None
    annotations = address.metadata.annotations
    hostname = annotations.get(capi.HOSTNAME_ANNOTATION) or capi.hostname_for(claim, None)
    return str(address.spec.address), str(hostname)


def _fqdn(deps: ClusterDeps, claim: Claim, hostname: str) -> str | None:
    """Return ``<hostname>.<zone>`` for an Infoblox pool of host records with ``dnsZone``.

    The host record the Infoblox backend creates in DNS has that name (`backends.infoblox`);
    None for any other pool (phpIPAM, fixed addresses, no zone, pool gone).
    """
    if not claim.pool_ref.kind.endswith("InfobloxIPPool"):
        return None
    body = deps.kube.get_pool(
        capi.pool_namespace(claim.pool_ref.kind, claim.namespace),
        claim.pool_ref.kind,
        claim.pool_ref.name,
    )
    # The location fields as read (`IPPool.location`): what the backend was given.
    where = IPPool.from_body(body, claim.pool_ref.kind).location if body is not None else {}
    zone = str(where.get("dnsZone") or "").strip(".")
    if not zone or where.get("recordType", "host") != "host":
        return None
    return f"{hostname.rstrip('.')}.{zone}"


# -- the objects a Cluster names ----------------------------------------------------------

#: Seconds before a pass that found a named object missing reads it again (reads only).
_MISSING_SECONDS = 5.0
#: The group of KubeadmControlPlane (CAPI's kubeadm control plane provider).
KCP_GROUP = "controlplane.cluster.x-k8s.io"


class _Place(enum.Enum):
    """How the objects a Cluster names stand after a pass."""

    SETTLED = "settled"  # each holds the address (written now or before)
    WAIT = "wait"  # one may not be written (conflict, Machines, RBAC, refused): a Warning
    RETRY = "retry"  # one changed meanwhile (409): decide again at once
    MISSING = "missing"  # one is not created yet (applied after the Cluster): read it later


@dataclass(frozen=True)
class _Endpoint:
    ip: str
    host: str
    source: str


def _write_places(deps: ClusterDeps, cluster: Cluster, endpoint: _Endpoint) -> _Place:
    """Give the Cluster's InfraCluster and KubeadmControlPlane the address; each is tried."""
    refs: list[ObjectRef] = []
    if cluster.infrastructure_ref is not None:
        refs.append(cluster.infrastructure_ref)
    ref = cluster.control_plane_ref
    if ref is not None and ref.group == KCP_GROUP and ref.kind == "KubeadmControlPlane":
        refs.append(ref)
    outcomes = {_write_place(deps, cluster, ref, endpoint) for ref in refs}
    for outcome in (_Place.RETRY, _Place.MISSING, _Place.WAIT):
        if outcome in outcomes:
            return outcome
    return _Place.SETTLED


def _hold_cluster(deps: ClusterDeps, cluster: Cluster, plan: Plan, places: _Place) -> Result | None:
    """Return what to do instead of the Cluster write, or None to write it now.

    A 409 on a named object decides again at once. A Cluster this write would unpause waits
    (unwritten) until every named object holds the address: a missing one is read again
    later, one that may not be written is told (`EndpointReason.WAITING`). Any other
    Cluster gets its endpoint all the same.
    """
    if places is _Place.RETRY:
        return Result.requeue_after(1.0)
    if places is _Place.SETTLED or "unpaused" not in plan.changes:
        return None
    if places is _Place.MISSING:
        return Result.requeue_after(_MISSING_SECONDS)
    _warn(
        deps,
        cluster,
        EndpointReason.WAITING,
        "the Cluster stays paused, without its endpoint, until every object it names "
        "holds the address (see the other Warnings)",
    )
    return Result.done()


def _plan_place(
    cluster: Cluster, ref: ObjectRef, body: Mapping[str, Any], endpoint: _Endpoint
) -> TargetPlan:
    if ref == cluster.infrastructure_ref:
        return plan_infra_cluster(body, host=endpoint.host, cluster_port=cluster.endpoint_port)
    dns_name = endpoint.host if endpoint.host != endpoint.ip else None
    return plan_control_plane(body, address=endpoint.ip, dns_name=dns_name)


def _write_place(
    deps: ClusterDeps, cluster: Cluster, ref: ObjectRef, endpoint: _Endpoint
) -> _Place:
    """Read one named object, plan its edit, patch it once (guarded): how it stands."""
    targets, namespace = deps.targets, cluster.namespace
    assert targets is not None
    what, place = f"{ref.kind} {namespace}/{ref.name}", ref.kind
    try:
        body = targets.get_referenced(namespace, ref)
        if body is None:  # created after the Cluster: read again later
            return _Place.MISSING
        plan = _plan_place(cluster, ref, body, endpoint)
        if plan.conflict is not None or plan.blocked is not None:
            reason = EndpointReason.CONFLICT if plan.conflict else EndpointReason.ROLLOUT
            _warn(deps, cluster, reason, f"{what}: {plan.conflict or plan.blocked}", place)
            return _Place.WAIT
        if plan.patch is None:
            _forget_notice(deps, namespace, cluster.name, place)
            return _Place.SETTLED
        written = targets.patch_referenced(namespace, ref, plan.patch)
    except NotServedError as exc:
        _warn(deps, cluster, EndpointReason.REFUSED, f"{what}: {exc}", place)
        return _Place.WAIT
    except ApiException as exc:
        return _place_refused(deps, cluster, ref, exc)
    if written.outcome is Outcome.CONFLICT:  # changed since it was read: read it again
        return _Place.RETRY
    if not written.written:  # deleted meanwhile
        return _Place.MISSING
    _forget_notice(deps, namespace, cluster.name, place)
    message = f"{what}: {', '.join(plan.changes)}: {endpoint.source}"
    log.info("Cluster %s: %s", cluster.key, message)
    deps.events.post(cluster.as_object(), "Normal", EndpointReason.COPIED, message)
    return _Place.SETTLED


def _place_refused(
    deps: ClusterDeps, cluster: Cluster, ref: ObjectRef, exc: ApiException
) -> _Place:
    """Tell why a named object was not read or written: 409 retries, 403 names the rule."""
    if exc.status == 409:
        return _Place.RETRY
    if exc.status not in (400, 403, 422):
        raise exc
    what = f"{ref.kind} {cluster.namespace}/{ref.name}"
    if exc.status == 403:
        assert deps.targets is not None
        plural = deps.targets.referenced_resource(ref).plural
        message = (
            f"{what}: the operator may not read or patch it ({api_status_message(exc)}); add "
            f"the rule {{apiGroups: [{ref.group}], resources: [{plural}], verbs: [get, "
            "patch]} to its ClusterRole (docs/tasks/control-plane-vip.md: another InfraCluster "
            "kind)"
        )
        _warn(deps, cluster, EndpointReason.FORBIDDEN, message, ref.kind)
    else:
        message = f"{what}: the API server refused the patch: {api_status_message(exc)}"
        _warn(deps, cluster, EndpointReason.REFUSED, message, ref.kind)
    return _Place.WAIT
