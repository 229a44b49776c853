"""The CAPI IPAM contract as data: names, claim parsing, IPAddress bodies, conditions.

Pure functions only (no I/O). Shapes follow the CAPI API types
(``api/ipam/v1beta2/ipaddressclaim_types.go``, ``ipaddress_types.go`` and their v1beta1
counterparts) and the contract in the CAPI book (``docs/book/src/developer/providers/
contracts/ipam.md``, https://cluster-api.sigs.k8s.io/developer/providers/contracts/ipam).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from bridge.models import IPAddressClaim, problem_of

__all__ = [
    "ADDRESS_FINALIZER",
    "CLAIM_FINALIZER",
    "CLUSTER_GROUP",
    "CLUSTER_NAME_LABEL",
    "GLOBAL_POOL_KINDS",
    "GROUP",
    "HOSTNAME_ANNOTATION",
    "LOCATION_ANNOTATION",
    "PAUSED_ANNOTATION",
    "POOL_FINALIZER",
    "POOL_KINDS",
    "REQUESTED_ADDRESS_ANNOTATION",
    "SUPPORTED_VERSIONS",
    "Claim",
    "Cluster",
    "ObjectRef",
    "PoolRef",
    "Reason",
    "build_ip_address",
    "claim_status",
    "hostname_for",
    "is_paused",
    "pool_namespace",
    "ready_condition",
    "ready_of",
]

#: API group of claims, addresses and our pools.
GROUP = "ipam.cluster.x-k8s.io"
#: Group of the CAPI Cluster object (pause).
CLUSTER_GROUP = "cluster.x-k8s.io"
#: The CAPI versions of IPAddressClaim/IPAddress we speak (CAPI 1.6-1.10 and >= 1.11).
SUPPORTED_VERSIONS = ("v1beta2", "v1beta1")
#: Our pool kinds and their plural resource names (version v1alpha1).
POOL_KINDS: Mapping[str, str] = {
    "PHPIPAMIPPool": "phpipamippools",
    "InfobloxIPPool": "infobloxippools",
    "GlobalPHPIPAMIPPool": "globalphpipamippools",
    "GlobalInfobloxIPPool": "globalinfobloxippools",
}
#: The cluster-scoped pool kinds (claims of any namespace reference them); each has the
#: spec of its namespaced twin (the value).
GLOBAL_POOL_KINDS: Mapping[str, str] = {
    "GlobalPHPIPAMIPPool": "PHPIPAMIPPool",
    "GlobalInfobloxIPPool": "InfobloxIPPool",
}
#: Claim annotation asking for one specific address.
REQUESTED_ADDRESS_ANNOTATION = "ipam.cluster.x-k8s.io/requested-address"


def pool_namespace(kind: str, namespace: str) -> str:
    """Return the namespace of the pool of ``kind`` a claim of ``namespace`` references.

    ``""`` for a Global (cluster-scoped) kind, else the claim's own namespace.
    """
    return "" if kind in GLOBAL_POOL_KINDS else namespace


CLAIM_FINALIZER = "ipam.cluster.x-k8s.io/ReleaseAddress"
ADDRESS_FINALIZER = "ipam.cluster.x-k8s.io/ProtectAddress"
POOL_FINALIZER = "ipam.cluster.x-k8s.io/ProtectPool"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
#: Annotation on the IPAddress recording the hostname the address is registered under in
#: the IPAM, so release finds it even if the pool's hostnameSuffix changed since.
HOSTNAME_ANNOTATION = "ipam.cluster.x-k8s.io/hostname"
#: Annotation on the IPAddress recording, as JSON, the IPAM location the address was
#: registered in (the pool's endpoint, app id, subnet...: `pool_backends.location_of`), so a
#: release always goes where the allocation went.
LOCATION_ANNOTATION = "ipam.cluster.x-k8s.io/ipam-location"
#: Annotation ``clusterctl move`` puts on every source object before it deletes it (CAPI
#: ``cmd/clusterctl/client/cluster/mover.go`` ``deleteSourceObject``, CAPI >= 1.5): the one
#: positive evidence that a claim goes away because it was moved, its address kept.
MOVE_ANNOTATION = "clusterctl.cluster.x-k8s.io/delete-for-move"


class Reason(enum.StrEnum):
    """Every reason of a Ready condition or an Event the operator writes, claims' and pools'.

    A `enum.StrEnum`: members are the plain strings the API stores (CAPI ``v1beta2``
    condition constants for claims; our own for pools). The ``#:`` comment of each member
    says where it appears and what it means: ``docs/gen_reference.py`` prints them in
    ``docs/reference/reasons.md`` (`bridge.reasons` lists every enumeration of reasons).
    """

    # Claims: the Ready condition.
    #: Claim Ready=True: the address is reserved in the IPAM and the IPAddress written.
    ALLOCATED = "AddressAllocated"
    #: Claim Ready=False: its pool is missing, being deleted or not Ready (the pool's reason
    #: is in the message); the claim is served once the pool is Ready.
    POOL_NOT_READY = "PoolNotReady"
    #: Claim Ready=False: no subnet of the pool has a free address; the claim waits for one.
    POOL_EXHAUSTED = "PoolExhausted"
    #: Claim Ready=False: the IPAM refused or failed the allocation (a requested address
    #: outside the pool or taken, an IPAM error); retried.
    ALLOCATION_FAILED = "AllocationFailed"
    #: Claim Ready=False (and a Warning Event): the entry under the claim's hostname belongs
    #: to another management cluster or another claim (the message names it and the fix,
    #: ``spec.hostnameSuffix``); nothing is taken, the claim looks again slowly.
    HOSTNAME_TAKEN = "HostnameTaken"
    # Claims: Events of a release (Normal, Warning).
    #: Claim release: the claim's address was released in the IPAM (logged; no Event, the
    #: claim is going away).
    RELEASED = "AddressReleased"
    #: Claim Event (Warning): the claim went away without an IPAM release: its pool was gone
    #: (the entry may stay in the IPAM), or ``clusterctl move`` took it to another cluster
    #: (the entry is kept for the moved claim).
    RELEASE_SKIPPED = "ReleaseSkipped"
    # Pools: the Ready condition.
    #: Pool Ready=True: the IPAM answers, the credentials work and every subnet exists.
    POOL_READY = "PoolReady"
    #: Pool Ready=False: a spec field is missing or malformed (the message names it).
    INVALID_SPEC = "InvalidSpec"
    #: Pool Ready=False: the credentials Secret (or a key of it) does not exist.
    CREDENTIALS_NOT_FOUND = "CredentialsNotFound"
    #: Pool Ready=False: the IPAM refused the credentials (401/403, a wrong app id).
    AUTHENTICATION_FAILED = "AuthenticationFailed"
    #: Pool Ready=False: a subnet of the pool does not exist in the IPAM.
    SUBNET_NOT_FOUND = "SubnetNotFound"
    #: Pool Ready=False: the IPAM's TLS certificate is not trusted (spec.tls).
    TLS_VERIFICATION_FAILED = "TLSVerificationFailed"
    #: Pool Ready=False: the IPAM cannot be reached or answers with server errors.
    BACKEND_UNAVAILABLE = "BackendUnavailable"
    #: Pool Ready=False (and Warning Event) while it is being deleted: IPAddresses or claims
    #: still use it (named in the message); it goes once they are gone.
    DELETION_BLOCKED = "DeletionBlocked"
    # Pools: the InSync condition of the drift audit (bridge.reconcilers.audit).
    #: Pool InSync=True: the last drift audit found the IPAM as the IPAddresses say.
    NO_DRIFT = "NoDrift"
    #: Pool InSync=False: the last drift audit left missing entries, conflicts or orphans
    #: (counted in the message; each one is a Warning Event).
    DRIFT_FOUND = "DriftFound"
    # Drift audit Events: on claims (restored, missing, conflict) and pools (orphan).
    #: Claim Event (Normal): the audit registered a missing IPAM entry again at its address.
    ADDRESS_RESTORED = "AddressRestored"
    #: Claim Event (Warning): the claim's IPAM entry is gone and could not be registered
    #: again (its address is taken or out of the subnets).
    ADDRESS_MISSING = "AddressMissing"
    #: Claim Event (Warning): the claim's address or hostname is held by another IPAM entry
    #: (found by the audit, or by a release that left that entry alone).
    ADDRESS_CONFLICT = "AddressConflict"
    #: Pool Event (Warning): an IPAM entry ipam-bridge made for a claim that no longer exists.
    ORPHAN_ENTRY = "OrphanEntry"


@dataclass(frozen=True)
class PoolRef:
    """``spec.poolRef`` of a claim: a pool in the claim's namespace, or a Global (cluster) pool."""

    api_group: str
    kind: str
    name: str

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PoolRef:
        """Return the ``poolRef`` of a claim's or an IPAddress's raw ``spec`` (missing: ``""``)."""
        ref = spec.get("poolRef") or {}
        return cls(
            str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
        )

    def as_dict(self) -> dict[str, str]:
        """Return the reference as the API writes it (``apiGroup``, ``kind``, ``name``)."""
        return {"apiGroup": self.api_group, "kind": self.kind, "name": self.name}

    @property
    def is_ours(self) -> bool:
        """True when the reference names one of our pool kinds in our group."""
        return self.api_group == GROUP and self.kind in POOL_KINDS

    @property
    def is_global(self) -> bool:
        """True when the reference names a cluster-scoped (Global) pool kind."""
        return self.kind in GLOBAL_POOL_KINDS


