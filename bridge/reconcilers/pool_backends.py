"""Pools, pure: parse a pool object, its IPAM location, build its backend, compute its status.

Everything here is pure or takes its inputs as arguments (Secret data is passed in, not
read). What reads Secrets, caches backends and guards deletion is `bridge.reconcilers.pools`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from backends.base import IPAMBackend, SubnetInfo, SubnetRef
from backends.flowcontrol import FlowControl
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from bridge import __version__
from bridge.capi import (
    CLUSTER_NAME_LABEL,
    GLOBAL_POOL_KINDS,
    POOL_KINDS,
    Reason,
    ready_condition,
)
from bridge.models import POOL_MODELS, problem_of
from bridge.reconcilers.errors import PoolError

__all__ = [
    "BACKEND_NAMES",
    "LOCATION_FIELDS",
    "Pool",
    "TLSSettings",
    "build_backend",
    "fingerprint",
    "location_of",
    "parse_pool",
    "pool_conditions",
    "pool_failed_status",
    "pool_status",
    "subnet_refs",
    "with_location",
]

#: The ``User-Agent`` of every IPAM request: ``ipam-bridge/<version> (<pod or host name>)``,
#: so the IPAM's access log tells the replicas apart (``POD_NAME``: the Deployment sets it
#: from ``metadata.name``).
USER_AGENT = f"ipam-bridge/{__version__} ({os.environ.get('POD_NAME') or socket.gethostname()})"
#: Status counts are int64 in the CRD; an IPv6 /64 holds 2**64 addresses, so counts saturate
#: here (as the in-cluster provider's do).
INT64_MAX = 2**63 - 1


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

#: The spec fields of each pool kind that say where its addresses live in the IPAM. They are
#: immutable (CEL rules in the CRDs; ``subnets`` may only grow at its end) and recorded on
#: every IPAddress (`location_of`).
LOCATION_FIELDS: Mapping[str, tuple[str, ...]] = {
    "PHPIPAMIPPool": _PHPIPAM_LOCATION,
    "InfobloxIPPool": _INFOBLOX_LOCATION,
    "GlobalPHPIPAMIPPool": _PHPIPAM_LOCATION,
    "GlobalInfobloxIPPool": _INFOBLOX_LOCATION,
}

#: The backend name of each pool kind (metrics label).
BACKEND_NAMES: Mapping[str, str] = {
    "PHPIPAMIPPool": "phpipam",
    "InfobloxIPPool": "infoblox",
    "GlobalPHPIPAMIPPool": "phpipam",
    "GlobalInfobloxIPPool": "infoblox",
}


def _opt_int(value: Any) -> int | None:
    return int(value) if value not in (None, "") else None


def subnet_refs(spec: Mapping[str, Any]) -> tuple[SubnetRef, ...]:
    """Return the subnets a pool spec names, in order, with the overrides folded in.

    ``spec.subnets`` when set, else the single-subnet form (``subnetId`` or ``subnet``) as a
    list of one. Each entry's ``gateway``/``prefix`` wins over the pool's ``gateway``/
    ``prefix``, which win over what the IPAM reports (`backends.base.SubnetRef`). Reads the
    raw spec, so a pool with a recorded location (`with_location`) gets the recorded subnets.
    """
    gateway = _opt_str(spec, "gateway")
    prefix = _opt_int(spec.get("prefix"))
    entries = spec.get("subnets") or [
        {"subnetId": spec.get("subnetId"), "subnet": spec.get("subnet")}
    ]
    refs = []
    for entry in entries:
        entry_prefix = _opt_int(entry.get("prefix"))
        refs.append(
            SubnetRef(
                cidr=_opt_str(entry, "subnet"),
                subnet_id=_opt_int(entry.get("subnetId")),
                gateway=_opt_str(entry, "gateway") or gateway,
                prefix=entry_prefix if entry_prefix is not None else prefix,
            )
        )
    return tuple(refs)


@dataclass(frozen=True)
class TLSSettings:
    """``spec.tls`` of a pool: verification switch and an optional CA bundle Secret.

    ``ca_secret_namespace`` is set on Global pools only (else the pool's namespace).
    """

    insecure_skip_verify: bool = False
    ca_secret_name: str | None = None
    ca_secret_key: str = "ca.crt"
    ca_secret_namespace: str | None = None


@dataclass(frozen=True)
class Pool:
    """A pool object, parsed; ``spec`` keeps the raw kind-specific fields.

    Attributes
    ----------
    kind, namespace, name, uid, generation:
        Identity of the pool object; ``namespace`` is ``""`` for a Global (cluster-scoped)
        pool.
    credentials_secret:
        Name of the Secret holding the credentials (in `secret_namespace`).
    secret_namespace:
        Namespace of the credentials Secret: the pool's own, or for a Global pool
        ``spec.credentialsRef.namespace``.
    gateway, prefix:
        The pool's overrides of what the IPAM reports (None = use the IPAM's); folded into
        each subnet (`subnets`), where an entry's own override wins.
    grace_period_seconds:
        ``spec.addressReuseGracePeriodSeconds``: how long a released address stays
        quarantined in the IPAM before it may be handed out again (0 = released at once).
    hostname_suffix:
        Appended to ``<claim>.<namespace>`` to form the hostname (None = none).
    tls:
        TLS settings.
    cluster_name:
        The ``cluster.x-k8s.io/cluster-name`` label, when the pool belongs to one cluster.
    spec:
        The raw ``spec`` mapping.
    deleting:
        True once ``metadata.deletionTimestamp`` is set.
    ready:
        ``(status, reason, message)`` of the pool's Ready condition as read (``(None, None,
        "")`` without one).
    observed_generation:
        ``status.observedGeneration``: the generation the pool's check last saw (None: none).
    """

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    credentials_secret: str
    gateway: str | None
    prefix: int | None
    hostname_suffix: str | None
    tls: TLSSettings
    cluster_name: str | None
    spec: Mapping[str, Any] = field(compare=False)
    deleting: bool = False
    secret_namespace: str = ""
    grace_period_seconds: int = 0
    ready: tuple[str | None, str | None, str] = field(default=(None, None, ""), compare=False)
    observed_generation: int | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """``(namespace, kind, name)``: identifies the pool within the operator."""
        return (self.namespace, self.kind, self.name)

    @property
    def endpoint(self) -> str:
        """``spec.endpoint``: the URL of the pool's IPAM server."""
        return str(self.spec.get("endpoint") or "")

    @property
    def is_global(self) -> bool:
        """True for a Global (cluster-scoped) pool kind."""
        return self.kind in GLOBAL_POOL_KINDS

    @property
    def display(self) -> str:
        """``<Kind> <namespace>/<name>`` (``<Kind> <name>`` for a Global pool), for messages."""
        if self.is_global:
            return f"{self.kind} {self.name}"
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def subnets(self) -> tuple[SubnetRef, ...]:
        """The pool's subnets in order, overrides folded in (`subnet_refs`)."""
        return subnet_refs(self.spec)

    @property
    def secret_refs(self) -> tuple[tuple[str, str], ...]:
        """``(namespace, name)`` of the Secrets the pool reads: credentials, then CA bundle."""
        refs = [(self.secret_namespace or self.namespace, self.credentials_secret)]
        if self.tls.ca_secret_name:
            ca = (self.tls.ca_secret_namespace or self.namespace, self.tls.ca_secret_name)
            if ca not in refs:
                refs.append(ca)
        return tuple(refs)


