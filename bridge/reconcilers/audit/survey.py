"""The drift survey: read a pool's IPAM entries, IPAddresses and claims, and compare them.

Read-only, for the operator's audit (`bridge.reconcilers.audit.service`) and for
``ipam-bridge audit`` (`bridge.reconcilers.audit.cli`). The objects the API hands over are
turned into typed values here (`typed_addresses`, `typed_claims`), at the edge, and
compared by `bridge.reconcilers.audit.compare.compare`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from backends.base import Allocation, IPAMBackend
from bridge import capi
from bridge.capi import Claim
from bridge.metrics import Metrics
from bridge.models import IPAddress
from bridge.reconcilers.audit.compare import (
    ClaimName,
    Finding,
    FindingKind,
    compare,
    normal_address,
    orphan_namespaces,
    unqualified_host,
)
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.pool_backends import BACKEND_NAMES, Pool

__all__ = [
    "PoolBackends",
    "Survey",
    "SurveyApi",
    "SurveyDeps",
    "survey",
    "typed_addresses",
    "typed_claims",
]

log = logging.getLogger(__name__)

#: Above this many namespaces named by a pool's entries, its audit lists the claims of all
#: namespaces at once instead of one list per namespace.
_MAX_CLAIM_LISTS = 4


class SurveyApi(Protocol):
    """The Kubernetes reads of a survey (`bridge.objects.client.ObjectClient`)."""

    def list_claims(self, version: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return the claims of ``namespaces`` (empty: all namespaces)."""

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        """Return the IPAddresses of a namespace (None: all)."""


class PoolBackends(Protocol):
    """Where a pool's IPAM client comes from (`bridge.reconcilers.backend_clients.PoolClients`)."""

    def backend_for(self, pool: Pool, *, reuse: bool = False) -> IPAMBackend:
        """Return the pool's IPAM client; raise `PoolError` when it cannot be built."""


@dataclass
class SurveyDeps:
    """What a survey uses (`survey`): reads only.

    Attributes
    ----------
    kube:
        The Kubernetes reads (IPAddresses, claims).
    clients:
        The pools' IPAM clients.
    metrics:
        The Prometheus metrics (each IPAM call is counted and timed, `Metrics.call`).
    versions:
        The served CAPI versions (``versions.address``: the claims' and IPAddresses').
    namespaces:
        The namespaces the operator works in (``IPAM_BRIDGE_NAMESPACE``; empty: all).
    """

    kube: SurveyApi
    clients: PoolBackends
    metrics: Metrics
    versions: ServedVersions
    namespaces: tuple[str, ...]


@dataclass
class Survey:
    """What one read-only audit of a pool saw and found.

    Attributes
    ----------
    pool:
        The pool.
    findings:
        The findings (`compare`), orphans confirmed by a second list of the entries.
    claims:
        The claims listed, as the API returned them, by ``(namespace, name)`` (the objects
        Events about them are posted on).
    entries, addresses:
        How many IPAM entries and IPAddresses of the pool were compared.
    """

    pool: Pool
    findings: list[Finding]
    claims: dict[ClaimName, dict[str, Any]] = field(default_factory=dict)
    entries: int = 0
    addresses: int = 0


def typed_addresses(bodies: Iterable[Mapping[str, Any]]) -> list[IPAddress]:
    """Return IPAddress objects as the API lists them as `bridge.models.IPAddress` values.

    An object that does not parse (not an IPAddress) is left out: it is not audited.
    """
    typed: list[IPAddress] = []
    for body in bodies:
        try:
            typed.append(IPAddress.model_validate(body))
        except ValidationError as exc:
            log.debug("drift audit: IPAddress not audited: %s", exc)
    return typed


def typed_claims(bodies: Iterable[Mapping[str, Any]]) -> list[Claim]:
    """Return IPAddressClaim objects as the API lists them as `bridge.capi.Claim` values.

    A claim that does not parse (``spec.poolRef`` without a kind or a name, which the CRD
    does not admit) is left out.
    """
    typed: list[Claim] = []
    for body in bodies:
        try:
            typed.append(Claim.from_body(body))
        except ValueError as exc:
            log.debug("drift audit: claim not audited: %s", exc)
    return typed


def _list_entries(deps: SurveyDeps, pool: Pool, backend: IPAMBackend) -> list[Allocation]:
    return deps.metrics.call(BACKEND_NAMES[pool.kind], "entries", backend.entries)


