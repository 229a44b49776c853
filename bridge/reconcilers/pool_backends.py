"""Pools, pure: parse a pool object, its IPAM location, build its backend, compute its status.

Everything here is pure or takes its inputs as arguments (Secret data is passed in, not
read). What reads Secrets, caches backends and guards deletion is `bridge.reconcilers.pools`.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from backends.base import IPAMBackend, SubnetInfo, SubnetRef
from backends.flowcontrol import FlowControl
from backends.infoblox import InfobloxBackend, InfobloxConfig
from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from bridge import __version__
from bridge.capi import Reason, ready_condition
from bridge.models import (
    LOCATION_FIELDS,
    RECORDED,
    Condition,
    InfobloxIPPoolSpec,
    IPPool,
    PHPIPAMIPPoolSpec,
    PoolStatus,
    PoolSubnetStatus,
    PoolUsage,
    TLSSettings,
    pool_context,
    problem_of,
    wire,
)
from bridge.reconcilers.errors import PoolError

__all__ = [
    "BACKEND_NAMES",
    "LOCATION_FIELDS",
    "READY",
    "Pool",
    "TLSSettings",
    "build_backend",
    "fingerprint",
    "location_of",
    "parse_pool",
    "pool_conditions",
    "pool_failed_status",
    "pool_status",
    "status_patch",
    "subnet_refs",
    "valid",
    "with_location",
]

#: The ``User-Agent`` of every IPAM request: ``ipam-bridge/<version> (<pod or host name>)``,
#: so the IPAM's access log tells the replicas apart (``POD_NAME``: the Deployment sets it
#: from ``metadata.name``).
USER_AGENT = f"ipam-bridge/{__version__} ({os.environ.get('POD_NAME') or socket.gethostname()})"
#: Status counts are int64 in the CRD; an IPv6 /64 holds 2**64 addresses, so counts saturate
#: here (as the in-cluster provider's do).
INT64_MAX = 2**63 - 1


#: The backend name of each pool kind (metrics label).
BACKEND_NAMES: Mapping[str, str] = {
    "PHPIPAMIPPool": "phpipam",
    "InfobloxIPPool": "infoblox",
    "GlobalPHPIPAMIPPool": "phpipam",
    "GlobalInfobloxIPPool": "infoblox",
}

#: A pool object, typed (`bridge.models.IPPool`): what every function of the pool path takes.
Pool = IPPool


def subnet_refs(pool: Pool) -> tuple[SubnetRef, ...]:
    """Return the subnets a pool names, in order, with the overrides folded in.

    ``spec.subnets`` when set, else the single-subnet form (``subnetId`` or ``subnet``) as a
    list of one; empty when the spec does not parse. Each entry's ``gateway``/``prefix``
    wins over the pool's ``gateway``/``prefix``, which win over what the IPAM reports
    (`backends.base.SubnetRef`). A pool with a recorded location (`with_location`) gives
    the recorded subnets.
    """
    spec = pool.spec
    if spec is None:
        return ()
    if not spec.subnets:
        subnet_id = spec.subnet_id if isinstance(spec, PHPIPAMIPPoolSpec) else None
        return (
            SubnetRef(
                cidr=spec.subnet or None,
                subnet_id=subnet_id,
                gateway=spec.gateway,
                prefix=spec.prefix,
            ),
        )
    return tuple(
        SubnetRef(
            cidr=entry.subnet,
            subnet_id=entry.subnet_id,
            gateway=entry.gateway or spec.gateway,
            prefix=entry.prefix if entry.prefix is not None else spec.prefix,
        )
        for entry in spec.subnets
    )


def location_of(pool: Pool) -> str:
    """Return the pool's IPAM location as compact JSON (the `LOCATION_FIELDS` that are set).

    Written on every IPAddress (``ipam.cluster.x-k8s.io/ipam-location``) so that a release
    goes where the allocation went even if the pool's spec was changed in a cluster that does
    not enforce the CRD's immutability rules. The values are the spec's as read
    (`bridge.models.IPPool.location`), keys sorted.
    """
    return json.dumps(pool.location, sort_keys=True, separators=(",", ":"))


def with_location(pool: Pool, location: str | None) -> Pool:
    """Return ``pool`` with its location fields replaced by a recorded ``location``.

    Parameters
    ----------
    location:
        A `location_of` JSON text; None, empty or unreadable keeps the pool as it is.

    Returns
    -------
    Pool
        The same pool (when the location matches, cannot be read, or the spec does not
        parse) or a copy whose ``spec`` carries the recorded location fields, taken as
        recorded (`bridge.models.RECORDED`); credentials, TLS and the rest stay the pool's.
        When a recorded field does not parse (``recordType`` of no known type), the copy
        keeps the pool's spec and its ``problem`` says why (`build_backend` refuses it).
    """
    if not location or pool.spec is None:
        return pool
    try:
        recorded = json.loads(location)
    except ValueError:
        return pool
    if not isinstance(recorded, dict):
        return pool
    fields = LOCATION_FIELDS[pool.kind]
    where = {k: v for k, v in recorded.items() if k in fields}
    if where == pool.location:
        return pool
    kept = {k: v for k, v in wire(pool.spec).items() if k not in fields}
    context = {**pool_context(pool.kind, pool.metadata), RECORDED: True}
    try:
        spec = type(pool.spec).model_validate({**kept, **where}, context=context)
    except ValidationError as exc:
        problem = problem_of(exc, within="spec")
        return pool.model_copy(update={"problem": problem, "location": where})
    return pool.model_copy(update={"spec": spec, "location": where})


def _invalid(message: str) -> PoolError:
    return PoolError(Reason.INVALID_SPEC, message, needs_person=True)


def parse_pool(body: Mapping[str, Any], kind: str = "") -> Pool:
    """Type a pool object (any of our kinds) and require its spec to parse.

    ``kind`` is used when the body has none. A Global pool (cluster-scoped) gets the
    namespace ``""`` and reads its Secrets in the namespaces its ``credentialsRef``/
    ``tls.caSecretRef`` name (`bridge.models.IPPool.from_body`).

    Raises
    ------
    PoolError
        Reason ``InvalidSpec`` when a field is missing or malformed (the same checks the
        CRD makes, repeated so that a cluster without our CRD validation still gets a
        clear message, naming the field).
    """
    return valid(IPPool.from_body(body, kind))


def valid(pool: Pool) -> Pool:
    """Return ``pool`` when its spec (and any recorded location, `with_location`) parsed.

    Raises
    ------
    PoolError
        Reason ``InvalidSpec`` with the pool's problem when something did not parse.
    """
    if pool.spec is None or pool.problem:
        raise _invalid(pool.problem or "invalid spec")
    return pool


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
        {
            "spec": wire(pool.spec) if pool.spec is not None else None,
            "secret": dict(secret),
            "ca": ca_pem,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _phpipam(
    pool: Pool, spec: PHPIPAMIPPoolSpec, secret: Mapping[str, str], transport: _Transport
) -> IPAMBackend:
    token = secret.get("token")
    username, password = secret.get("username"), secret.get("password")
    if not token and not (username and password):
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {pool.secret_namespace}/{pool.credentials_secret} must hold the keys "
            "'username' and 'password', or 'token'",
            needs_person=True,
        )
    config = PHPIPAMConfig(
        endpoint=spec.endpoint.rstrip("/"),
        app_id=spec.app_id,
        subnets=subnet_refs(pool),
        section_id=spec.section_id,
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


def _infoblox(
    pool: Pool, spec: InfobloxIPPoolSpec, secret: Mapping[str, str], transport: _Transport
) -> IPAMBackend:
    username, password = secret.get("username"), secret.get("password")
    if not (username and password):
        raise PoolError(
            Reason.CREDENTIALS_NOT_FOUND,
            f"Secret {pool.secret_namespace}/{pool.credentials_secret} must hold the keys "
            "'username' and 'password'",
            needs_person=True,
        )
    config = InfobloxConfig(
        endpoint=spec.endpoint.rstrip("/"),
        wapi_version=spec.wapi_version or "2.12",
        network_view=spec.network_view or "default",
        subnets=subnet_refs(pool),
        record_type=spec.record_type,
        dns_view=spec.dns_view or "default",
        dns_zone=spec.dns_zone,
        extensible_attributes=dict(spec.extensible_attributes),
        owner_extensible_attribute=spec.owner_extensible_attribute,
        username=username,
        password=password,
        verify=transport.verify,
        ca_pem=transport.ca_pem,
        timeout_seconds=transport.timeout,
        retry=transport.retry,
        user_agent=USER_AGENT,
    )
    return InfobloxBackend(config, endpoints=transport.endpoints)


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
        concurrency limit and login budget per IPAM server, shared by every pool's client.
        None gives the client one of its own.

    Raises
    ------
    PoolError
        ``CredentialsNotFound`` when the Secret lacks the keys the pool kind needs;
        ``InvalidSpec`` when the pool's spec did not parse, or the client refuses the
        configuration (e.g. credentials in the endpoint URL, a CA bundle that is not PEM).
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
        spec = valid(pool).spec
        if isinstance(spec, PHPIPAMIPPoolSpec):
            return _phpipam(pool, spec, secret, transport)
        assert isinstance(spec, InfobloxIPPoolSpec)
        return _infoblox(pool, spec, secret, transport)
    except ValueError as exc:  # the client's own checks of its configuration
        raise _invalid(f"{pool.display}: {exc}") from exc


def pool_conditions(previous: Sequence[Condition], ready: Condition) -> tuple[Condition, ...]:
    """Return ``previous`` with its Ready condition replaced by ``ready`` (in place, else appended).

    Conditions of other types (``InSync`` of the drift audit) are kept as they are, in their
    order: a merge patch replaces the whole list, and writers of different types must not
    undo each other nor reorder the list on every write.
    """
    merged = list(previous)
    for i, condition in enumerate(merged):
        if condition.type == ready.type:
            merged[i] = ready
            return tuple(merged)
    merged.append(ready)
    return tuple(merged)


def _count(value: int) -> int:
    return min(value, INT64_MAX)


def _usage(total: int, used: int, free: int) -> PoolUsage:
    return PoolUsage(total=_count(total), used=_count(used), free=_count(free))


def _ready(pool: Pool, *, ready: bool, reason: str, message: str) -> Condition:
    """Return the pool's Ready condition (its transition time kept while its status holds)."""
    previous = pool.status.condition(READY)
    condition = ready_condition(
        ready=ready,
        reason=reason,
        message=message,
        observed_generation=pool.generation,
        previous=[wire(previous)] if previous is not None else [],
    )
    return Condition.model_validate(condition)


