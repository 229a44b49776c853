"""The drift comparison: a pool's IPAddresses and claims against its IPAM entries (pure).

`compare` takes typed values (the pool, its `backends.base.Allocation` entries, the
IPAddresses as `bridge.models.IPAddress`, the claims as `bridge.capi.Claim`) and returns
`Finding` values; it reads nothing and writes nothing. The findings are described in the
package docstring (`bridge.reconcilers.audit`).
"""

from __future__ import annotations

import bisect
import enum
import ipaddress
import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import Allocation
from backends.phpipam import RESERVED_HOSTNAMES
from bridge import capi
from bridge.capi import Claim
from bridge.models import IPAddress
from bridge.reconcilers.pool_backends import LOCATION_FIELDS, Pool

__all__ = [
    "Finding",
    "FindingKind",
    "compare",
    "counts",
    "named_claims",
    "normal_address",
    "orphan_namespaces",
    "owner_counts",
    "owner_summary",
    "pool_label",
    "unqualified_host",
]

#: ``ipam-bridge <namespace>/<claim>`` at the start of an entry's description (the previous
#: release's provenance, and phpIPAM's description now); what follows the name is whitespace.
_PROVENANCE = re.compile(
    r"^ipam-bridge (?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?=\s|$)"
)

#: A claim by ``(namespace, name)``.
ClaimName = tuple[str, str]


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
        description names, which does not exist).
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


def pool_label(pool: Pool) -> str:
    """Return ``<namespace>/<name>`` of a pool (``<name>`` for a Global pool)."""
    return f"{pool.namespace}/{pool.name}" if pool.namespace else pool.name


def counts(findings: Iterable[Finding]) -> dict[FindingKind, int]:
    """Return how many findings of each kind (every kind present, 0 included)."""
    result = dict.fromkeys(FindingKind, 0)
    for finding in findings:
        result[finding.finding] += 1
    return result


def normal_address(text: Any) -> str | None:
    """Return an IP address in its compressed form (``2001:db8::5``), or None if it is none."""
    try:
        return ipaddress.ip_address(str(text).strip()).compressed
    except ValueError:
        return None


def _entry_address(entry: Allocation) -> str:
    """Return an entry's address, compressed when it is a valid one."""
    return normal_address(entry.address) or entry.address


def _zone(pool: Pool) -> str:
    if "Infoblox" not in pool.kind:
        return ""
    return str(pool.location.get("dnsZone") or "").strip(".").lower()


def unqualified_host(pool: Pool, name: str) -> str:
    """Return an IPAM entry's hostname as a claim's key compares (case, trailing dot, zone)."""
    host = name.strip().rstrip(".").lower()
    zone = _zone(pool)
    if zone and host.endswith(f".{zone}"):
        host = host[: -len(zone) - 1]
    return host


def _registered_here(pool: Pool, location_text: str | None) -> bool:
    """Return True when an IPAddress's IPAM location annotation is the pool's current one.

    No (or an unreadable) annotation counts as here. ``subnets`` may have grown at its end
    since (the only change the CRDs allow); every other location field must be equal.
    """
    if not location_text:
        return True
    try:
        location = json.loads(location_text)
    except ValueError:
        return True
    if not isinstance(location, dict):
        return True
    for key in LOCATION_FIELDS.get(pool.kind, ()):
        current, registered = pool.location.get(key), location.get(key)
        if key == "subnets" and isinstance(current, list) and isinstance(registered, list):
            if current[: len(registered)] != registered:
                return False
        elif current != registered:
            return False
    return True


def _theirs(entry: Allocation, cluster_id: str) -> bool:
    """Return True for an entry another management cluster owns (never ours to judge)."""
    owner = entry.owner
    return owner is not None and owner.cluster_id not in ("", cluster_id)


def owner_counts(entries: Iterable[Allocation], cluster_id: str) -> dict[str, int]:
    """Return how many entries each ipam-bridge owner holds, by the owner's cluster id.

    Counts the entries that name an owner (`backends.base.Allocation.owner`), quarantined ones
    included, reserved ones left out; the key is the owner's cluster id (``""``: the previous
    release, no cluster identity). ``cluster_id`` (this cluster) is always a key.
    """
    found = {cluster_id: 0}
    for entry in entries:
        if entry.owner is None or _reserved(entry):
            continue
        found[entry.owner.cluster_id] = found.get(entry.owner.cluster_id, 0) + 1
    return found


