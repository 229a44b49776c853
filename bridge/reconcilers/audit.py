"""Drift audit: each pool's IPAddresses against the pool's entries in the IPAM (DESIGN.md 12).

The IPAM is shared with people and other tools: an entry that "looks unused" gets deleted,
renamed, or its address handed to a printer; a failed run leaves an entry behind. The audit
compares, pool by pool, what Kubernetes says (the pool's IPAddresses and their claims) with
what the IPAM holds (`backends.base.IPAMBackend.entries`: one list request per subnet), in
memory, and names three findings (`FindingKind`):

- **missing**: an IPAddress whose entry is gone from the IPAM (no entry at its address, and
  its hostname registered nowhere else in the pool). The operator registers it again at the
  same address under the claim's hostname when that address is free (Normal Event
  ``AddressRestored`` on the claim); a held address makes it a conflict.
- **conflict**: the IPAddress's address is registered under another hostname (a renamed
  entry, another tool's entry, a quarantined one), or the claim's hostname holds another
  address. Warning Event ``AddressConflict`` on the claim naming both; never "fixed" by
  taking an address from anyone.
- **orphan**: an entry whose description says ipam-bridge made it (``ipam-bridge
  <namespace>/<claim>``) for a claim that no longer exists, and that is not quarantined by
  us (a grace period, `backends.base.quarantined_until`). Warning Event ``OrphanEntry`` on
  the pool; never deleted by the audit.

Not findings: entries of other tools and people at addresses no IPAddress claims (simply
used addresses), our reserved rows (`backends.phpipam.RESERVED_HOSTNAMES`: gateway, network
and broadcast reservations), quarantined entries, IPAddresses and claims being deleted (their
release decides), IPAddresses registered at another IPAM location than the pool's current one
(`pool_backends.location_of`; only a ``subnets`` list that grew at its end counts as the
same location).

Layers, as elsewhere: `compare` is pure (bodies and entries in, `Finding` list out);
`survey` reads (one ``entries()`` per pool, one IPAddress list and one claim list per
namespace) and compares, read-only, for the operator and for ``ipam-bridge audit``;
`Auditor` acts on the leader (repairs, Events, the pool's ``InSync`` condition, the metric
``ipam_bridge_drift{pool,kind,finding}``); `audit_forever` runs it every
``IPAM_BRIDGE_AUDIT_SECONDS`` in a thread of its own, never in the claim work queue's
worker slots. A backend error during an audit is logged and retried at the next round,
never a finding.

Races with claims being allocated or released at the same time are ruled out by the order
of the reads and by checks before anything is reported or written: the entries are listed
before the IPAddresses, and the IPAddresses before the claims (an allocation registers the
entry before it creates the IPAddress; a release marks the claim deleted before it frees the
entry), orphans are confirmed by a second list of the entries (a claim goes only after its
entry), and a repair re-reads the claim and its IPAddress and looks the hostname up first.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import datetime
import enum
import ipaddress
import json
import logging
import re
import sys
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from kubernetes.client import ApiException

from backends.base import Allocation, IPAMBackend
from backends.errors import AddressUnavailableError, BackendError
from backends.phpipam import RESERVED_HOSTNAMES
from bridge import capi
from bridge.capi import Claim, Reason
from bridge.reconcilers.claims import description_for
from bridge.reconcilers.context import Context
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import BACKEND_NAMES, LOCATION_FIELDS, Pool, parse_pool
from bridge.reconcilers.pools import backend_for
from bridge.runtime.gateway import Kube, access_denied, api_client, api_status_message
from bridge.settings import Settings

__all__ = [
    "EXIT_DRIFT",
    "EXIT_ERROR",
    "EXIT_IN_SYNC",
    "IN_SYNC",
    "Auditor",
    "Finding",
    "FindingKind",
    "PoolAudit",
    "Survey",
    "audit_forever",
    "compare",
    "counts",
    "format_table",
    "in_sync_condition",
    "orphan_namespaces",
    "pool_label",
    "run_cli",
    "survey",
]

log = logging.getLogger(__name__)

#: The pool condition type the audit writes (DESIGN.md section 3).
IN_SYNC = "InSync"

#: Above this many namespaces named by a pool's entries, its audit lists the claims of all
#: namespaces at once instead of one list per namespace.
_MAX_CLAIM_LISTS = 4

#: ``ipam-bridge <namespace>/<claim>`` at the start of an entry's description
#: (`bridge.reconcilers.claims.description_for`); what follows the name, if anything, is whitespace.
_PROVENANCE = re.compile(
    r"^ipam-bridge (?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?=\s|$)"
)


class FindingKind(enum.StrEnum):
    """What the audit found (the ``finding`` label of the drift metric)."""

    MISSING = "missing"
    CONFLICT = "conflict"
    ORPHAN = "orphan"


@dataclass(frozen=True)
class Finding:
    """One difference between a pool's IPAddresses and its IPAM entries.

    Attributes
    ----------
    pool:
        ``<namespace>/<name>`` of the pool (``<name>`` for a Global pool).
    kind:
        The pool's kind (``PHPIPAMIPPool``...).
    claim:
        ``<namespace>/<name>`` of the claim concerned (for an orphan: the claim its
        description names, which no longer exists).
    address:
        The IP address concerned (normalised).
    hostname:
        The hostname in the IPAM: for a missing entry the one it should be registered under;
        for a conflict the hostname holding the address (or the claim's hostname when it holds
        another address); for an orphan the entry's.
    finding:
        missing, conflict or orphan.
    message:
        One sentence for a person, naming everything concerned (both sides of a conflict).
    ip_address:
        Name of the IPAddress concerned (``""`` for an orphan).
    expected:
        The hostname the claim's entry must have (``""`` for an orphan).
    """

    pool: str
    kind: str
    claim: str
    address: str
    hostname: str
    finding: FindingKind
    message: str
    ip_address: str = ""
    expected: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """``(finding, claim, address, hostname)``: the same drift seen in two rounds."""
        return (self.finding.value, self.claim, self.address, self.hostname)

    def as_dict(self) -> dict[str, str]:
        """Return the finding as JSON-ready text (``ipam-bridge audit --output json``).

        Keys ``pool``, ``kind``, ``claim``, ``address``, ``hostname``, ``finding``,
        ``message``, ``ipAddress``, ``expectedHostname``.
        """
        return {
            "pool": self.pool,
            "kind": self.kind,
            "claim": self.claim,
            "address": self.address,
            "hostname": self.hostname,
            "finding": self.finding.value,
            "message": self.message,
            "ipAddress": self.ip_address,
            "expectedHostname": self.expected,
        }


# -- the comparison (pure) ---------------------------------------------------------------


def pool_label(pool: Pool) -> str:
    """Return ``<namespace>/<name>`` of a pool (``<name>`` for a Global pool)."""
    return f"{pool.namespace}/{pool.name}" if pool.namespace else pool.name


def _metric_pool(pool: Pool) -> str:
    """Return the ``pool`` label of the metrics: ``<namespace>/<name>`` as elsewhere."""
    return f"{pool.namespace}/{pool.name}"


def _normal_address(text: Any) -> str | None:
    try:
        return ipaddress.ip_address(str(text).strip()).compressed
    except ValueError:
        return None


def _zone(pool: Pool) -> str:
    if "Infoblox" not in pool.kind:
        return ""
    return str(pool.spec.get("dnsZone") or "").strip(".").lower()


def _ipam_host(pool: Pool, name: str) -> str:
    """Return an IPAM entry's hostname as a claim's key compares (case, trailing dot, zone)."""
    host = name.strip().rstrip(".").lower()
    zone = _zone(pool)
    if zone and host.endswith(f".{zone}"):
        host = host[: -len(zone) - 1]
    return host


def _registered_here(pool: Pool, recorded: str | None) -> bool:
    """Return True when an IPAddress's recorded IPAM location is the pool's current one.

    No (or an unreadable) record counts as here. ``subnets`` may have grown at its end since
    (the only change the CRDs allow); every other location field must be equal.
    """
    if not recorded:
        return True
    try:
        location = json.loads(recorded)
    except ValueError:
        return True
    if not isinstance(location, dict):
        return True
    for key in LOCATION_FIELDS.get(pool.kind, ()):
        now, then = pool.spec.get(key), location.get(key)
        if key == "subnets" and isinstance(now, list) and isinstance(then, list):
            if now[: len(then)] != then:
                return False
        elif now != then:
            return False
    return True


def _provenance(pool: Pool, entry: Allocation) -> tuple[str, str, bool] | None:
    """Return ``(namespace, claim, exact)`` an entry's description names, or None.

    The IPAM may cut a long description (phpIPAM keeps 64 characters): when nothing follows
    the claim's name, the name may be cut short. The entry's hostname (``<claim>.<namespace>``
    plus the pool's suffix) then gives the full name when it starts with the cut one;
    otherwise ``exact`` is False and the name is a prefix.
    """
    match = _PROVENANCE.match(entry.description or "")
    if match is None:
        return None
    namespace, name = match["ns"], match["name"]
    if match.end() < len(entry.description):
        return namespace, name, True
    host = _ipam_host(pool, entry.hostname)
    if host.startswith(name):
        marker = f".{namespace}"
        at = host.find(marker, len(name))
        while at != -1:
            end = at + len(marker)
            if end == len(host) or host[end] == ".":
                return namespace, host[:at], True
            at = host.find(marker, at + 1)
    return namespace, name, False


def orphan_namespaces(pool: Pool, entries: Iterable[Allocation]) -> set[str]:
    """Return the namespaces whose claims decide whether some entry is an orphan.

    Those named by the descriptions of entries ipam-bridge made (not quarantined, not a
    reserved row), plus the pool's own namespace (``""`` for a Global pool is left out).
    """
    found = {pool.namespace} if pool.namespace else set()
    for entry in entries:
        if entry.quarantined_until is not None or _reserved(entry):
            continue
        named = _provenance(pool, entry)
        if named is not None:
            found.add(named[0])
    return found


def _reserved(entry: Allocation) -> bool:
    return entry.hostname.strip().lower() in RESERVED_HOSTNAMES


@dataclass(frozen=True)
class _Recorded:
    """An IPAddress of the pool whose claim is live, as the comparison needs it."""

    namespace: str
    name: str
    claim: str
    address: str
    hostname: str


def _recorded(
    pool: Pool, body: Mapping[str, Any], claims: Mapping[tuple[str, str], Mapping[str, Any]]
) -> _Recorded | None:
    """Return an IPAddress of ``pool`` to audit, or None (another pool's, being deleted...)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    ref = spec.get("poolRef") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if ref.get("kind") != pool.kind or ref.get("name") != pool.name:
        return None
    if ref.get("apiGroup") not in (None, capi.GROUP):
        return None
    if pool.namespace and namespace != pool.namespace:
        return None
    if meta.get("deletionTimestamp"):
        return None
    annotations = meta.get("annotations") or {}
    if not _registered_here(pool, annotations.get(capi.LOCATION_ANNOTATION)):
        return None
    claim_name = str((spec.get("claimRef") or {}).get("name") or name)
    claim_body = claims.get((namespace, claim_name))
    if claim_body is None:
        return None  # the claim is gone: its IPAddress goes with it (owner reference)
    claim_meta = claim_body.get("metadata") or {}
    claim_ref = (claim_body.get("spec") or {}).get("poolRef") or {}
    if claim_meta.get("deletionTimestamp"):
        return None  # being released: the release decides
    if claim_ref.get("kind") != pool.kind or claim_ref.get("name") != pool.name:
        return None
    address = _normal_address(spec.get("address"))
    if address is None:
        return None
    hostname = annotations.get(capi.HOSTNAME_ANNOTATION)
    if not hostname:
        try:
            hostname = capi.hostname_for(Claim.from_body(claim_body), pool.hostname_suffix)
        except ValueError:
            return None
    return _Recorded(namespace, name, claim_name, address, str(hostname).strip().lower())


def _quoted(entry: Allocation, pool: Pool) -> str:
    text = f"'{_ipam_host(pool, entry.hostname) or entry.hostname}'"
    if entry.quarantined_until is not None:
        text += " (quarantined by ipam-bridge)"
    return text


def compare(
    pool: Pool,
    entries: Sequence[Allocation],
    addresses: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    *,
    claim_namespaces: Collection[str] | None = None,
) -> list[Finding]:
    """Compare a pool's IPAddresses and claims with its IPAM entries; return the findings.

    Pure: no I/O. Linear in the number of entries, IPAddresses and claims.

    Parameters
    ----------
    pool:
        The pool (its kind, name, hostname suffix, location, and for Infoblox its DNS zone,
        which is stripped from entry names before they are compared).
    entries:
        Every entry of the pool's subnets (`backends.base.IPAMBackend.entries`).
    addresses:
        IPAddress objects as the API returns them; those of other pools are ignored.
    claims:
        IPAddressClaim objects of the namespaces listed (the pool's, and those the entries'
        descriptions name: `orphan_namespaces`).
    claim_namespaces:
        The namespaces whose claims were listed; an entry naming a claim of another
        namespace is never called an orphan (it cannot be checked). None: all namespaces.

    Returns
    -------
    list of Finding
        Sorted by finding, claim and address. Missing findings are what a repair would
        register again; the comparison itself never decides whether the address is free
        beyond what ``entries`` shows.
    """
    label = pool_label(pool)
    by_claim: dict[tuple[str, str], Mapping[str, Any]] = {}
    names: dict[str, list[str]] = {}
    for body in claims:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        by_claim[key] = body
        names.setdefault(key[0], []).append(key[1])
    for listed in names.values():
        listed.sort()

    at_address: dict[str, list[Allocation]] = {}
    of_host: dict[str, list[Allocation]] = {}
    for entry in entries:
        address = _normal_address(entry.address) or entry.address
        at_address.setdefault(address, []).append(entry)
        if entry.quarantined_until is None and not _reserved(entry):
            of_host.setdefault(_ipam_host(pool, entry.hostname), []).append(entry)

    findings: list[Finding] = []
    matched: set[int] = set()  # id() of the entries that are an IPAddress's own
    for body in addresses:
        rec = _recorded(pool, body, by_claim)
        if rec is None:
            continue
        claim = f"{rec.namespace}/{rec.claim}"
        here = at_address.get(rec.address, [])
        own = [
            e
            for e in here
            if e.quarantined_until is None and _ipam_host(pool, e.hostname) == rec.hostname
        ]
        matched.update(id(e) for e in own)
        others = [e for e in here if e not in own]
        elsewhere = [
            e
            for e in of_host.get(rec.hostname, [])
            if (_normal_address(e.address) or e.address) != rec.address
        ]
        common = {
            "pool": label,
            "kind": pool.kind,
            "claim": claim,
            "address": rec.address,
            "ip_address": rec.name,
            "expected": rec.hostname,
        }
        if own and not elsewhere:
            continue
        if not here and not elsewhere:
            findings.append(
                Finding(
                    hostname=rec.hostname,
                    finding=FindingKind.MISSING,
                    message=(
                        f"IPAddress {rec.namespace}/{rec.name} of claim {claim} has "
                        f"{rec.address}, which is not registered in the IPAM (expected as "
                        f"'{rec.hostname}')"
                    ),
                    **common,
                )
            )
            continue
        parts = []
        if others and not own:
            holders = ", ".join(_quoted(e, pool) for e in others)
            parts.append(
                f"{rec.address} (IPAddress {rec.namespace}/{rec.name} of claim {claim}) is "
                f"registered in the IPAM as {holders}, not as '{rec.hostname}'"
            )
        if elsewhere:
            where = ", ".join(sorted({e.address for e in elsewhere}))
            parts.append(
                f"'{rec.hostname}' (claim {claim}) is registered at {where}"
                + (" as well" if own else f" instead of {rec.address}")
            )
        holder = _ipam_host(pool, others[0].hostname) if others and not own else rec.hostname
        findings.append(
            Finding(
                hostname=holder,
                finding=FindingKind.CONFLICT,
                message="; ".join(parts) + "; nothing was changed",
                **common,
            )
        )

    for entry in entries:
        if id(entry) in matched or entry.quarantined_until is not None or _reserved(entry):
            continue
        named = _provenance(pool, entry)
        if named is None:
            continue
        namespace, name, exact = named
        if claim_namespaces is not None and namespace not in claim_namespaces:
            continue
        listed = names.get(namespace, [])
        if exact:
            exists = (namespace, name) in by_claim
        else:
            at = bisect.bisect_left(listed, name)
            exists = at < len(listed) and listed[at].startswith(name)
        if exists:
            continue
        host = _ipam_host(pool, entry.hostname) or entry.hostname
        findings.append(
            Finding(
                pool=label,
                kind=pool.kind,
                claim=f"{namespace}/{name}",
                address=_normal_address(entry.address) or entry.address,
                hostname=host,
                finding=FindingKind.ORPHAN,
                message=(
                    f"entry {entry.address} '{host}' was registered by ipam-bridge for claim "
                    f"{namespace}/{name}, which no longer exists; it is left in the IPAM "
                    "(delete it there if nothing uses it)"
                ),
            )
        )
    order = {kind: i for i, kind in enumerate(FindingKind)}
    findings.sort(key=lambda f: (order[f.finding], f.claim, f.address, f.hostname))
    return findings


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def counts(findings: Iterable[Finding]) -> dict[FindingKind, int]:
    """Return how many findings of each kind (every kind present, 0 included)."""
    result = dict.fromkeys(FindingKind, 0)
    for finding in findings:
        result[finding.finding] += 1
    return result


def in_sync_condition(
    findings: Sequence[Finding],
    *,
    observed_generation: int | None = None,
    previous: Sequence[Mapping[str, Any]] = (),
    now: str | None = None,
) -> dict[str, Any]:
    """Return the pool's metav1 ``InSync`` condition after an audit.

    True (reason ``NoDrift``) without findings, else False (reason ``DriftFound``) with the
    count of each finding in the message. ``lastTransitionTime`` is kept from ``previous``
    while the status stays the same. Restored entries are not mentioned (their Events and
    ``ipam_bridge_drift_restored_total`` tell them): the condition changes only with the drift.
    """
    if findings:
        n = counts(findings)
        message = (
            f"{n[FindingKind.MISSING]} missing, {n[FindingKind.CONFLICT]} conflict, "
            f"{n[FindingKind.ORPHAN]} orphan: see the Events of the pool and its claims, or "
            "run `ipam-bridge audit`"
        )
        reason = Reason.DRIFT_FOUND
    else:
        message = "the pool's IPAddresses match its IPAM entries"
        reason = Reason.NO_DRIFT
    status = "False" if findings else "True"
    transition = now or _now()
    for old in previous:
        if old.get("type") == IN_SYNC and old.get("status") == status:
            transition = str(old.get("lastTransitionTime") or transition)
    condition: dict[str, Any] = {
        "type": IN_SYNC,
        "status": status,
        "reason": str(reason),
        "message": message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition


# -- reading (read-only; the operator and the CLI) ----------------------------------------


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
        The claims listed, by ``(namespace, name)`` (for Events on them).
    entries, addresses:
        How many IPAM entries and IPAddresses of the pool were compared.
    """

    pool: Pool
    findings: list[Finding]
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    entries: int = 0
    addresses: int = 0


def _list_entries(ctx: Context, pool: Pool, backend: IPAMBackend) -> list[Allocation]:
    return ctx.metrics.call(BACKEND_NAMES[pool.kind], "entries", backend.entries)


def survey(ctx: Context, pool: Pool, backend: IPAMBackend | None = None) -> Survey:
    """Read a pool's IPAM entries, IPAddresses and claims, and compare them (no writes).

    Reads, in this order: the entries (one list request per subnet), the pool's IPAddresses
    (one list of its namespace; all namespaces for a Global pool), the claims of the
    namespaces that matter (`orphan_namespaces`, within the operator's namespaces), and,
    only when orphans were found, the entries once more: an orphan counts only if its
    entry is still there (a claim being released frees its entry before it goes).

    Raises
    ------
    PoolError
        When the pool's Secret is missing or its client cannot be built.
    backends.errors.BackendError
        When the IPAM cannot be listed.
    kubernetes.client.ApiException
        When the API refuses a list.
    """
    version = ctx.address_version
    backend = backend if backend is not None else backend_for(ctx, pool)
    entries = _list_entries(ctx, pool, backend)
    scope = ctx.settings.namespaces
    if pool.namespace:
        addresses = ctx.kube.list_ip_addresses(version, pool.namespace)
    elif scope:
        addresses = [a for ns in scope for a in ctx.kube.list_ip_addresses(version, ns)]
    else:
        addresses = ctx.kube.list_ip_addresses(version, None)
    wanted = orphan_namespaces(pool, entries)
    listed: set[str] | None
    if pool.is_global:
        # Claims of any namespace may hold an address of a Global pool.
        claims = ctx.kube.list_claims(version, scope)
        listed = set(scope) if scope else None
    else:
        listed = {ns for ns in wanted if not scope or ns in scope}
        if not scope and len(listed) > _MAX_CLAIM_LISTS:
            # Entries of many namespaces (a subnet shared by many pools): one list of all.
            claims, listed = ctx.kube.list_claims(version, ()), None
        else:
            claims = ctx.kube.list_claims(version, tuple(sorted(listed))) if listed else []
    findings = compare(pool, entries, addresses, claims, claim_namespaces=listed)
    orphans = [f for f in findings if f.finding == FindingKind.ORPHAN]
    if orphans:
        again = {
            (_normal_address(e.address) or e.address, _ipam_host(pool, e.hostname) or e.hostname)
            for e in _list_entries(ctx, pool, backend)
            if e.quarantined_until is None
        }
        findings = [
            f
            for f in findings
            if f.finding != FindingKind.ORPHAN or (f.address, f.hostname) in again
        ]
    by_claim: dict[tuple[str, str], dict[str, Any]] = {}
    for body in claims:
        meta = body.get("metadata") or {}
        body.setdefault("apiVersion", f"{capi.GROUP}/{version}")
        body.setdefault("kind", "IPAddressClaim")
        by_claim[(str(meta.get("namespace")), str(meta.get("name")))] = body
    mine = sum(
        1
        for a in addresses
        if ((a.get("spec") or {}).get("poolRef") or {}).get("kind") == pool.kind
        and ((a.get("spec") or {}).get("poolRef") or {}).get("name") == pool.name
    )
    return Survey(pool, findings, by_claim, len(entries), mine)


# -- acting (the leader) ---------------------------------------------------------------------


@dataclass
class PoolAudit:
    """The outcome of one audit of a pool by the operator.

    Attributes
    ----------
    pool:
        The pool.
    findings:
        What is still wrong after the repairs (the condition and the metric show these).
    restored:
        Missing entries registered again at their address.
    """

    pool: Pool
    findings: list[Finding]
    restored: list[Finding] = field(default_factory=list)


class Auditor:
    """The drift audit of the leader: compares, repairs what it may, reports the rest.

    Keeps, in memory, the findings of each pool's last audit, so that a Warning Event is
    posted when a finding appears, not at every round (after a restart they are posted once
    more). Thread-safe for one round at a time (`audit_forever` runs one thread).

    Parameters
    ----------
    ctx:
        The operator context (Kubernetes, backends, metrics, settings).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._seen: dict[tuple[str, str, str], frozenset[tuple[str, str, str, str]]] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        """Make a running round stop before its next pool or repair (leadership lost)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """True once `stop` was called."""
        return self._stop.is_set()

    # -- a round ------------------------------------------------------------------------

    def run_round(self) -> list[PoolAudit]:
        """Audit every pool that is Ready (current generation) and not being deleted.

        Pool by pool; a pool whose audit fails (IPAM unreachable, Secret missing, API
        error) is logged and left as it was (condition, metric), to be audited at the next
        round: an error is never a finding.

        Returns
        -------
        list of PoolAudit
            The pools audited.
        """
        done: list[PoolAudit] = []
        present: set[tuple[str, str, str]] = set()
        for kind in capi.POOL_KINDS:
            try:
                bodies = self.ctx.kube.list_pools(kind, self.ctx.settings.namespaces)
            except ApiException as exc:
                log.warning("drift audit: cannot list %s: %s %s", kind, exc.status, exc.reason)
                return done
            for body in bodies:
                if self.stopped:
                    return done
                body.setdefault("kind", kind)
                try:
                    pool = parse_pool(body)
                except PoolError:
                    continue
                present.add(pool.key)
                if not _auditable(body, pool):
                    continue
                result = self._audit_logged(pool, body)
                if result is not None:
                    done.append(result)
        for key in set(self._seen) - present:
            del self._seen[key]
        return done

    def _audit_logged(self, pool: Pool, body: Mapping[str, Any]) -> PoolAudit | None:
        try:
            return self.audit_pool(pool, body)
        except BackendError as exc:
            log.warning(
                "drift audit of %s skipped: %s (trying again at the next round)",
                pool.display,
                exc.message,
            )
        except PoolError as exc:
            log.warning("drift audit of %s skipped: %s", pool.display, exc.message)
        except ApiException as exc:
            log.warning(
                "drift audit of %s skipped: API error %s %s", pool.display, exc.status, exc.reason
            )
        except Exception:
            log.exception("drift audit of %s failed (trying again at the next round)", pool.display)
        return None

    def audit_pool(self, pool: Pool, body: Mapping[str, Any]) -> PoolAudit:
        """Audit one pool: survey, repair missing entries, post Events, write status, metric.

        Parameters
        ----------
        pool, body:
            The pool, parsed and as read.

        Raises
        ------
        PoolError, backends.errors.BackendError, kubernetes.client.ApiException
            From `survey` (nothing is written then). Errors of single repairs are logged and
            leave that finding as it was.
        """
        ctx = self.ctx
        backend = backend_for(ctx, pool)
        seen = survey(ctx, pool, backend)
        findings: list[Finding] = []
        restored: list[Finding] = []
        for finding in seen.findings:
            if finding.finding != FindingKind.MISSING:
                findings.append(finding)
                continue
            if self.stopped:
                findings.append(finding)
                continue
            outcome = self._restore(pool, backend, finding)
            if outcome == "restored":
                restored.append(finding)
            elif isinstance(outcome, Finding):
                findings.append(outcome)
        self._report(pool, body, seen, findings)
        return PoolAudit(pool, findings, restored)

    # -- repair -------------------------------------------------------------------------

    def _restore(self, pool: Pool, backend: IPAMBackend, finding: Finding) -> Finding | str | None:
        """Register a missing entry again at its address under the claim's hostname.

        Returns ``"restored"``, None when the finding no longer holds (the claim or its
        IPAddress changed, or the entry is back), the finding itself while the claim is
        paused, or a conflict (the address or the hostname is held now).
        """
        ctx, version = self.ctx, self.ctx.address_version
        namespace, name = finding.claim.split("/", 1)
        body = ctx.kube.get_claim(version, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        address = ctx.kube.get_ip_address(version, namespace, finding.ip_address)
        if (
            address is None
            or (address.get("metadata") or {}).get("deletionTimestamp")
            or _normal_address((address.get("spec") or {}).get("address")) != finding.address
        ):
            return None
        try:
            claim = Claim.from_body(body)
        except ValueError:
            return None
        if self._paused(claim):
            return Finding(
                **{
                    **asdict(finding),
                    "message": finding.message + "; not registered again while paused",
                }
            )
        hostname = finding.expected
        backend_name = BACKEND_NAMES[pool.kind]
        try:
            found = ctx.metrics.call(backend_name, "find", lambda: backend.find(hostname))
            if found is not None:
                if (_normal_address(found.address) or found.address) == finding.address:
                    return None  # registered meanwhile (an allocation in flight)
                return _conflict_from(
                    finding,
                    f"'{hostname}' (claim {finding.claim}) is registered at {found.address} "
                    f"instead of {finding.address}; nothing was changed",
                    hostname,
                )
            if self.stopped:
                return finding
            allocation = ctx.metrics.call(
                backend_name,
                "allocate",
                lambda: backend.allocate(hostname, description_for(claim), address=finding.address),
            )
        except AddressUnavailableError as exc:
            holder = exc.holder or ""
            why = f"it is held as '{holder}'" if holder else exc.message
            return _conflict_from(
                finding,
                f"{finding.address} (IPAddress {namespace}/{finding.ip_address} of claim "
                f"{finding.claim}) is gone from the IPAM and cannot be registered again as "
                f"'{hostname}': {why}; nothing was changed",
                holder or hostname,
            )
        except BackendError as exc:
            log.warning(
                "drift audit of %s: %s not registered again: %s (trying at the next round)",
                pool.display,
                finding.address,
                exc.message,
            )
            return finding
        if (_normal_address(allocation.address) or allocation.address) != finding.address:
            return _conflict_from(
                finding,
                f"'{hostname}' (claim {finding.claim}) is registered at {allocation.address} "
                f"instead of {finding.address}; nothing was changed",
                hostname,
            )
        # A release that started meanwhile must not find the entry back: undo.
        after = ctx.kube.get_claim(version, namespace, name)
        if after is None or (after.get("metadata") or {}).get("deletionTimestamp"):
            try:
                backend.release(hostname)
            except BackendError as exc:
                log.warning(
                    "drift audit of %s: could not undo %s of released claim %s: %s",
                    pool.display,
                    finding.address,
                    finding.claim,
                    exc.message,
                )
            return None
        message = (
            f"{finding.address} was gone from the IPAM ({pool.display}); registered again as "
            f"'{hostname}' at the same address"
        )
        log.info("drift audit: claim %s: %s", finding.claim, message)
        ctx.event(body, "Normal", Reason.ADDRESS_RESTORED, message)
        ctx.metrics.drift_restored.labels(_metric_pool(pool), pool.kind).inc()
        return "restored"

    def _paused(self, claim: Claim) -> bool:
        """Return True when the claim or its Cluster is paused (no IPAM write then)."""
        if capi.PAUSED_ANNOTATION in claim.annotations:
            return True
        if not claim.cluster_name:
            return False
        cluster = self.ctx.kube.get_cluster(claim.namespace, claim.cluster_name)
        if cluster is None:
            return False
        annotations = (cluster.get("metadata") or {}).get("annotations")
        return capi.is_paused(annotations, cluster.get("spec"))

    # -- reporting ------------------------------------------------------------------------

    def _report(
        self,
        pool: Pool,
        body: Mapping[str, Any],
        seen: Survey,
        findings: Sequence[Finding],
    ) -> None:
        """Post Events for new findings, set the metric, write ``InSync`` where it changed."""
        ctx = self.ctx
        before = self._seen.get(pool.key, frozenset())
        for finding in findings:
            if finding.key in before:
                continue
            if finding.finding == FindingKind.ORPHAN:
                ctx.event(body, "Warning", Reason.ORPHAN_ENTRY, finding.message)
            else:
                namespace, name = finding.claim.split("/", 1)
                claim = seen.claims.get((namespace, name))
                reason = (
                    Reason.ADDRESS_MISSING
                    if finding.finding == FindingKind.MISSING
                    else Reason.ADDRESS_CONFLICT
                )
                ctx.event(claim or body, "Warning", reason, finding.message)
            log.warning("drift audit of %s: %s: %s", pool.display, finding.finding, finding.message)
        self._seen[pool.key] = frozenset(f.key for f in findings)
        n = counts(findings)
        for kind, count in n.items():
            ctx.metrics.drift.labels(_metric_pool(pool), pool.kind, kind.value).set(count)
        self._write_condition(pool, findings)

    def _write_condition(self, pool: Pool, findings: Sequence[Finding]) -> None:
        """Write the pool's ``InSync`` condition when it changed, keeping every other one.

        Read, merged and written with the pool's resourceVersion: a concurrent status write
        (the pool check's Ready) makes the API answer 409 and this reads again, so neither
        writer ever drops the other's condition.
        """
        ctx = self.ctx
        for _ in range(5):
            current = ctx.kube.get_pool(pool.namespace, pool.kind, pool.name)
            if current is None:
                return
            current.setdefault("kind", pool.kind)
            conditions = list((current.get("status") or {}).get("conditions") or [])
            old = next((c for c in conditions if c.get("type") == IN_SYNC), None)
            new = in_sync_condition(
                findings,
                observed_generation=int((current.get("metadata") or {}).get("generation") or 0)
                or None,
                previous=conditions,
            )
            if old is not None and all(
                old.get(k) == new.get(k) for k in ("status", "reason", "message")
            ):
                return
            merged = [c for c in conditions if c.get("type") != IN_SYNC] + [new]
            try:
                ctx.kube.patch_pool_conditions(current, merged)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        log.info("drift audit of %s: InSync not written (the pool kept changing)", pool.display)


def _conflict_from(finding: Finding, message: str, hostname: str) -> Finding:
    return Finding(
        pool=finding.pool,
        kind=finding.kind,
        claim=finding.claim,
        address=finding.address,
        hostname=hostname,
        finding=FindingKind.CONFLICT,
        message=message,
        ip_address=finding.ip_address,
        expected=finding.expected,
    )


def _auditable(body: Mapping[str, Any], pool: Pool) -> bool:
    """Return True when a pool is audited: not being deleted, Ready for its generation."""
    if pool.deleting:
        return False
    status = body.get("status") or {}
    return capi.ready_of(body)[0] == "True" and status.get("observedGeneration") == pool.generation


async def audit_forever(ctx: Context) -> None:
    """Audit every pool every ``IPAM_BRIDGE_AUDIT_SECONDS`` until cancelled (0: never).

    Runs on the leader (`bridge.handlers.lifecycle.start_work`). Each round runs in a
    thread of its own (one, named ``ipam-bridge-audit``), never in the work queue's worker
    threads, so an audit never delays claim handling. The first round starts one interval
    after the start. Cancelling (clean-up, lost leadership) stops a running round before
    its next pool or repair.
    """
    interval = ctx.settings.audit_seconds
    if not interval:
        return
    auditor = Auditor(ctx)
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="ipam-bridge-audit"
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            await asyncio.sleep(interval)
            try:
                audited = await loop.run_in_executor(executor, _held_round, ctx, auditor)
            except Exception:
                log.exception("drift audit round failed; trying again at the next round")
                continue
            log.debug("drift audit: %d pools audited", len(audited))
    finally:
        auditor.stop()
        executor.shutdown(wait=False, cancel_futures=True)


def _held_round(ctx: Context, auditor: Auditor) -> list[PoolAudit]:
    """Run one audit round holding the backend clients it takes (`BackendCache.holding`)."""
    with ctx.backends.holding():
        return auditor.run_round()


# -- ipam-bridge audit (a person's kubeconfig, read-only) ----------------------------------

#: Exit codes of ``ipam-bridge audit``.
EXIT_IN_SYNC, EXIT_DRIFT, EXIT_ERROR = 0, 1, 2

_COLUMNS = ("POOL", "CLAIM", "ADDRESS", "IPAM HOSTNAME", "FINDING")


def format_table(findings: Sequence[Finding]) -> str:
    """Return the findings as a plain-text table (pool, claim, address, IPAM hostname, finding)."""
    rows = [_COLUMNS] + [
        (f.pool, f.claim or "-", f.address, f.hostname or "-", f.finding.value) for f in findings
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def run_cli(
    namespace: str | None = None,
    output: str = "table",
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``ipam-bridge audit``: the operator's comparison, read-only, from a kubeconfig.

    Reads the current kubeconfig (``$KUBECONFIG``, else ``~/.kube/config``, else the
    in-cluster service account); lists our pools (of ``namespace`` only, when given: Global
    pools are then compared for that namespace's IPAddresses and claims), and compares each
    one with its IPAM (`survey`). Nothing is written: no repair, no Event, no status. The
    identity needs ``list`` on the pools, IPAddresses and IPAddressClaims and ``get`` on the
    pools' Secrets (the IPAM credentials).

    Parameters
    ----------
    namespace:
        Audit only the pools of this namespace (None: all namespaces).
    output:
        ``table`` (columns pool, claim, address, IPAM hostname, finding; then a summary) or
        ``json`` (``inSync``, ``pools``, ``findings`` with messages, ``errors``).
    out, err:
        Where the result and the error lines go (default stdout, stderr).

    Returns
    -------
    int
        `EXIT_IN_SYNC` (0) when every pool was audited and nothing was found,
        `EXIT_DRIFT` (1) when something was found, `EXIT_ERROR` (2) when the audit is
        incomplete: no kubeconfig, the API refused, CAPI's CRDs not served, or a pool whose
        IPAM (or Secret) could not be read (its message is printed; findings of the other
        pools are still shown).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        ctx = _cli_context(namespace)
    except Exception as exc:  # any set-up failure (kubeconfig, API, settings): exit 2
        print(f"ipam-bridge audit: {_cli_error(exc)}", file=err)
        return EXIT_ERROR
    findings: list[Finding] = []
    pools: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    try:
        for kind in capi.POOL_KINDS:
            try:
                bodies = ctx.kube.list_pools(kind, ctx.settings.namespaces)
            except ApiException as exc:
                print(f"ipam-bridge audit: cannot list {kind}: {_cli_error(exc)}", file=err)
                return EXIT_ERROR
            for body in bodies:
                body.setdefault("kind", kind)
                meta = body.get("metadata") or {}
                name = "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)
                try:
                    pool = parse_pool(body)
                    if pool.deleting:
                        continue
                    seen = survey(ctx, pool)
                except (PoolError, BackendError, ApiException) as exc:
                    message = _cli_error(exc)
                    errors.append({"pool": name, "kind": kind, "error": message})
                    print(f"ipam-bridge audit: {kind} {name}: {message}", file=err)
                    continue
                findings.extend(seen.findings)
                pools.append(
                    {
                        "pool": pool_label(pool),
                        "kind": pool.kind,
                        "entries": seen.entries,
                        "ipAddresses": seen.addresses,
                        "findings": len(seen.findings),
                    }
                )
    finally:
        ctx.close()
    code = EXIT_ERROR if errors else EXIT_DRIFT if findings else EXIT_IN_SYNC
    if output == "json":
        document = {
            "inSync": code == EXIT_IN_SYNC,
            "pools": pools,
            "findings": [f.as_dict() for f in findings],
            "errors": errors,
        }
        print(json.dumps(document, indent=2), file=out)
        return code
    if findings:
        print(format_table(findings), file=out)
        n = counts(findings)
        print(
            f"\n{len(findings)} finding(s) in {len({(f.kind, f.pool) for f in findings})} of "
            f"{len(pools)} pool(s): {n[FindingKind.MISSING]} missing, "
            f"{n[FindingKind.CONFLICT]} conflict, {n[FindingKind.ORPHAN]} orphan",
            file=out,
        )
        for finding in findings:
            print(f"- {finding.finding}: {finding.message}", file=out)
    elif not errors:
        print(
            f"in sync: {len(pools)} pool(s) audited, "
            f"{sum(p['ipAddresses'] for p in pools)} IPAddresses, "
            f"{sum(p['entries'] for p in pools)} IPAM entries",
            file=out,
        )
    if errors:
        print(f"incomplete: {len(errors)} pool(s) could not be audited", file=err)
    return code


def _cli_context(namespace: str | None) -> Context:
    """Connect with the current kubeconfig and return a context for `survey` (no queue)."""
    settings = Settings().model_copy(update={"namespace": namespace or ""})
    kube = Kube(api_client(timeout=settings.kube_timeout))
    try:
        version = kube.preferred_version(capi.GROUP, "ipaddresses", capi.SUPPORTED_VERSIONS)
    except BaseException:
        kube.close()
        raise
    return Context(
        settings=settings,
        kube=kube,
        address_version=version,
        flow=settings.flow_control(),
    )


def _cli_error(exc: BaseException) -> str:
    """Return one line for a person about a failure of ``ipam-bridge audit``."""
    if isinstance(exc, ApiException):
        denied = access_denied(exc)
        if denied is not None:
            return f"the API server refused: {denied}"
        return f"API error {exc.status}: {api_status_message(exc)}"
    if isinstance(exc, BackendError | PoolError):
        return exc.message
    return str(exc) or type(exc).__name__
