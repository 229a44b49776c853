"""Typed views of the Kubernetes objects the operator reads: claims, IPAddresses, pools.

Bodies are parsed once, at the edge, with ``model_validate(body)``; the code behind works with
typed attributes. The models follow the API's camelCase field names (aliases, and
``populate_by_name``), ignore fields they do not use, and treat a ``null`` like an omitted
field (the API and the clients write both). Shapes: CAPI ``api/ipam/v1beta2`` (and v1beta1)
``IPAddressClaim`` and ``IPAddress``; our pool CRDs in ``bridge/crds/``.

The pool models repeat the checks of the CRD schemas, so that a cluster without our CRD
validation still gets a clear message; `problem_of` turns a `pydantic.ValidationError` into
that one message, naming the field.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "GLOBAL",
    "LOCATION_FIELDS",
    "MAX_SUBNETS",
    "POOL_SPECS",
    "RECORDED",
    "Condition",
    "IPAddress",
    "IPAddressClaim",
    "IPAddressClaimSpec",
    "IPAddressClaimStatus",
    "IPAddressSpec",
    "IPPool",
    "IPPoolReference",
    "InfobloxIPPoolSpec",
    "LocalObjectReference",
    "ObjectMeta",
    "OwnerReference",
    "PHPIPAMIPPoolSpec",
    "PoolSpec",
    "PoolStatus",
    "PoolSubnetStatus",
    "PoolTLS",
    "PoolUsage",
    "SecretKeyRef",
    "SecretRef",
    "SubnetEntry",
    "TLSSettings",
    "pool_context",
    "problem_of",
    "wire",
]


def _blank_is_none(value: Any) -> Any:
    return None if value == "" else value


#: An optional text field where an empty string means "not set".
OptionalText = Annotated[str | None, BeforeValidator(_blank_is_none)]


class _Model(BaseModel):
    """Base of the models: camelCase aliases, unknown fields ignored, ``null`` = omitted."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        # Text fields take numbers as the clients wrote them (``appId: 5``), as before.
        coerce_numbers_to_str=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        # Copied only when a value is null: most bodies have none, and the audit validates
        # tens of thousands of them per pass (``dict`` first: the ABC check costs more).
        if (type(data) is dict or isinstance(data, Mapping)) and None in data.values():
            return {key: value for key, value in data.items() if value is not None}
        return data


# -- metadata -------------------------------------------------------------------------------


class OwnerReference(_Model):
    """``metadata.ownerReferences[]``."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False
    block_owner_deletion: bool = False


class ObjectMeta(_Model):
    """The parts of ``metadata`` the operator reads."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    deletion_timestamp: str | None = None
    owner_references: tuple[OwnerReference, ...] = ()

    @property
    def deleting(self) -> bool:
        """True once ``deletionTimestamp`` is set."""
        return bool(self.deletion_timestamp)


class Condition(_Model):
    """A status condition: metav1 (v1beta2) or CAPI v1beta1 (with ``severity``)."""

    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None
    severity: str | None = None


class LocalObjectReference(_Model):
    """A reference by name within the object's namespace (``addressRef``, ``claimRef``)."""

    name: str = ""


class IPPoolReference(_Model):
    """``spec.poolRef`` of a claim or an IPAddress."""

    api_group: str = ""
    kind: str = ""
    name: str = ""


# -- IPAddressClaim -------------------------------------------------------------------------


class IPAddressClaimSpec(_Model):
    """``spec`` of an ``IPAddressClaim``."""

    pool_ref: IPPoolReference = Field(default_factory=IPPoolReference, validate_default=True)
    cluster_name: OptionalText = None

    @field_validator("pool_ref")
    @classmethod
    def _names_a_pool(cls, ref: IPPoolReference) -> IPPoolReference:
        if not ref.kind or not ref.name:
            raise ValueError("spec.poolRef must name a kind and a name")
        return ref


class _Conditions(_Model):
    conditions: tuple[Condition, ...] = ()


class IPAddressClaimStatus(_Model):
    """``status`` of an ``IPAddressClaim`` (``v1beta2`` only on v1beta1 claims, CAPI >= 1.9)."""

    address_ref: LocalObjectReference | None = None
    conditions: tuple[Condition, ...] = ()
    v1beta2: _Conditions | None = None