def location_of(pool: Pool) -> str:
    """Return the pool's IPAM location as compact JSON (the `LOCATION_FIELDS` that are set).

    Written on every IPAddress (``ipam.cluster.x-k8s.io/ipam-location``) so that a release
    goes where the allocation went even if the pool's spec was changed in a cluster that does
    not enforce the CRD's immutability rules.
    """
    fields = {key: pool.spec[key] for key in LOCATION_FIELDS[pool.kind] if key in pool.spec}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def with_location(pool: Pool, location: str | None) -> Pool:
    """Return ``pool`` with its location fields replaced by a recorded ``location``.

    Parameters
    ----------
    location:
        A `location_of` JSON text; None, empty or unreadable keeps the pool as it is.

    Returns
    -------
    Pool
        The same pool (when the location matches or cannot be read) or a copy whose ``spec``
        carries the recorded location fields; credentials, TLS and the rest stay the pool's.
    """
    if not location:
        return pool
    try:
        recorded = json.loads(location)
    except ValueError:
        return pool
    if not isinstance(recorded, dict):
        return pool
    fields = LOCATION_FIELDS[pool.kind]
    spec = {k: v for k, v in pool.spec.items() if k not in fields}
    spec.update({k: v for k, v in recorded.items() if k in fields})
    if spec == dict(pool.spec):
        return pool
    return dataclasses.replace(pool, spec=spec)


