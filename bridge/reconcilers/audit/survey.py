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
from typing import Any

from pydantic import ValidationError

from backends.base import Allocation, IPAMBackend
from bridge import capi
from bridge.capi import Claim
from bridge.models import IPAddress
from bridge.operator import Operator
from bridge.reconcilers.audit.compare import (
    ClaimName,
    Finding,
    FindingKind,
    compare,
    normal_address,
    orphan_namespaces,
    unqualified_host,
)
from bridge.reconcilers.pool_backends import BACKEND_NAMES, Pool

__all__ = ["Survey", "survey", "typed_addresses", "typed_claims"]

log = logging.getLogger(__name__)

#: Above this many namespaces named by a pool's entries, its audit lists the claims of all
#: namespaces at once instead of one list per namespace.
_MAX_CLAIM_LISTS = 4


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


def _list_entries(ctx: Operator, pool: Pool, backend: IPAMBackend) -> list[Allocation]:
    return ctx.metrics.call(BACKEND_NAMES[pool.kind], "entries", backend.entries)


def _list_addresses(ctx: Operator, pool: Pool) -> list[dict[str, Any]]:
    """List the IPAddresses that may be the pool's: its namespace's, or all for a Global pool."""
    version, scope = ctx.versions.address, ctx.settings.namespaces
    if pool.namespace:
        return ctx.kube.list_ip_addresses(version, pool.namespace)
    if scope:
        return [a for ns in scope for a in ctx.kube.list_ip_addresses(version, ns)]
    return ctx.kube.list_ip_addresses(version, None)


def _list_claims(
    ctx: Operator, pool: Pool, entries: Sequence[Allocation]
) -> tuple[list[dict[str, Any]], set[str] | None]:
    """List the claims that decide the comparison; return them and the namespaces listed.

    The namespaces listed are None when every namespace was listed.
    """
    version, scope = ctx.versions.address, ctx.settings.namespaces
    if pool.is_global:
        # Claims of any namespace may hold an address of a Global pool.
        return ctx.kube.list_claims(version, scope), (set(scope) if scope else None)
    listed = {ns for ns in orphan_namespaces(pool, entries) if not scope or ns in scope}
    if not scope and len(listed) > _MAX_CLAIM_LISTS:
        # Entries of many namespaces (a subnet shared by many pools): one list of all.
        return ctx.kube.list_claims(version, ()), None
    claims = ctx.kube.list_claims(version, tuple(sorted(listed))) if listed else []
    return claims, listed


def _confirmed(
    ctx: Operator, pool: Pool, backend: IPAMBackend, findings: list[Finding]
) -> list[Finding]:
    """Drop the orphans whose entry is gone by a second list of the entries.

    A claim being released frees its entry before it goes, so an entry listed before the
    claims and gone after them was a live claim's.
    """
    if not any(f.finding == FindingKind.ORPHAN for f in findings):
        return findings
    again = {
        (normal_address(e.address) or e.address, unqualified_host(pool, e.hostname) or e.hostname)
        for e in _list_entries(ctx, pool, backend)
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


def survey(ctx: Operator, pool: Pool, backend: IPAMBackend | None = None) -> Survey:
    """Read a pool's IPAM entries, IPAddresses and claims, and compare them (no writes).

    Reads, in this order: the entries (one list request per subnet), the pool's IPAddresses
    (one list of its namespace; all namespaces for a Global pool), the claims of the
    namespaces that matter (`orphan_namespaces`, within the operator's namespaces), and,
    only when orphans were found, the entries once more: an orphan counts only if its
    entry is still there (a claim being released frees its entry before it goes).

    Parameters
    ----------
    ctx:
        The Kubernetes client, settings and metrics.
    pool:
        The pool to survey.
    backend:
        The pool's IPAM client (None: the shared one of ``ctx``).

    Raises
    ------
    PoolError
        When the pool's Secret is missing or its client cannot be built.
    backends.errors.BackendError
        When the IPAM cannot be listed.
    kubernetes.client.ApiException
        When the API refuses a list.
    """
    backend = backend if backend is not None else ctx.clients.backend_for(pool)
    entries = _list_entries(ctx, pool, backend)
    address_bodies = _list_addresses(ctx, pool)
    claim_bodies, listed = _list_claims(ctx, pool, entries)
    by_name = _claims_by_name(claim_bodies, ctx.versions.address)
    addresses = typed_addresses(address_bodies)
    claims = typed_claims(claim_bodies)
    findings = compare(pool, entries, addresses, claims, claim_namespaces=listed)
    findings = _confirmed(ctx, pool, backend, findings)
    mine = sum(
        1
        for a in addresses
        if a.spec.pool_ref.kind == pool.kind and a.spec.pool_ref.name == pool.name
    )
    return Survey(pool, findings, by_name, len(entries), mine)