class IPAddressClaim(_Model):
    """An ``IPAddressClaim`` as the API returns it (either served version)."""

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: IPAddressClaimSpec
    status: IPAddressClaimStatus = Field(default_factory=IPAddressClaimStatus)

    @model_validator(mode="before")
    @classmethod
    def _spec_may_be_empty(cls, data: Any) -> Any:
        # A missing spec reads as an empty one: the poolRef check says what is missing.
        if isinstance(data, Mapping) and not data.get("spec"):
            return {**data, "spec": {}}
        return data


# -- IPAddress ------------------------------------------------------------------------------


class IPAddressSpec(_Model):
    """``spec`` of an ``IPAddress``."""

    address: str | None = None
    prefix: int | None = None
    gateway: str | None = None
    claim_ref: LocalObjectReference = Field(default_factory=LocalObjectReference)
    pool_ref: IPPoolReference = Field(default_factory=IPPoolReference)


class IPAddress(_Model):
    """An ``IPAddress`` as the API returns it (either served version)."""

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: IPAddressSpec = Field(default_factory=IPAddressSpec)


# -- pools ----------------------------------------------------------------------------------


def _local_namespace(field: str, namespace: str | None, info: ValidationInfo) -> str | None:
    """Refuse a Secret namespace other than the pool's own on a namespaced pool.

    The pool's namespace comes from the validation context (`IPPool.from_body`); a Global
    pool has none, so any namespace passes (the CRD requires one there).
    """
    own = (info.context or {}).get("namespace")
    if own and namespace is not None and namespace != own:
        raise ValueError(
            f"{field} cannot name a Secret in another namespace (only Global pools name the "
            "Secret's namespace)"
        )
    return namespace


class SecretRef(_Model):
    """``spec.credentialsRef``: a Secret, by name (and namespace, on Global pools only).

    A namespaced pool reads Secrets of its own namespace only: ``namespace`` must be unset
    (or name the pool's own namespace). A Global pool has no namespace, so ``namespace`` is
    required there. The pool's namespace (``""`` for a Global pool) comes from the validation
    context (`IPPool.from_body`).
    """

    name: str = Field(min_length=1)
    namespace: OptionalText = None

    @field_validator("namespace")
    @classmethod
    def _is_local(cls, namespace: str | None, info: ValidationInfo) -> str | None:
        return _local_namespace("spec.credentialsRef", namespace, info)


class SecretKeyRef(_Model):
    """``spec.tls.caSecretRef``: a key of a Secret (namespace rule of `SecretRef`)."""

    name: OptionalText = None
    key: OptionalText = None
    namespace: OptionalText = None

    @field_validator("namespace")
    @classmethod
    def _is_local(cls, namespace: str | None, info: ValidationInfo) -> str | None:
        return _local_namespace("spec.tls.caSecretRef", namespace, info)


class PoolTLS(_Model):
    """``spec.tls``."""

    insecure_skip_verify: bool = False
    ca_secret_ref: SecretKeyRef = Field(default_factory=SecretKeyRef)


def _cidr(subnet: str | None, field: str = "spec.subnet") -> str | None:
    """Check that a set ``subnet`` is a CIDR network (host bits clear)."""
    if subnet:
        try:
            ipaddress.ip_network(subnet, strict=True)
        except ValueError as exc:
            raise ValueError(f"{field} {subnet!r} is not a CIDR network") from exc
    return subnet


def _address(value: str | None, field: str) -> str | None:
    """Check that a set ``value`` is an IP address."""
    if value is not None:
        try:
            ipaddress.ip_address(value)
        except ValueError as exc:
            raise ValueError(f"{field} {value!r} is not an IP address") from exc
    return value


class SubnetEntry(_Model):
    """An entry of ``spec.subnets``: one subnet of the pool and its optional overrides.

    phpIPAM entries name the subnet by ``subnetId`` or ``subnet`` (CIDR); Infoblox entries by
    ``subnet``. ``gateway`` and ``prefix`` override, for this subnet, the pool's own
    overrides and what the IPAM reports.
    """

    subnet_id: int | None = Field(default=None, ge=1, strict=True)
    subnet: OptionalText = None
    gateway: OptionalText = None
    prefix: int | None = Field(default=None, ge=0, le=128, strict=True)

    @model_validator(mode="after")
    def _valid(self) -> SubnetEntry:
        if (self.subnet_id is None) == (self.subnet is None):
            raise ValueError("each entry of spec.subnets needs exactly one of subnetId and subnet")
        _cidr(self.subnet, "spec.subnets[].subnet")
        _address(self.gateway, "spec.subnets[].gateway")
        return self