def _invalid(message: str) -> PoolError:
    return PoolError(Reason.INVALID_SPEC, message, needs_person=True)


def _opt_str(spec: Mapping[str, Any], key: str) -> str | None:
    value = spec.get(key)
    return str(value) if value not in (None, "") else None


def parse_pool(body: Mapping[str, Any]) -> Pool:
    """Parse a pool object (any of our kinds) and validate it (`bridge.models.POOL_MODELS`).

    A Global pool (cluster-scoped) gets the namespace ``""`` and reads its Secrets in the
    namespaces its ``credentialsRef``/``tls.caSecretRef`` name.

    Raises
    ------
    PoolError
        Reason ``InvalidSpec`` when a field is missing or malformed (the same checks the
        CRD makes, repeated so that a cluster without our CRD validation still gets a
        clear message, naming the field).
    """
    kind = str(body.get("kind") or "")
    if kind not in POOL_KINDS:
        raise _invalid(f"unknown pool kind {kind!r}")
    try:
        model = POOL_MODELS[kind].from_body(body)
    except ValidationError as exc:
        raise _invalid(problem_of(exc)) from exc
    meta, spec = model.metadata, model.spec
    ca_ref = spec.tls.ca_secret_ref
    namespace = "" if kind in GLOBAL_POOL_KINDS else meta.namespace
    return Pool(
        kind=kind,
        namespace=namespace,
        name=meta.name,
        uid=meta.uid,
        generation=meta.generation,
        credentials_secret=spec.credentials_ref.name,
        gateway=spec.gateway,
        prefix=spec.prefix,
        hostname_suffix=spec.hostname_suffix,
        tls=TLSSettings(
            insecure_skip_verify=spec.tls.insecure_skip_verify,
            ca_secret_name=ca_ref.name,
            ca_secret_key=ca_ref.key or "ca.crt",
            ca_secret_namespace=(ca_ref.namespace or namespace) if ca_ref.name else None,
        ),
        cluster_name=meta.labels.get(CLUSTER_NAME_LABEL),
        spec=body.get("spec") or {},
        deleting=meta.deleting,
        secret_namespace=spec.credentials_ref.namespace or namespace,
        grace_period_seconds=spec.address_reuse_grace_period_seconds,
        ready=_ready(body.get("status") or {}),
        observed_generation=_observed_generation(body.get("status") or {}),
    )