@dataclass(frozen=True)
class Claim:
    """The parts of an ``IPAddressClaim`` the operator uses.

    Attributes
    ----------
    api_version:
        ``ipam.cluster.x-k8s.io/v1beta2`` or ``.../v1beta1``: decides the status shape.
    namespace, name, uid:
        Identity (the UID is only used for owner references, never as a backend key).
    pool_ref:
        The pool the claim asks an address from.
    cluster_name:
        ``spec.clusterName``, else the ``cluster.x-k8s.io/cluster-name`` label, else None.
    labels, annotations, finalizers:
        The claim's metadata.
    address_ref:
        ``status.addressRef.name`` when the claim is already bound.
    deleting:
        True once ``metadata.deletionTimestamp`` is set.
    owners:
        ``(apiVersion group, kind, name)`` of each owner reference (e.g. the Cluster owning a
        control-plane endpoint claim, `control_plane.is_endpoint_claim`); never UIDs,
        which ``clusterctl move`` changes.
    generation, resource_version:
        ``metadata.generation`` (None when absent) and ``metadata.resourceVersion``.
    status:
        ``status`` as read: its conditions are written back merged (`claim_status`), so
        another writer's conditions are kept exactly as they are.
    """

    api_version: str
    namespace: str
    name: str
    uid: str
    pool_ref: PoolRef
    cluster_name: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    address_ref: str | None
    deleting: bool
    finalizers: tuple[str, ...] = ()
    owners: tuple[tuple[str, str, str], ...] = ()
    generation: int | None = None
    resource_version: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Claim:
        """Parse a claim object as the API returns it (either served version).

        Raises
        ------
        ValueError
            When the body is not a claim the operator can handle (``spec.poolRef`` lacks a
            kind or a name); the message names the field.
        """
        try:
            model = IPAddressClaim.model_validate(body)
        except ValidationError as exc:
            raise ValueError(problem_of(exc)) from exc
        generation = (body.get("metadata") or {}).get("generation")
        return cls.from_model(
            model,
            generation=generation if isinstance(generation, int) else None,
            status=body.get("status") or {},
        )

    @classmethod
    def from_model(
        cls,
        claim: IPAddressClaim,
        *,
        generation: int | None = None,
        status: Mapping[str, Any] | None = None,
    ) -> Claim:
        """Return the operator's view of a parsed `bridge.models.IPAddressClaim`.

        ``generation`` and ``status`` (``metadata.generation`` and ``status`` as read; the
        model keeps neither whole) default to None and an empty mapping.
        """
        meta, spec = claim.metadata, claim.spec
        address_ref = claim.status.address_ref
        return cls(
            api_version=claim.api_version or f"{GROUP}/v1beta2",
            namespace=meta.namespace,
            name=meta.name,
            uid=meta.uid,
            pool_ref=PoolRef(
                api_group=spec.pool_ref.api_group,
                kind=spec.pool_ref.kind,
                name=spec.pool_ref.name,
            ),
            cluster_name=spec.cluster_name or meta.labels.get(CLUSTER_NAME_LABEL) or None,
            labels=dict(meta.labels),
            annotations=dict(meta.annotations),
            address_ref=(address_ref.name if address_ref is not None else None) or None,
            deleting=meta.deleting,
            finalizers=meta.finalizers,
            owners=tuple(
                (ref.api_version.rpartition("/")[0], ref.kind, ref.name)
                for ref in meta.owner_references
            ),
            resource_version=meta.resource_version,
            generation=generation,
            status={} if status is None else status,
        )

    def updated(self, stored: Mapping[str, Any]) -> Claim:
        """Return this claim as one of our writes returned it (the API server's object).

        Metadata (finalizers, resourceVersion, generation, labels, annotations, deletion)
        and status are taken from ``stored``; the rest is this claim's: our writes change
        neither the spec nor the identity, and a changed generation tells of a new spec.
        Cheaper than `from_body` (no validation) on the path of every write.
        """
        meta = stored.get("metadata") or {}
        generation = meta.get("generation")
        return replace(
            self,
            finalizers=tuple(meta.get("finalizers") or ()),
            resource_version=str(meta.get("resourceVersion") or ""),
            generation=generation if isinstance(generation, int) else None,
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            status=stored.get("status") or {},
        )

    @property
    def version(self) -> str:
        """The served version of this claim (``v1beta2`` or ``v1beta1``)."""
        return self.api_version.rsplit("/", 1)[-1]

    @property
    def key(self) -> str:
        """``<namespace>/<name>``, for logs and provenance."""
        return f"{self.namespace}/{self.name}"

    @property
    def ready(self) -> tuple[str | None, str | None]:
        """``(status, reason)`` of the claim's Ready condition, or ``(None, None)``.

        From ``status.conditions``, or for a v1beta1 claim ``status.v1beta2.conditions``
        when present (CAPI >= 1.9), else its CAPI conditions in ``status.conditions``.
        """
        conditions = self.status.get("conditions") or []
        if self.version == "v1beta1":
            conditions = (self.status.get("v1beta2") or {}).get("conditions") or conditions
        return _ready_in(conditions)

    def as_object(self) -> dict[str, Any]:
        """Return the claim as an API object names it: apiVersion, kind and metadata.

        ``metadata`` holds ``name``, ``namespace``, ``uid``, ``finalizers`` and
        ``resourceVersion``: what a finalizer write guarded by the resourceVersion and an
        Event about the claim need.
        """
        return {
            "apiVersion": self.api_version,
            "kind": "IPAddressClaim",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "finalizers": list(self.finalizers),
                "resourceVersion": self.resource_version,
            },
        }