#: The most subnets one pool may list (the CRDs' ``maxItems``).
MAX_SUBNETS = 32


class PoolSpec(_Model):
    """The ``spec`` fields both pool kinds share."""

    endpoint: str = Field(pattern=r"^https?://")
    credentials_ref: SecretRef
    gateway: OptionalText = None
    prefix: int | None = Field(default=None, ge=0, le=128, strict=True)
    hostname_suffix: OptionalText = None
    tls: PoolTLS = Field(default_factory=PoolTLS)
    subnets: tuple[SubnetEntry, ...] = Field(default=(), max_length=MAX_SUBNETS)
    address_reuse_grace_period_seconds: int = Field(default=0, ge=0, strict=True)

    @field_validator("gateway")
    @classmethod
    def _gateway_is_an_address(cls, gateway: str | None) -> str | None:
        return _address(gateway, "spec.gateway")

    @model_validator(mode="after")
    def _global_names_namespaces(self, info: ValidationInfo) -> PoolSpec:
        """Require a Global pool (no namespace of its own) to name each Secret's namespace.

        The validation context's `GLOBAL` says whether the pool is of a Global kind (the
        kind decides, never a missing namespace: a namespaced pool read from a file may have
        none yet); without it, a pool without a namespace is taken for a Global one.
        """
        context = info.context or {}
        if not context.get(GLOBAL, not context.get("namespace")):
            return self
        if self.credentials_ref.namespace is None:
            raise ValueError("spec.credentialsRef.namespace is required on a Global pool")
        if self.tls.ca_secret_ref.name and self.tls.ca_secret_ref.namespace is None:
            raise ValueError("spec.tls.caSecretRef.namespace is required on a Global pool")
        return self


#: Validation context key: the pool is of a Global (cluster-scoped) kind.
GLOBAL = "global"
#: Validation context key: the spec carries a location recorded on an IPAddress
#: (`bridge.reconcilers.pool_backends.with_location`), taken as it was recorded: the
#: fields are typed, the rules across subnet fields (checked when it was written) are not.
RECORDED = "recorded"


def _recorded(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get(RECORDED))


class PHPIPAMIPPoolSpec(PoolSpec):
    """``spec`` of a ``PHPIPAMIPPool``: exactly one of ``subnetId``, ``subnet`` and ``subnets``."""

    app_id: str = Field(min_length=1)
    subnet_id: int | None = None
    subnet: str | None = None
    section_id: int | None = None

    @model_validator(mode="after")
    def _one_subnet(self, info: ValidationInfo) -> PHPIPAMIPPoolSpec:
        if _recorded(info):
            return self
        forms = [self.subnet_id is not None, self.subnet is not None, bool(self.subnets)]
        if forms.count(True) != 1:
            raise ValueError(
                "exactly one of spec.subnetId, spec.subnet and spec.subnets must be set"
            )
        _cidr(self.subnet)
        return self


def _host_by_default(value: Any) -> Any:
    return value or "host"


class InfobloxIPPoolSpec(PoolSpec):
    """``spec`` of an ``InfobloxIPPool``."""

    wapi_version: OptionalText = None
    network_view: OptionalText = None
    subnet: OptionalText = None
    record_type: Annotated[Literal["host", "fixedaddress"], BeforeValidator(_host_by_default)] = (
        "host"
    )
    dns_view: OptionalText = None
    dns_zone: OptionalText = None
    extensible_attributes: dict[str, str] = Field(default_factory=dict)
    #: ``spec.ownerExtensibleAttribute``: the EA that carries each record's owner, or None.
    owner_extensible_attribute: OptionalText = None

    @model_validator(mode="after")
    def _one_subnet(self, info: ValidationInfo) -> InfobloxIPPoolSpec:
        if _recorded(info):
            return self
        if (self.subnet is None) == (not self.subnets):
            raise ValueError("exactly one of spec.subnet and spec.subnets must be set")
        if any(entry.subnet_id is not None for entry in self.subnets):
            raise ValueError("spec.subnets[].subnetId is phpIPAM's; Infoblox entries name a subnet")
        _cidr(self.subnet)
        return self