def owner_summary(owners: dict[str, int], cluster_id: str) -> str:
    """Return one phrase for a person: whose entries a pool's subnets hold.

    ``"entries by owner: 5 of this cluster, 2 of the previous release, 3 of cluster <id>"``
    (other clusters by id, sorted); ``owners`` is `owner_counts`.
    """
    parts = [f"{owners.get(cluster_id, 0)} of this cluster"]
    if owners.get("") and cluster_id:
        parts.append(f"{owners['']} of the previous release")
    parts += [
        f"{count} of cluster {other}"
        for other, count in sorted(owners.items())
        if other not in ("", cluster_id) and count
    ]
    return "entries by owner: " + ", ".join(parts)


def _provenance(pool: Pool, entry: Allocation) -> tuple[str, str, bool] | None:
    """Return ``(namespace, claim, exact)`` of the claim an entry names, or None.

    The entry's owner (`backends.base.parse_owner`: phpIPAM's note, WAPI's comment or owner
    EA) when it carries a cluster identity; else its description (the previous release's):
    the IPAM may cut a long description (phpIPAM keeps 64 characters): when nothing follows
    the claim's name, the name may be cut short. The entry's hostname (``<claim>.<namespace>``
    plus the pool's suffix) then gives the full name when it starts with the cut one;
    otherwise ``exact`` is False and the name is a prefix.
    """
    if entry.owner is not None and entry.owner.cluster_id:
        namespace, _, name = entry.owner.claim.partition("/")
        return namespace, name, True
    match = _PROVENANCE.match(entry.description or "")
    if match is None:
        return None
    namespace, name = match["ns"], match["name"]
    if match.end() < len(entry.description):
        return namespace, name, True
    host = unqualified_host(pool, entry.hostname)
    if host.startswith(name):
        marker = f".{namespace}"
        at = host.find(marker, len(name))
        while at != -1:
            end = at + len(marker)
            if end == len(host) or host[end] == ".":
                return namespace, host[:at], True
            at = host.find(marker, at + 1)
    return namespace, name, False


def _reserved(entry: Allocation) -> bool:
    """Return True for an entry kept by the backend itself (gateway, network, broadcast)."""
    return entry.hostname.strip().lower() in RESERVED_HOSTNAMES


def _ignored(entry: Allocation) -> bool:
    """Return True for an entry that is never a claim's: quarantined or reserved."""
    return entry.quarantined_until is not None or _reserved(entry)


def orphan_namespaces(pool: Pool, entries: Iterable[Allocation], cluster_id: str = "") -> set[str]:
    """Return the namespaces whose claims decide whether some entry is an orphan.

    Those named by the entries this cluster's ipam-bridge made (not quarantined, not a
    reserved entry, not another cluster's: ``cluster_id`` is this cluster's), plus the
    pool's own namespace (``""`` for a Global pool is left out).
    """
    found = {pool.namespace} if pool.namespace else set()
    for entry in entries:
        if _ignored(entry) or _theirs(entry, cluster_id):
            continue
        named = _provenance(pool, entry)
        if named is not None:
            found.add(named[0])
    return found


def named_claims(
    pool: Pool, entries: Iterable[Allocation], cluster_id: str = ""
) -> list[tuple[str, str, bool]]:
    """Return ``(namespace, claim, exact)`` of each claim the entries ipam-bridge made name.

    Entries quarantined or reserved, and entries of other management clusters (``cluster_id``
    is this cluster's), are left out. ``exact`` is False when the IPAM cut the description
    short and the name is only a prefix of the claim's (`compare` then looks for a claim
    whose name starts with it).
    """
    found = []
    for entry in entries:
        if _ignored(entry) or _theirs(entry, cluster_id):
            continue
        named = _provenance(pool, entry)
        if named is not None:
            found.append(named)
    return found


# -- the inputs, indexed ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Audited:
    """An IPAddress of the pool whose claim is live, as the comparison needs it."""

    namespace: str
    name: str
    claim: str
    address: str
    hostname: str

    @property
    def claim_key(self) -> str:
        return f"{self.namespace}/{self.claim}"


@dataclass
class _Claims:
    """The claims listed: by ``(namespace, name)``, and each namespace's names sorted."""

    by_name: dict[ClaimName, Claim] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[Claim]) -> _Claims:
        index = cls()
        for claim in claims:
            index.by_name[(claim.namespace, claim.name)] = claim
            index.names.setdefault(claim.namespace, []).append(claim.name)
        for listed in index.names.values():
            listed.sort()
        return index

    def exists(self, namespace: str, name: str, exact: bool) -> bool:
        """Return True when the claim exists (``exact`` False: a claim starts with ``name``)."""
        if exact:
            return (namespace, name) in self.by_name
        listed = self.names.get(namespace, [])
        at = bisect.bisect_left(listed, name)
        return at < len(listed) and listed[at].startswith(name)