def _ready(status: Mapping[str, Any]) -> tuple[str | None, str | None, str]:
    """Return ``(status, reason, message)`` of the Ready condition in a pool's ``status``."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return (
                condition.get("status"),
                condition.get("reason"),
                str(condition.get("message") or ""),
            )
    return None, None, ""


def _observed_generation(status: Mapping[str, Any]) -> int | None:
    value = status.get("observedGeneration")
    return value if isinstance(value, int) else None


@dataclass(frozen=True)
class _Transport:
    """What every backend of a pool gets besides its spec and credentials."""

    verify: bool
    ca_pem: str | None
    timeout: float
    retry: RetryPolicy
    endpoints: FlowControl | None


def fingerprint(pool: Pool, secret: Mapping[str, str], ca_pem: str | None) -> str:
    """Return a digest of everything a backend is built from (spec, Secret data, CA).

    A cached backend is reused while its fingerprint stays the same; the digest never
    leaves the process and holds no secret in clear.
    """
    blob = json.dumps(
        {"spec": pool.spec, "secret": dict(secret), "ca": ca_pem}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _phpipam(pool: Pool, secret: Mapping[str, str], transport: _Transport) -> IPAMBackend:
    token = secret.get("token")
    username, password = secret.get("username"), secret.get("password")
    if not token and not (username and password):
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {pool.secret_namespace}/{pool.credentials_secret} must hold the keys "
            "'username' and 'password', or 'token'",
            needs_person=True,
        )
    spec = pool.spec
    config = PHPIPAMConfig(
        endpoint=str(spec["endpoint"]).rstrip("/"),
        app_id=str(spec["appId"]),
        subnets=subnet_refs(spec),
        section_id=_opt_int(spec.get("sectionId")),
        username=None if token else username,
        password=None if token else password,
        app_code=token or None,
        verify=transport.verify,
        ca_pem=transport.ca_pem,
        timeout_seconds=transport.timeout,
        retry=transport.retry,
        user_agent=USER_AGENT,
    )
    return PHPIPAMBackend(config, endpoints=transport.endpoints)


def _infoblox(pool: Pool, secret: Mapping[str, str], transport: _Transport) -> IPAMBackend:
    username, password = secret.get("username"), secret.get("password")
    if not (username and password):
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {pool.secret_namespace}/{pool.credentials_secret} must hold the keys "
            "'username' and 'password'",
            needs_person=True,
        )
    spec = pool.spec
    record_type = str(spec.get("recordType") or "host")
    if record_type not in ("host", "fixedaddress"):  # a recorded location is not parsed again
        raise _invalid(f"spec.recordType {record_type!r} must be 'host' or 'fixedaddress'")
    config = InfobloxConfig(
        endpoint=str(spec["endpoint"]).rstrip("/"),
        wapi_version=str(spec.get("wapiVersion") or "2.12"),
        network_view=str(spec.get("networkView") or "default"),
        subnets=subnet_refs(spec),
        record_type="fixedaddress" if record_type == "fixedaddress" else "host",
        dns_view=_opt_str(spec, "dnsView") or "default",
        dns_zone=_opt_str(spec, "dnsZone"),
        extensible_attributes={
            str(k): str(v) for k, v in (spec.get("extensibleAttributes") or {}).items()
        },
        username=username,
        password=password,
        verify=transport.verify,
        ca_pem=transport.ca_pem,
        timeout_seconds=transport.timeout,
        retry=transport.retry,
        user_agent=USER_AGENT,
    )
    return InfobloxBackend(config, endpoints=transport.endpoints)


_FACTORIES: Mapping[str, Callable[[Pool, Mapping[str, str], _Transport], IPAMBackend]] = {
    "PHPIPAMIPPool": _phpipam,
    "InfobloxIPPool": _infoblox,
    "GlobalPHPIPAMIPPool": _phpipam,
    "GlobalInfobloxIPPool": _infoblox,
}


def build_backend(
    pool: Pool,
    secret: Mapping[str, str],
    ca_pem: str | None,
    *,
    timeout_seconds: float,
    retry: RetryPolicy,
    endpoints: FlowControl | None = None,
) -> IPAMBackend:
    """Build the backend client of a pool from its spec and its Secret's data.

    Parameters
    ----------
    secret:
        The credentials Secret's data, decoded to text.
    ca_pem:
        The PEM bundle of ``spec.tls.caSecretRef``, or None; given to the client as text
        (loaded into an `ssl.SSLContext`, never written to a file). Ignored with
        ``spec.tls.insecureSkipVerify``.
    timeout_seconds:
        Connect and read timeout of each HTTP request.
    retry:
        The retry policy; its ``total_seconds`` bounds every backend operation.
    endpoints:
        The operator's `backends.flowcontrol.FlowControl` (``Operator.flow``): breaker,
        slots and login budget per IPAM server, shared by every pool's client. None gives
        the client one of its own.

    Raises
    ------
    PoolError
        ``CredentialsNotFound`` when the Secret lacks the keys the pool kind needs;
        ``InvalidSpec`` when the client refuses the configuration (e.g. credentials in the
        endpoint URL, a CA bundle that is not PEM).
    """
    try:
        insecure = pool.tls.insecure_skip_verify
        transport = _Transport(
            verify=not insecure,
            ca_pem=None if insecure else (ca_pem or None),
            timeout=timeout_seconds,
            retry=retry,
            endpoints=endpoints,
        )
        return _FACTORIES[pool.kind](pool, secret, transport)
    except ValueError as exc:  # the client's own checks of its configuration
        raise _invalid(f"{pool.display}: {exc}") from exc


def pool_conditions(
    previous: Sequence[Mapping[str, Any]], ready: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Return ``previous`` with its Ready condition replaced by ``ready`` (in place, else appended).

    Conditions of other types (``InSync`` of the drift audit) are kept as they are, in their
    order: a merge patch replaces the whole list, and writers of different types must not
    undo each other nor reorder the list on every write.
    """
    merged = [dict(c) for c in previous]
    for i, condition in enumerate(merged):
        if condition.get("type") == ready["type"]:
            merged[i] = dict(ready)
            return merged
    merged.append(dict(ready))
    return merged