def pool_status(pool: Pool, infos: Sequence[SubnetInfo]) -> PoolStatus:
    """Return the status of a Ready pool from what its backend reports for each subnet.

    Parameters
    ----------
    infos:
        `backends.base.IPAMBackend.describe_subnets`, in the pool's order (one or more).

    Returns
    -------
    PoolStatus
        ``subnets`` (per subnet ``cidr``, ``prefix``, ``gateway`` when known,
        ``ipAddresses``), ``subnet``/``prefix``/``gateway`` of the first subnet (``gateway``
        None when unknown, so a merge patch removes a stale one), ``ipAddresses`` summed,
        ``observedGeneration`` and the pool's conditions with Ready True ``PoolReady`` (its
        message names the subnets, not their usage: it changes only when the pool does;
        other types kept). Each subnet's prefix and gateway are its entry's overrides, else
        the pool's, else the IPAM's (the same rule as the backend's).
    """
    refs = subnet_refs(pool)
    subnets: list[PoolSubnetStatus] = []
    for index, info in enumerate(infos):
        ref = refs[index] if index < len(refs) else SubnetRef()
        subnets.append(
            PoolSubnetStatus(
                cidr=info.cidr,
                prefix=ref.prefix if ref.prefix is not None else info.prefix,
                gateway=ref.gateway or info.gateway or None,
                ip_addresses=_usage(info.total, info.used, info.free),
            )
        )
    first = subnets[0]
    if len(infos) == 1:
        message = f"subnet {first.cidr} found; usage in status.ipAddresses"
    else:
        each = ", ".join(s.cidr for s in subnets)
        message = f"{len(infos)} subnets found ({each}); usage in status.subnets"
    ready = _ready(pool, ready=True, reason=Reason.POOL_READY, message=message)
    return PoolStatus(
        subnets=tuple(subnets),
        subnet=first.cidr,
        prefix=first.prefix,
        gateway=first.gateway,
        ip_addresses=_usage(
            sum(info.total for info in infos),
            sum(info.used for info in infos),
            sum(info.free for info in infos),
        ),
        observed_generation=pool.generation,
        conditions=pool_conditions(pool.status.conditions, ready),
    )