@dataclass
class _Memo:
    """What one comparison computes once per distinct value: addresses, locations."""

    pool: Pool
    normal: dict[str, str | None] = field(default_factory=dict)
    here: dict[str | None, bool] = field(default_factory=dict)

    def address(self, text: str) -> str | None:
        """Return `normal_address` of ``text``."""
        try:
            return self.normal[text]
        except KeyError:
            found = self.normal[text] = normal_address(text)
            return found

    def entry_address(self, entry: Allocation) -> str:
        """Return `_entry_address` of ``entry``."""
        return self.address(entry.address) or entry.address

    def registered_here(self, location: str | None) -> bool:
        """Return `_registered_here` of the pool and ``location``."""
        registered = self.here.get(location)
        if registered is None:
            registered = self.here[location] = _registered_here(self.pool, location)
        return registered


@dataclass
class _Entries:
    """The pool's entries by address, and the live ones by unqualified hostname."""

    at_address: dict[str, list[Allocation]] = field(default_factory=dict)
    of_host: dict[str, list[Allocation]] = field(default_factory=dict)
    matched: set[int] = field(default_factory=set)  # id() of the entries an IPAddress owns

    @classmethod
    def of(
        cls, pool: Pool, entries: Iterable[Allocation], memo: _Memo, cluster_id: str
    ) -> _Entries:
        """Index ``entries``; another cluster's are never a claim's hostname elsewhere."""
        index = cls()
        for entry in entries:
            index.at_address.setdefault(memo.entry_address(entry), []).append(entry)
            if not _ignored(entry) and not _theirs(entry, cluster_id):
                index.of_host.setdefault(unqualified_host(pool, entry.hostname), []).append(entry)
        return index


def _audited(pool: Pool, address: IPAddress, claims: _Claims, memo: _Memo) -> _Audited | None:
    """Return an IPAddress of ``pool`` to audit, or None (another pool's, being deleted...)."""
    meta, spec = address.metadata, address.spec
    ref = spec.pool_ref
    if ref.kind != pool.kind or ref.name != pool.name:
        return None
    if ref.api_group not in ("", capi.GROUP):
        return None
    if pool.namespace and meta.namespace != pool.namespace:
        return None
    if meta.deleting:
        return None
    if not memo.registered_here(meta.annotations.get(capi.LOCATION_ANNOTATION)):
        return None
    claim_name = spec.claim_ref.name or meta.name
    claim = claims.by_name.get((meta.namespace, claim_name))
    if claim is None:
        return None  # the claim is gone: its IPAddress goes with it (owner reference)
    if claim.deleting:
        return None  # being released: the release decides
    if claim.pool_ref.kind != pool.kind or claim.pool_ref.name != pool.name:
        return None
    normal = memo.address(spec.address) if spec.address is not None else None
    if normal is None:
        return None
    hostname = meta.annotations.get(capi.HOSTNAME_ANNOTATION) or capi.hostname_for(
        claim, pool.hostname_suffix
    )
    return _Audited(meta.namespace, meta.name, claim_name, normal, hostname.strip().lower())


# -- the findings -----------------------------------------------------------------------------


def _quoted(entry: Allocation, pool: Pool) -> str:
    text = f"'{unqualified_host(pool, entry.hostname) or entry.hostname}'"
    if entry.quarantined_until is not None:
        text += " (quarantined by ipam-bridge)"
    return text


def _address_finding(
    pool: Pool, audited: _Audited, entries: _Entries, memo: _Memo
) -> Finding | None:
    """Return the finding about one audited IPAddress, or None when its entry is as expected.

    Marks the IPAddress's own entries in ``entries.matched`` (they are never orphans).
    """
    here = entries.at_address.get(audited.address, [])
    own = [
        e
        for e in here
        if e.quarantined_until is None and unqualified_host(pool, e.hostname) == audited.hostname
    ]
    entries.matched.update(id(e) for e in own)
    elsewhere = [
        e
        for e in entries.of_host.get(audited.hostname, [])
        if memo.entry_address(e) != audited.address
    ]
    if own and not elsewhere:
        return None
    common = {
        "pool": pool_label(pool),
        "kind": pool.kind,
        "claim": audited.claim_key,
        "address": audited.address,
        "ip_address": audited.name,
        "expected": audited.hostname,
    }
    if not here and not elsewhere:
        message = (
            f"IPAddress {audited.namespace}/{audited.name} of claim {audited.claim_key} has "
            f"{audited.address}, which is not registered in the IPAM (expected as "
            f"'{audited.hostname}')"
        )
        return Finding(
            hostname=audited.hostname, finding=FindingKind.MISSING, message=message, **common
        )
    others = [e for e in here if e not in own]
    holder = unqualified_host(pool, others[0].hostname) if others and not own else audited.hostname
    message = _conflict_message(pool, audited, own, others, elsewhere)
    return Finding(hostname=holder, finding=FindingKind.CONFLICT, message=message, **common)