def _count(value: int) -> int:
    return min(value, INT64_MAX)


def _usage(total: int, used: int, free: int) -> dict[str, int]:
    return {"total": _count(total), "used": _count(used), "free": _count(free)}


def pool_status(
    pool: Pool, infos: Sequence[SubnetInfo], previous: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Return the status of a Ready pool from what its backend reports for each subnet.

    Parameters
    ----------
    infos:
        `backends.base.IPAMBackend.describe_subnets`, in the pool's order (one or more).
    previous:
        The pool's current ``status.conditions`` (other types are kept).

    Returns
    -------
    dict
        ``subnets`` (per subnet ``cidr``, ``prefix``, ``gateway`` when known,
        ``ipAddresses``), ``subnet``/``prefix``/``gateway`` of the first subnet (``gateway``
        None when unknown, so a merge patch removes a stale one), ``ipAddresses`` summed,
        ``observedGeneration`` and the conditions with Ready True ``PoolReady`` (its
        message names the subnets, not their usage: it changes only when the pool does). Each
        subnet's prefix and gateway are its entry's overrides, else the pool's, else the
        IPAM's (the same rule as the backend's).
    """
    refs = pool.subnets
    subnets: list[dict[str, Any]] = []
    for index, info in enumerate(infos):
        ref = refs[index] if index < len(refs) else SubnetRef()
        entry: dict[str, Any] = {
            "cidr": info.cidr,
            "prefix": ref.prefix if ref.prefix is not None else info.prefix,
        }
        gateway = ref.gateway or info.gateway
        if gateway:
            entry["gateway"] = gateway
        entry["ipAddresses"] = _usage(info.total, info.used, info.free)
        subnets.append(entry)
    total = sum(info.total for info in infos)
    used = sum(info.used for info in infos)
    free = sum(info.free for info in infos)
    first = subnets[0]
    if len(infos) == 1:
        message = f"subnet {first['cidr']} found; usage in status.ipAddresses"
    else:
        each = ", ".join(s["cidr"] for s in subnets)
        message = f"{len(infos)} subnets found ({each}); usage in status.subnets"
    ready = ready_condition(
        ready=True,
        reason=Reason.POOL_READY,
        message=message,
        observed_generation=pool.generation,
        previous=previous,
    )
    return {
        "subnets": subnets,
        "subnet": first["cidr"],
        "prefix": first["prefix"],
        "gateway": first.get("gateway"),
        "ipAddresses": _usage(total, used, free),
        "observedGeneration": pool.generation,
        "conditions": pool_conditions(previous, ready),
    }


def pool_failed_status(
    generation: int, error: PoolError, previous: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Return the status patch of a pool whose check failed (Ready False, reason, message).

    Conditions of other types in ``previous`` are kept (`pool_conditions`).
    """
    ready = ready_condition(
        ready=False,
        reason=error.reason,
        message=error.message,
        observed_generation=generation,
        previous=previous,
    )
    return {"observedGeneration": generation, "conditions": pool_conditions(previous, ready)}
