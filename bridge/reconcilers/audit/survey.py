"""The drift survey: read a pool's IPAM entries, IPAddresses and claims, and compare them.

Read-only, for the operator's audit (`bridge.reconcilers.audit.service`) and for
``ipam-bridge audit`` (`bridge.reconcilers.audit.cli`). The objects the API hands over are
turned into typed values here (`typed_addresses`, `typed_claims`), at the edge, and
compared by `bridge.reconcilers.audit.compare.compare`.

Where the objects come from: the operator's informer cache (`SurveyDeps.cache`,
`bridge.objects.cache.Cache`) while its claims and IPAddresses parts are synced and not
suspect, as a controller-runtime controller reads its cache
(https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/cache); else (``ipam-bridge audit``,
a part not synced or suspect after a watch restart) lists of the API. Either way only what
the comparison needs is typed and kept: the pool's IPAddresses (``spec.poolRef`` checked on
the raw object, before anything is typed) and the claims they and the pool's entries name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

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
    named_claims,
    normal_address,
    orphan_namespaces,
    owner_counts,
    unqualified_host,
)
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.pool_backends import BACKEND_NAMES, Pool

__all__ = [
    "CachedObjects",
    "CachedPart",
    "PoolBackends",
    "Survey",
    "SurveyApi",
    "SurveyCache",
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

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return one claim, or None when it does not exist."""