def _conflict_message(
    pool: Pool,
    audited: _Audited,
    own: Sequence[Allocation],
    others: Sequence[Allocation],
    elsewhere: Sequence[Allocation],
) -> str:
    """Return the sentence of a conflict: who holds the address, where the hostname is."""
    parts = []
    if others and not own:
        holders = ", ".join(_quoted(e, pool) for e in others)
        parts.append(
            f"{audited.address} (IPAddress {audited.namespace}/{audited.name} of claim "
            f"{audited.claim_key}) is registered in the IPAM as {holders}, not as "
            f"'{audited.hostname}'"
        )
    if elsewhere:
        where = ", ".join(sorted({e.address for e in elsewhere}))
        parts.append(
            f"'{audited.hostname}' (claim {audited.claim_key}) is registered at {where}"
            + (" as well" if own else f" instead of {audited.address}")
        )
    return "; ".join(parts) + "; nothing was changed"


def _orphans(
    pool: Pool,
    entries: Iterable[Allocation],
    matched: Collection[int],
    claims: _Claims,
    claim_namespaces: Collection[str] | None,
    cluster_id: str,
) -> list[Finding]:
    """Return the entries this cluster's ipam-bridge made for claims that do not exist."""
    found: list[Finding] = []
    for entry in entries:
        if id(entry) in matched or _ignored(entry) or _theirs(entry, cluster_id):
            continue
        named = _provenance(pool, entry)
        if named is None:
            continue
        namespace, name, exact = named
        if claim_namespaces is not None and namespace not in claim_namespaces:
            continue
        if claims.exists(namespace, name, exact):
            continue
        host = unqualified_host(pool, entry.hostname) or entry.hostname
        found.append(
            Finding(
                pool=pool_label(pool),
                kind=pool.kind,
                claim=f"{namespace}/{name}",
                address=_entry_address(entry),
                hostname=host,
                finding=FindingKind.ORPHAN,
                message=(
                    f"entry {entry.address} '{host}' was registered by ipam-bridge for claim "
                    f"{namespace}/{name}, which no longer exists; it is left in the IPAM "
                    "(delete it there if nothing uses it)"
                ),
            )
        )
    return found


def compare(
    pool: Pool,
    entries: Sequence[Allocation],
    addresses: Iterable[IPAddress],
    claims: Iterable[Claim],
    *,
    claim_namespaces: Collection[str] | None = None,
    cluster_id: str = "",
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
        IPAddresses (`bridge.models.IPAddress`); those of other pools are ignored.
    claims:
        IPAddressClaims (`bridge.capi.Claim`) of the namespaces listed (the pool's, and
        those the entries' descriptions name: `orphan_namespaces`).
    claim_namespaces:
        The namespaces whose claims were listed; an entry naming a claim of another
        namespace is never called an orphan (it cannot be checked). None: all namespaces.
    cluster_id:
        This management cluster's identity (`bridge.cluster_id.resolve_cluster_id`): an
        entry whose owner is another cluster (`backends.base.Allocation.owner`) is never
        an orphan; its claims live in that cluster.

    Returns
    -------
    list of Finding
        Sorted by finding, claim and address. Missing findings are what a repair would
        register again; the comparison itself never decides whether the address is free
        beyond what ``entries`` shows.
    """
    claim_index = _Claims.of(claims)
    memo = _Memo(pool)
    entry_index = _Entries.of(pool, entries, memo, cluster_id)
    findings: list[Finding] = []
    for address in addresses:
        audited = _audited(pool, address, claim_index, memo)
        if audited is None:
            continue
        finding = _address_finding(pool, audited, entry_index, memo)
        if finding is not None:
            findings.append(finding)
    findings += _orphans(
        pool, entries, entry_index.matched, claim_index, claim_namespaces, cluster_id
    )
    order = {kind: i for i, kind in enumerate(FindingKind)}
    findings.sort(key=lambda f: (order[f.finding], f.claim, f.address, f.hostname))
    return findings