#: The ``spec`` model of each pool kind (a Global kind has its namespaced twin's spec).
POOL_SPECS: Mapping[str, type[PHPIPAMIPPoolSpec] | type[InfobloxIPPoolSpec]] = {
    "PHPIPAMIPPool": PHPIPAMIPPoolSpec,
    "InfobloxIPPool": InfobloxIPPoolSpec,
    "GlobalPHPIPAMIPPool": PHPIPAMIPPoolSpec,
    "GlobalInfobloxIPPool": InfobloxIPPoolSpec,
}
#: The cluster-scoped pool kinds (`bridge.capi.GLOBAL_POOL_KINDS` names their twins).
_GLOBAL_KINDS = frozenset({"GlobalPHPIPAMIPPool", "GlobalInfobloxIPPool"})

_PHPIPAM_LOCATION = ("endpoint", "appId", "subnetId", "subnet", "subnets", "sectionId")
_INFOBLOX_LOCATION = (
    "endpoint",
    "networkView",
    "subnet",
    "subnets",
    "recordType",
    "dnsView",
    "dnsZone",
)

#: The ``spec`` fields of each pool kind that say where its addresses live in the IPAM. They
#: are immutable (CEL rules in the CRDs; ``subnets`` may only grow at its end) and recorded
#: on every IPAddress as read (`IPPool.location`).
LOCATION_FIELDS: Mapping[str, tuple[str, ...]] = {
    "PHPIPAMIPPool": _PHPIPAM_LOCATION,
    "InfobloxIPPool": _INFOBLOX_LOCATION,
    "GlobalPHPIPAMIPPool": _PHPIPAM_LOCATION,
    "GlobalInfobloxIPPool": _INFOBLOX_LOCATION,
}


class PoolUsage(_Model):
    """``status.ipAddresses`` (and per subnet): counts of addresses (int64 in the CRDs)."""

    total: int = 0
    used: int = 0
    free: int = 0


class PoolSubnetStatus(_Model):
    """An entry of ``status.subnets``: one subnet of the pool as its IPAM reports it."""

    cidr: str = ""
    prefix: int | None = None
    gateway: str | None = None
    ip_addresses: PoolUsage | None = None


class PoolStatus(_Model):
    """``status`` of a pool: the fields of the pool CRDs' status schema (``crds/``).

    ``None`` is a field the status does not hold; `wire` leaves those out.
    """

    conditions: tuple[Condition, ...] = ()
    subnets: tuple[PoolSubnetStatus, ...] | None = None
    subnet: str | None = None
    prefix: int | None = None
    gateway: str | None = None
    ip_addresses: PoolUsage | None = None
    observed_generation: int | None = None

    def condition(self, type: str) -> Condition | None:
        """Return the condition of ``type`` (``Ready``, ``InSync``), or None."""
        return next((c for c in self.conditions if c.type == type), None)


def wire(value: BaseModel) -> dict[str, Any]:
    """Return a model as the API writes it: camelCase names, unset and ``None`` fields left out.

    A field the model was not given (read from an object that lacks it) is not written
    either, so an object read and written back keeps its fields as they were.
    """
    return value.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)


@dataclass(frozen=True)
class TLSSettings:
    """``spec.tls`` of a pool: verification switch and an optional CA bundle Secret.

    ``ca_secret_namespace`` is set when ``ca_secret_name`` is (the pool's namespace, or on a
    Global pool the one ``caSecretRef`` names).
    """

    insecure_skip_verify: bool = False
    ca_secret_name: str | None = None
    ca_secret_key: str = "ca.crt"
    ca_secret_namespace: str | None = None


def pool_context(kind: str, metadata: ObjectMeta) -> dict[str, Any]:
    """Return the validation context of a pool's spec: its namespace, and whether it is Global.

    A Global kind is cluster-scoped: its namespace is ``""`` whatever the metadata says (the
    API server ignores one), and its Secret references must name their namespaces. A
    namespaced kind keeps its namespace, even an empty one (a manifest not applied yet):
    it is never taken for a Global pool.
    """
    is_global = kind in _GLOBAL_KINDS
    return {"namespace": "" if is_global else metadata.namespace, GLOBAL: is_global}