def pool_failed_status(pool: Pool, error: PoolError) -> PoolStatus:
    """Return the status of a pool whose check failed: Ready False with the error's reason.

    The pool's status as read, with ``observedGeneration`` its generation and Ready False
    (``error.reason``, ``error.message``) in its conditions; other condition types and the
    usage fields are kept (`pool_conditions`).
    """
    ready = _ready(pool, ready=False, reason=error.reason, message=error.message)
    return pool.status.model_copy(
        update={
            "observed_generation": pool.generation,
            "conditions": pool_conditions(pool.status.conditions, ready),
        }
    )


#: The condition type the pool's check owns (`bridge.capi.ready_condition`).
READY = "Ready"


def status_patch(current: PoolStatus, status: PoolStatus) -> dict[str, Any]:
    """Return the JSON merge patch that takes ``current`` to ``status`` (empty: no change).

    Each field that differs is written as the API names it (`bridge.models.wire`), a field
    ``status`` does not hold as ``null`` (the merge patch removes it). From
    ``status.conditions`` only the Ready condition is ours: when it differs from
    ``current``'s, ``conditions`` is ``current``'s list with Ready replaced
    (`pool_conditions`), every other type (``InSync``) kept.
    """
    patch: dict[str, Any] = {}
    for name, info in PoolStatus.model_fields.items():
        if name == "conditions":
            continue
        value = getattr(status, name)
        if value != getattr(current, name):
            alias = info.alias or name
            patch[alias] = _wired(value)
    ready = status.condition(READY)
    if ready is not None and current.condition(READY) != ready:
        merged = pool_conditions(current.conditions, ready)
        patch["conditions"] = [wire(c) for c in merged]
    return patch


def _wired(value: Any) -> Any:
    """Return a status field's value as the API writes it (models as `wire`, tuples as lists)."""
    if isinstance(value, BaseModel):
        return wire(value)
    if isinstance(value, tuple):
        return [_wired(v) for v in value]
    return value