def _list_addresses(deps: SurveyDeps, pool: Pool) -> list[dict[str, Any]]:
    """List the IPAddresses that may be the pool's: its namespace's, or all for a Global pool."""
    version, scope = deps.versions.address, deps.namespaces
    if pool.namespace:
        return deps.kube.list_ip_addresses(version, pool.namespace)
    if scope:
        return [a for ns in scope for a in deps.kube.list_ip_addresses(version, ns)]
    return deps.kube.list_ip_addresses(version, None)


def _list_claims(
    deps: SurveyDeps, pool: Pool, entries: Sequence[Allocation]
) -> tuple[list[dict[str, Any]], set[str] | None]:
    """List the claims that decide the comparison; return them and the namespaces listed.

    The namespaces listed are None when every namespace was listed.
    """
    version, scope = deps.versions.address, deps.namespaces
    if pool.is_global:
        # Claims of any namespace may hold an address of a Global pool.
        return deps.kube.list_claims(version, scope), (set(scope) if scope else None)
    listed = {ns for ns in orphan_namespaces(pool, entries) if not scope or ns in scope}
    if not scope and len(listed) > _MAX_CLAIM_LISTS:
        # Entries of many namespaces (a subnet shared by many pools): one list of all.
        return deps.kube.list_claims(version, ()), None
    claims = deps.kube.list_claims(version, tuple(sorted(listed))) if listed else []
    return claims, listed


def _confirmed(
    deps: SurveyDeps, pool: Pool, backend: IPAMBackend, findings: list[Finding]
) -> list[Finding]:
    """Drop the orphans whose entry is gone by a second list of the entries.

    A claim being released frees its entry before it goes, so an entry listed before the
    claims and gone after them was a live claim's.
    """
    if not any(f.finding == FindingKind.ORPHAN for f in findings):
        return findings
    again = {
        (normal_address(e.address) or e.address, unqualified_host(pool, e.hostname) or e.hostname)
        for e in _list_entries(deps, pool, backend)
        if e.quarantined_until is None
    }
    return [
        f for f in findings if f.finding != FindingKind.ORPHAN or (f.address, f.hostname) in again
    ]


def _claims_by_name(
    bodies: Iterable[dict[str, Any]], version: str
) -> dict[ClaimName, dict[str, Any]]:
    """Index claim objects by ``(namespace, name)``, with the apiVersion and kind set."""
    by_name: dict[ClaimName, dict[str, Any]] = {}
    for body in bodies:
        meta = body.get("metadata") or {}
        body.setdefault("apiVersion", f"{capi.GROUP}/{version}")
        body.setdefault("kind", "IPAddressClaim")
        by_name[(str(meta.get("namespace")), str(meta.get("name")))] = body
    return by_name


def survey(deps: SurveyDeps, pool: Pool, backend: IPAMBackend | None = None) -> Survey:
    """Read a pool's IPAM entries, IPAddresses and claims, and compare them (no writes).

    Reads, in this order: the entries (one list request per subnet), the pool's IPAddresses
    (one list of its namespace; all namespaces for a Global pool), the claims of the
    namespaces that matter (`orphan_namespaces`, within the operator's namespaces), and,
    only when orphans were found, the entries once more: an orphan counts only if its
    entry is still there (a claim being released frees its entry before it goes).

    Parameters
    ----------
    deps:
        The Kubernetes reads, the IPAM clients, the metrics, versions and namespaces.
    pool:
        The pool to survey.
    backend:
        The pool's IPAM client (None: ``deps.clients.backend_for(pool)``).

    Raises
    ------
    PoolError
        When the pool's Secret is missing or its client cannot be built.
    backends.errors.BackendError
        When the IPAM cannot be listed.
    kubernetes.client.ApiException
        When the API refuses a list.
    """
    backend = backend if backend is not None else deps.clients.backend_for(pool)
    entries = _list_entries(deps, pool, backend)
    address_bodies = _list_addresses(deps, pool)
    claim_bodies, listed = _list_claims(deps, pool, entries)
    by_name = _claims_by_name(claim_bodies, deps.versions.address)
    addresses = typed_addresses(address_bodies)
    claims = typed_claims(claim_bodies)
    findings = compare(pool, entries, addresses, claims, claim_namespaces=listed)
    findings = _confirmed(deps, pool, backend, findings)
    mine = sum(
        1
        for a in addresses
        if a.spec.pool_ref.kind == pool.kind and a.spec.pool_ref.name == pool.name
    )
    return Survey(pool, findings, by_name, len(entries), mine)