class IPPool(_Model):
    """A pool object of one of our kinds, typed once where a client hands it over.

    Build it with `from_body`. ``spec`` is the kind's spec model, or None when the spec does
    not parse (``problem`` then says why, naming the field); metadata and status are read
    either way, so an invalid pool still gets its status and lets its Secrets go.

    Attributes
    ----------
    kind:
        ``PHPIPAMIPPool``, ``InfobloxIPPool`` or a Global kind.
    spec:
        `PHPIPAMIPPoolSpec` or `InfobloxIPPoolSpec`; None when it does not parse.
    problem:
        Why ``spec`` is None, or why a location recorded on an IPAddress does not parse
        (`bridge.reconcilers.pool_backends.with_location`); ``""`` otherwise.
    status:
        The status as read.
    location:
        The `LOCATION_FIELDS` the raw spec sets, with their values as read (JSON values):
        what an IPAddress records (``ipam.cluster.x-k8s.io/ipam-location``), kept as read so
        that the recorded text stays the same from one release to the next.
    """

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PHPIPAMIPPoolSpec | InfobloxIPPoolSpec | None = None
    problem: str = ""
    status: PoolStatus = Field(default_factory=PoolStatus)
    location: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any], kind: str = "") -> IPPool:
        """Type a pool object as the API returns it (``kind`` when the body lacks one).

        The object's namespace (``""`` for a Global pool, which is cluster-scoped) is the
        validation context of the spec: it decides the namespace rule of the Secret
        references. A spec that does not parse gives ``spec`` None and its ``problem``; a
        status that does not parse reads as empty (the next write repairs it).

        Raises
        ------
        pydantic.ValidationError
            When ``metadata`` is malformed (the API server never serves such an object).
        """
        kind = str(body.get("kind") or kind)
        meta = ObjectMeta.model_validate(body.get("metadata") or {})
        raw = body.get("spec") or {}
        spec: PHPIPAMIPPoolSpec | InfobloxIPPoolSpec | None = None
        problem = ""
        if kind not in POOL_SPECS:
            problem = f"unknown pool kind {kind!r}"
        else:
            try:
                spec = POOL_SPECS[kind].model_validate(raw, context=pool_context(kind, meta))
            except ValidationError as exc:
                problem = problem_of(exc, within="spec")
        try:
            status = PoolStatus.model_validate(body.get("status") or {})
        except ValidationError:
            status = PoolStatus()
        fields = LOCATION_FIELDS.get(kind, ())
        location = (
            {key: copy.deepcopy(raw[key]) for key in fields if key in raw}
            if isinstance(raw, Mapping)
            else {}
        )
        # The parts are validated: put together as they are (validating the spec again
        # would lose the namespace context).
        return cls.model_construct(
            api_version=str(body.get("apiVersion") or ""),
            kind=kind,
            metadata=meta,
            spec=spec,
            problem=problem,
            status=status,
            location=location,
        )

    @property
    def is_global(self) -> bool:
        """True for a Global (cluster-scoped) pool kind."""
        return self.kind in _GLOBAL_KINDS

    @property
    def namespace(self) -> str:
        """The pool's namespace; ``""`` for a Global pool."""
        return "" if self.is_global else self.metadata.namespace

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self.metadata.name

    @property
    def uid(self) -> str:
        """``metadata.uid``."""
        return self.metadata.uid

    @property
    def generation(self) -> int:
        """``metadata.generation`` (0 when unset)."""
        return self.metadata.generation

    @property
    def deleting(self) -> bool:
        """True once ``metadata.deletionTimestamp`` is set."""
        return self.metadata.deleting

    @property
    def key(self) -> tuple[str, str, str]:
        """``(namespace, kind, name)``: identifies the pool within the operator."""
        return (self.namespace, self.kind, self.name)

    @property
    def display(self) -> str:
        """``<Kind> <namespace>/<name>`` (``<Kind> <name>`` for a Global pool), for messages."""
        if self.is_global:
            return f"{self.kind} {self.name}"
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def ready(self) -> tuple[str | None, str | None, str]:
        """``(status, reason, message)`` of the Ready condition; ``(None, None, "")`` without."""
        ready = self.status.condition("Ready")
        if ready is None:
            return None, None, ""
        return ready.status, ready.reason, ready.message

    @property
    def observed_generation(self) -> int | None:
        """``status.observedGeneration``: the generation the pool's check last saw."""
        return self.status.observed_generation

    @property
    def endpoint(self) -> str:
        """``spec.endpoint`` (as recorded in `location`): the URL of the pool's IPAM server."""
        return str(self.location.get("endpoint") or "")

    @property
    def gateway(self) -> str | None:
        """``spec.gateway``: the pool's override of the gateway its IPAM reports."""
        return self.spec.gateway if self.spec is not None else None

    @property
    def prefix(self) -> int | None:
        """``spec.prefix``: the pool's override of the prefix length its IPAM reports."""
        return self.spec.prefix if self.spec is not None else None

    @property
    def hostname_suffix(self) -> str | None:
        """``spec.hostnameSuffix``: appended to ``<claim>.<namespace>`` (None: none)."""
        return self.spec.hostname_suffix if self.spec is not None else None

    @property
    def grace_period_seconds(self) -> int:
        """``spec.addressReuseGracePeriodSeconds``: seconds a released address stays held."""
        return self.spec.address_reuse_grace_period_seconds if self.spec is not None else 0

    @property
    def credentials_secret(self) -> str:
        """``spec.credentialsRef.name`` (``""`` when the spec does not parse)."""
        return self.spec.credentials_ref.name if self.spec is not None else ""

    @property
    def secret_namespace(self) -> str:
        """Namespace of the credentials Secret: the pool's own, or the one a Global pool names."""
        if self.spec is None:
            return self.namespace
        return self.spec.credentials_ref.namespace or self.namespace

    @property
    def tls(self) -> TLSSettings:
        """``spec.tls``, the CA bundle's key defaulting to ``ca.crt``."""
        if self.spec is None:
            return TLSSettings()
        tls, ca = self.spec.tls, self.spec.tls.ca_secret_ref
        return TLSSettings(
            insecure_skip_verify=tls.insecure_skip_verify,
            ca_secret_name=ca.name,
            ca_secret_key=ca.key or "ca.crt",
            ca_secret_namespace=(ca.namespace or self.namespace) if ca.name else None,
        )

    @property
    def secret_refs(self) -> tuple[tuple[str, str], ...]:
        """``(namespace, name)`` of the Secrets the pool reads: credentials, then CA bundle.

        Empty when the spec does not parse.
        """
        if self.spec is None:
            return ()
        refs = [(self.secret_namespace, self.credentials_secret)]
        tls = self.tls
        if tls.ca_secret_name:
            ca = (tls.ca_secret_namespace or self.namespace, tls.ca_secret_name)
            if ca not in refs:
                refs.append(ca)
        return tuple(refs)

    def as_object(self) -> dict[str, Any]:
        """Return the pool as an API object names it: apiVersion, kind and metadata.

        ``metadata`` holds ``name``, ``namespace``, ``uid``, ``finalizers``, ``annotations``
        and ``resourceVersion``: what a finalizer write guarded by the resourceVersion and an
        Event about the pool need.
        """
        meta = self.metadata
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "uid": meta.uid,
                "finalizers": list(meta.finalizers),
                "annotations": dict(meta.annotations),
                "resourceVersion": meta.resource_version,
            },
        }