@dataclass(frozen=True)
class ObjectRef:
    """A reference of a Cluster to another object of its namespace (``spec.infrastructureRef``...).

    Attributes
    ----------
    group:
        The API group (v1beta2: ``apiGroup``; v1beta1: the group of ``apiVersion``).
    version:
        The version named (v1beta1 ``apiVersion``); ``""`` in v1beta2, which names none.
    kind, name:
        The object's kind and name.
    """

    group: str
    version: str
    kind: str
    name: str

    @classmethod
    def from_body(cls, ref: Any) -> ObjectRef | None:
        """Return the reference as v1beta2 (``apiGroup``) or v1beta1 (``apiVersion``) write it.

        None when ``ref`` is absent or lacks a kind or name.
        """
        if not isinstance(ref, Mapping) or not ref.get("kind") or not ref.get("name"):
            return None
        group, version = str(ref.get("apiGroup") or ""), ""
        if not group and ref.get("apiVersion"):
            group, _, version = str(ref["apiVersion"]).rpartition("/")
        return cls(group, version, str(ref["kind"]), str(ref["name"]))


@dataclass(frozen=True)
class Cluster:
    """The parts of a CAPI ``Cluster`` the operator uses (v1beta2 or v1beta1).

    Attributes
    ----------
    api_version, namespace, name, uid, resource_version:
        Identity and the version read (a patch is guarded by it).
    annotations:
        ``metadata.annotations``.
    paused:
        ``spec.paused``.
    deleting:
        True once ``metadata.deletionTimestamp`` is set.
    endpoint_host, endpoint_port:
        ``spec.controlPlaneEndpoint`` (``""`` and 0 when not set).
    variables:
        ``spec.topology.variables`` as read (``{name, value}`` items); None when the Cluster
        has no ``spec.topology`` (not built from a ClusterClass).
    infrastructure_ref, control_plane_ref:
        ``spec.infrastructureRef`` and ``spec.controlPlaneRef`` (None when absent).
    """

    api_version: str
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    paused: bool = False
    deleting: bool = False
    endpoint_host: str = ""
    endpoint_port: int = 0
    variables: tuple[Mapping[str, Any], ...] | None = None
    infrastructure_ref: ObjectRef | None = None
    control_plane_ref: ObjectRef | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Cluster:
        """Return the Cluster of an object as the API returns it (absent fields: defaults)."""
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        endpoint = spec.get("controlPlaneEndpoint") or {}
        topology = spec.get("topology")
        return cls(
            api_version=str(body.get("apiVersion") or f"{CLUSTER_GROUP}/v1beta2"),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            annotations=dict(meta.get("annotations") or {}),
            paused=bool(spec.get("paused")),
            deleting=bool(meta.get("deletionTimestamp")),
            endpoint_host=str(endpoint.get("host") or ""),
            endpoint_port=int(endpoint.get("port") or 0),
            variables=(
                tuple(topology.get("variables") or ()) if isinstance(topology, Mapping) else None
            ),
            infrastructure_ref=ObjectRef.from_body(spec.get("infrastructureRef")),
            control_plane_ref=ObjectRef.from_body(spec.get("controlPlaneRef")),
        )

    @property
    def is_paused(self) -> bool:
        """True while the Cluster carries the paused annotation or ``spec.paused: true``."""
        return PAUSED_ANNOTATION in self.annotations or self.paused

    @property
    def key(self) -> str:
        """``<namespace>/<name>``, for logs."""
        return f"{self.namespace}/{self.name}"

    def as_object(self) -> dict[str, Any]:
        """Return the Cluster as an API object names it (for Events about it)."""
        return {
            "apiVersion": self.api_version,
            "kind": "Cluster",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


def hostname_for(claim: Claim, suffix: str | None) -> str:
    """Return the claim's key in the external IPAM (its hostname there).

    ``<claim>.<namespace>``, plus ``.<suffix>`` when the pool sets ``hostnameSuffix``; the
    name survives restarts and ``clusterctl move`` (a UID would not).
    """
    host = f"{claim.name}.{claim.namespace}"
    suffix = (suffix or "").strip(".")
    return f"{host}.{suffix}" if suffix else host


def is_paused(annotations: Mapping[str, str] | None, spec: Mapping[str, Any] | None) -> bool:
    """Return True when an object carries the CAPI paused annotation or ``spec.paused: true``."""
    return PAUSED_ANNOTATION in (annotations or {}) or bool((spec or {}).get("paused"))


def _owner_ref(
    api_version: str, kind: str, name: str, uid: str, controller: bool
) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def build_ip_address(
    claim: Claim,
    *,
    version: str,
    pool_uid: str,
    address: str,
    prefix: int,
    gateway: str | None,
    hostname: str,
    location: str = "",
) -> dict[str, Any]:
    """Return the ``IPAddress`` object for a claim, as the contract requires.

    Same name and namespace as the claim; ``spec.address``, ``spec.prefix``,
    ``spec.gateway`` (omitted when None), ``spec.claimRef.name``, ``spec.poolRef`` (equal to
    the claim's, or the CAPI webhook rejects it); owner references to the claim
    (``controller: true``) and the pool (``controller: false``), both with
    ``blockOwnerDeletion``; the ``ProtectAddress`` finalizer; the cluster-name label.

    Parameters
    ----------
    version:
        The served IPAddress version to write (``v1beta2`` or ``v1beta1``).
    pool_uid:
        UID of the pool object (owner reference).
    hostname, location:
        Where the address is registered in the IPAM (annotations `HOSTNAME_ANNOTATION` and
        `LOCATION_ANNOTATION`; an empty location is not written).
    """
    labels: dict[str, str] = {}
    if claim.cluster_name:
        labels[CLUSTER_NAME_LABEL] = claim.cluster_name
    spec: dict[str, Any] = {
        "address": address,
        "prefix": prefix,
        "claimRef": {"name": claim.name},
        "poolRef": claim.pool_ref.as_dict(),
    }
    if gateway:
        spec["gateway"] = gateway
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddress",
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "labels": labels,
            "annotations": {
                HOSTNAME_ANNOTATION: hostname,
                **({LOCATION_ANNOTATION: location} if location else {}),
            },
            "finalizers": [ADDRESS_FINALIZER],
            "ownerReferences": [
                _owner_ref(claim.api_version, "IPAddressClaim", claim.name, claim.uid, True),
                _owner_ref(
                    f"{GROUP}/v1alpha1", claim.pool_ref.kind, claim.pool_ref.name, pool_uid, False
                ),
            ],
        },
        "spec": spec,
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(
    *,
    ready: bool,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    previous: Sequence[Mapping[str, Any]] = (),
    now: str | None = None,
) -> dict[str, Any]:
    """Return a metav1 ``Ready`` condition (all fields the v1beta2 schema requires).

    ``lastTransitionTime`` is kept from ``previous`` when the status did not change, so
    repeated reconciles do not look like transitions.
    """
    status = "True" if ready else "False"
    transition = now or _now()
    for old in previous:
        if old.get("type") == "Ready" and old.get("status") == status:
            transition = str(old.get("lastTransitionTime") or transition)
    condition: dict[str, Any] = {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition


def _merge(conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    merged = [dict(c) for c in conditions if c.get("type") != new["type"]]
    merged.append(dict(new))
    return merged


def claim_status(
    claim: Claim,
    *,
    ready: bool,
    reason: str,
    message: str,
    address_ref: str | None = None,
    now: str | None = None,
    v1beta2_kept: bool = True,
) -> dict[str, Any]:
    """Return the ``status`` patch of a claim carrying its Ready condition (and addressRef).

    v1beta2 claims get metav1 conditions in ``status.conditions``. v1beta1 claims get CAPI
    conditions there (``severity`` ``Warning`` when False) plus metav1 conditions in
    ``status.v1beta2.conditions`` when ``v1beta2_kept``: the v1beta1 schemas of CAPI < 1.9
    have no ``status.v1beta2``, and the API server prunes what is written there (structural
    schema pruning), so it is left out for them. Other conditions already present are kept.
    """
    status = claim.status
    generation = claim.generation
    version = claim.version
    patch: dict[str, Any] = {}
    if address_ref:
        patch["addressRef"] = {"name": address_ref}
    if version == "v1beta1":
        v1beta2 = (status.get("v1beta2") or {}).get("conditions") or []
        new = ready_condition(
            ready=ready,
            reason=reason,
            message=message,
            observed_generation=generation,
            previous=v1beta2,
            now=now,
        )
        if v1beta2_kept:
            patch["v1beta2"] = {"conditions": _merge(v1beta2, new)}
        old = status.get("conditions") or []
        legacy = ready_condition(ready=ready, reason=reason, message=message, previous=old, now=now)
        if not ready:
            legacy["severity"] = "Warning"
        patch["conditions"] = _merge(old, legacy)
    else:
        old = status.get("conditions") or []
        new = ready_condition(
            ready=ready,
            reason=reason,
            message=message,
            observed_generation=generation,
            previous=old,
            now=now,
        )
        patch["conditions"] = _merge(old, new)
    return patch


def ready_of(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """Return ``(status, reason)`` of an object's Ready condition, or ``(None, None)``.

    Reads ``status.conditions``, or for v1beta1 claims ``status.v1beta2.conditions`` when
    present (CAPI >= 1.9), else their CAPI conditions in ``status.conditions``.
    """
    status = body.get("status") or {}
    version = str(body.get("apiVersion") or "").rsplit("/", 1)[-1]
    conditions = status.get("conditions") or []
    if version == "v1beta1" and body.get("kind") == "IPAddressClaim":
        conditions = (status.get("v1beta2") or {}).get("conditions") or conditions
    return _ready_in(conditions)


def _ready_in(conditions: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    for condition in conditions:
        if condition.get("type") == "Ready":
            return condition.get("status"), condition.get("reason")
    return None, None