class CachedPart(Protocol):
    """One part of the informer cache, read-only (`bridge.runtime.store.Store`)."""

    @property
    def synced(self) -> bool:
        """True once the part's listing was seen."""

    @property
    def suspected(self) -> bool:
        """True while a watch restart left the part unconfirmed (read the API meanwhile)."""

    def get(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """Return the object cached under ``(namespace, name)`` (a fresh dict), or None."""

    def __contains__(self, key: tuple[str, str]) -> bool:
        """Tell whether an object is cached under ``(namespace, name)``."""

    def values(self) -> Iterator[dict[str, Any]]:
        """Iterate over a snapshot of the cached objects (each a fresh dict)."""


class SurveyCache(Protocol):
    """The informer cache's claims and IPAddresses (`bridge.objects.cache.Cache`).

    Both hold the objects whose ``spec.poolRef`` names one of our pools, in the operator's
    namespaces, keyed by ``(namespace, name)``.
    """

    @property
    def claims(self) -> CachedPart:
        """The claims of our pools."""

    @property
    def addresses(self) -> CachedPart:
        """The IPAddresses of our pools."""


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
    cache:
        The operator's informer cache, read instead of the API while trustworthy
        (`CachedObjects.trusted`); None (``ipam-bridge audit``): the API is listed.
    cluster_id:
        This management cluster's identity (`bridge.cluster_id.resolve_cluster_id`): entries
        of other clusters are counted, never called orphans.
    """

    kube: SurveyApi
    clients: PoolBackends
    metrics: Metrics
    versions: ServedVersions
    namespaces: tuple[str, ...]
    cache: SurveyCache | None = None
    cluster_id: str = ""


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
    owners:
        How many entries each ipam-bridge owner holds, by cluster id (`owner_counts`:
        ``""`` is the previous release; this cluster's id is always a key).
    """

    pool: Pool
    findings: list[Finding]
    claims: dict[ClaimName, dict[str, Any]] = field(default_factory=dict)
    entries: int = 0
    addresses: int = 0
    owners: dict[str, int] = field(default_factory=dict)


_T = TypeVar("_T")


def _typed(
    bodies: Iterable[Mapping[str, Any]], parse: Callable[[Mapping[str, Any]], _T], what: str
) -> list[_T]:
    """Return ``parse`` of each body; a body it refuses (ValueError) is logged and left out."""
    typed: list[_T] = []
    for body in bodies:
        try:
            typed.append(parse(body))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            log.debug("drift audit: %s not audited: %s", what, exc)
    return typed


def typed_addresses(bodies: Iterable[Mapping[str, Any]]) -> list[IPAddress]:
    """Return IPAddress objects as the API lists them as `bridge.models.IPAddress` values.

    An object that does not parse (not an IPAddress) is left out: it is not audited.
    """
    return _typed(bodies, IPAddress.model_validate, "IPAddress")


def typed_claims(bodies: Iterable[Mapping[str, Any]]) -> list[Claim]:
    """Return IPAddressClaim objects as the API lists them as `bridge.capi.Claim` values.

    A claim that does not parse (``spec.poolRef`` without a kind or a name, which the CRD
    does not admit) is left out.
    """
    return _typed(bodies, Claim.from_body, "claim")


def _list_entries(deps: SurveyDeps, pool: Pool, backend: IPAMBackend) -> list[Allocation]:
    return deps.metrics.call(BACKEND_NAMES[pool.kind], "entries", backend.entries)


def _pool_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return ``(kind, name)`` of an object's raw ``spec.poolRef``, or None without one."""
    spec = body.get("spec")
    ref = spec.get("poolRef") if isinstance(spec, Mapping) else None
    if not isinstance(ref, Mapping):
        return None
    return str(ref.get("kind")), str(ref.get("name"))


def _key_of(body: Mapping[str, Any]) -> ClaimName:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


class CachedObjects:
    """The informer cache as one audit round reads it: the IPAddresses of each pool.

    The first `addresses_of` goes through the cached IPAddresses once and keeps the keys of
    each pool's (``(namespace, name)`` only); each pool's are then read by key. Claims are
    read by key when surveyed, so a claim created since the round started is seen.

    Parameters
    ----------
    cache:
        The informer cache's claims and IPAddresses.
    """

    def __init__(self, cache: SurveyCache) -> None:
        self.cache = cache
        self._keys: dict[tuple[str, str], list[ClaimName]] | None = None

    @property
    def trusted(self) -> bool:
        """True while both parts are synced and not suspect (else the API is listed)."""
        parts = (self.cache.claims, self.cache.addresses)
        return all(p.synced and not p.suspected for p in parts)

    def addresses_of(self, pool: Pool) -> Iterator[dict[str, Any]]:
        """Yield the cached IPAddresses whose ``spec.poolRef`` names ``pool`` (kind, name)."""
        if self._keys is None:
            self._keys = {}
            for cached in self.cache.addresses.values():
                ref = _pool_of(cached)
                if ref is not None:
                    self._keys.setdefault(ref, []).append(_key_of(cached))
        for key in self._keys.get((pool.kind, pool.name), ()):
            body = self.cache.addresses.get(key)
            if body is not None and _pool_of(body) == (pool.kind, pool.name):
                yield body

    def claims_named(self, wanted: _Wanted) -> list[dict[str, Any]]:
        """Return the cached claims ``wanted`` names (exactly, or by a prefix)."""
        found = [b for b in map(self.cache.claims.get, sorted(wanted.exact)) if b is not None]
        if wanted.prefixes:
            found += [
                b
                for b in self.cache.claims.values()
                if _key_of(b) not in wanted.exact and wanted.matches(_key_of(b))
            ]
        return found


@dataclass
class _Wanted:
    """The claims a comparison needs: by ``(namespace, name)``, and name prefixes."""

    exact: set[ClaimName] = field(default_factory=set)
    prefixes: dict[str, list[str]] = field(default_factory=dict)

    def matches(self, key: ClaimName) -> bool:
        """Return True when ``key`` is wanted, exactly or by a prefix of its namespace."""
        if key in self.exact:
            return True
        return any(key[1].startswith(p) for p in self.prefixes.get(key[0], ()))


def _wanted(
    pool: Pool, entries: Sequence[Allocation], addresses: Iterable[IPAddress], cluster_id: str
) -> _Wanted:
    """Return the claims the comparison reads: the IPAddresses' and this cluster's entries'."""
    wanted = _Wanted()
    for address in addresses:
        meta = address.metadata
        wanted.exact.add((meta.namespace, address.spec.claim_ref.name or meta.name))
    for namespace, name, exact in named_claims(pool, entries, cluster_id):
        if exact:
            wanted.exact.add((namespace, name))
        else:
            wanted.prefixes.setdefault(namespace, []).append(name)
    return wanted


def _listed_addresses(deps: SurveyDeps, pool: Pool) -> Iterator[dict[str, Any]]:
    """Yield the pool's IPAddresses from lists of the API (its namespace's, or all).

    Each list answer is dropped as soon as the pool's objects are taken from it.
    """
    version, scope = deps.versions.address, deps.namespaces
    if pool.namespace:
        lists: Iterable[str | None] = (pool.namespace,)
    else:
        lists = scope or (None,)
    for namespace in lists:
        mine = [
            b
            for b in deps.kube.list_ip_addresses(version, namespace)
            if _pool_of(b) == (pool.kind, pool.name)
        ]
        yield from mine


def _list_claims(
    deps: SurveyDeps, pool: Pool, entries: Sequence[Allocation], wanted: _Wanted
) -> tuple[list[dict[str, Any]], set[str] | None]:
    """List the claims that decide the comparison; return the wanted ones and the namespaces.

    The namespaces listed are None when every namespace was listed.
    """
    version, scope = deps.versions.address, deps.namespaces
    listed: set[str] | None
    if pool.is_global:
        # Claims of any namespace may hold an address of a Global pool.
        namespaces, listed = scope, (set(scope) if scope else None)
    else:
        named = orphan_namespaces(pool, entries, deps.cluster_id)
        listed = {ns for ns in named if not scope or ns in scope}
        namespaces = tuple(sorted(listed))
        if not scope and len(listed) > _MAX_CLAIM_LISTS:
            # Entries of many namespaces (a subnet shared by many pools): one list of all.
            namespaces, listed = (), None
        elif not listed:
            return [], listed
    claims = [b for b in deps.kube.list_claims(version, namespaces) if wanted.matches(_key_of(b))]
    return claims, listed


def _confirmed(
    deps: SurveyDeps,
    pool: Pool,
    backend: IPAMBackend,
    findings: list[Finding],
    *,
    from_cache: bool,
) -> list[Finding]:
    """Drop the orphans whose entry is gone by a second list of the entries.

    A claim being released frees its entry before it goes, so an entry listed before the
    claims and gone after them was a live claim's. With the claims read from the informer
    cache, which holds only claims of our pools, an orphan's claim is also looked up in the
    API: a claim of that name with another provider's pool exists, as a list of its
    namespace would have shown (one GET per orphan, only when there are orphans).
    """
    if not any(f.finding == FindingKind.ORPHAN for f in findings):
        return findings
    again = {
        (normal_address(e.address) or e.address, unqualified_host(pool, e.hostname) or e.hostname)
        for e in _list_entries(deps, pool, backend)
        if e.quarantined_until is None
    }
    return [
        f
        for f in findings
        if f.finding != FindingKind.ORPHAN
        or ((f.address, f.hostname) in again and not (from_cache and _claim_exists(deps, f.claim)))
    ]


def _claim_exists(deps: SurveyDeps, claim: str) -> bool:
    """Tell whether the claim ``<namespace>/<name>`` exists in the API, whoever's it is."""
    namespace, _, name = claim.partition("/")
    return deps.kube.get_claim(deps.versions.address, namespace, name) is not None


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


def survey(
    deps: SurveyDeps,
    pool: Pool,
    backend: IPAMBackend | None = None,
    *,
    cached: CachedObjects | None = None,
) -> Survey:
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
    if cached is None and deps.cache is not None:
        cached = CachedObjects(deps.cache)
    from_cache = cached is not None and cached.trusted
    if cached is not None and from_cache:
        addresses = typed_addresses(cached.addresses_of(pool))
        wanted = _wanted(pool, entries, addresses, deps.cluster_id)
        claim_bodies = cached.claims_named(wanted)
        scope = deps.namespaces
        listed: set[str] | None = set(scope) if scope else None
    else:
        addresses = typed_addresses(_listed_addresses(deps, pool))
        wanted = _wanted(pool, entries, addresses, deps.cluster_id)
        claim_bodies, listed = _list_claims(deps, pool, entries, wanted)
    by_name = _claims_by_name(claim_bodies, deps.versions.address)
    claims = typed_claims(claim_bodies)
    findings = compare(
        pool, entries, addresses, claims, claim_namespaces=listed, cluster_id=deps.cluster_id
    )
    findings = _confirmed(deps, pool, backend, findings, from_cache=from_cache)
    owners = owner_counts(entries, deps.cluster_id)
    return Survey(pool, findings, by_name, len(entries), len(addresses), owners)