#: What to say when a field fails a declared constraint (required, type, pattern, range).
_FIELD_MESSAGES: Mapping[str, str] = {
    "spec.endpoint": "spec.endpoint must be an http:// or https:// URL",
    "spec.credentialsRef": "spec.credentialsRef.name must name a Secret in the pool's namespace",
    "spec.credentialsRef.name": (
        "spec.credentialsRef.name must name a Secret in the pool's namespace"
    ),
    "spec.prefix": "spec.prefix must be an integer from 0 to 128",
    "spec.appId": "spec.appId is required",
    "spec.subnet": "spec.subnet is required",
    "spec.subnets": "spec.subnets lists 1 to 32 subnets",
    "spec.addressReuseGracePeriodSeconds": (
        "spec.addressReuseGracePeriodSeconds must be an integer of at least 0"
    ),
    "spec.recordType": "spec.recordType {input!r} must be 'host' or 'fixedaddress'",
}


def problem_of(exc: ValidationError, *, within: str = "") -> str:
    """Return one clear message, naming the field, for the first problem a model found.

    A check of ours (a ``ValueError`` in a validator) says its own message; a declared
    constraint gets the field's message, else ``<field path>: <pydantic's message>``.
    ``within`` is the path of the validated value in its object (``spec``).
    """
    errors = exc.errors()
    if not errors:
        return str(exc)
    error = errors[0]
    context = error.get("ctx") or {}
    if error["type"] == "value_error" and "error" in context:
        return str(context["error"])
    where = tuple(within.split(".")) if within else ()
    path = ".".join(str(part) for part in (*where, *error["loc"]))
    template = _FIELD_MESSAGES.get(path)
    if template is not None:
        return template.format(input=error.get("input"))
    return f"{path}: {error['msg']}" if path else str(error["msg"])
