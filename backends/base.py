"""The one interface every IPAM backend implements, and the values it returns.

Semantics (docs/architecture.md): a backend serves one pool, that is an ordered list of
subnets of one IPAM (1-32; the single-subnet form is a list of one). The key of a claim in
the IPAM is its hostname; every operation is limited to the pool's subnets; every write is
safe to repeat.

Quarantine (``addressReuseGracePeriodSeconds``, README "Address reuse grace period"): a released
entry may stay in the IPAM, marked as quarantined until a time. The mark lives in the IPAM
itself, so it survives restarts, moves and leader changes:

- phpIPAM: the hostname becomes ``quarantined.<hostname>`` and the description
  ``ipam-bridge quarantined until <RFC 3339 UTC>: <former description>``;
- Infoblox: the record's ``comment`` becomes ``ipam-bridge quarantined until <RFC 3339 UTC>:
  <former comment>`` and its name ``quarantined.<hostname>`` (host records: the DNS name
  under the zone when the pool has one).

A quarantined entry is never found by `IPAMBackend.find` nor deleted by
`IPAMBackend.release`; first-free skips it because it is registered; usage counts it as used.
`QUARANTINE_PREFIX`, `quarantine_mark` and `quarantined_until` are the one definition of the
mark both clients use.

Ownership (one IPAM serves many management clusters): every entry ipam-bridge makes names its
`EntryOwner`, the management cluster's identity and the claim's ``<namespace>/<name>``, in the
fields a person sees in the IPAM's UI (phpIPAM: ``note``, ``owner`` and ``description``;
Infoblox: ``comment`` and optionally an extensible attribute). `owner_text` and `parse_owner` are
the one text form; `may_adopt` is the one rule for what a claim may take over or release.
The quarantine mark keeps the owner readable: it precedes the former text, which
`parse_owner` still reads.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = [
    "OWNER_PREFIX",
    "QUARANTINE_PREFIX",
    "Allocation",
    "EntryOwner",
    "IPAMBackend",
    "SubnetInfo",
    "SubnetRef",
    "may_adopt",
    "owner_text",
    "parse_owner",
    "quarantine_mark",
    "quarantined_until",
]


QUARANTINE_PREFIX = "quarantined."
"""Prefix of the hostname of a quarantined entry (the claim's hostname follows it)."""

_MARK = "ipam-bridge quarantined until "


def quarantine_mark(until: float, former: str = "") -> str:
    """Return the description (phpIPAM) or comment (WAPI) of an entry quarantined until ``until``.

    ``until`` is a Unix time in seconds; it is written as RFC 3339 UTC with second precision
    (``ipam-bridge quarantined until 2026-11-24T05:00:00Z: ipam-bridge ns/claim``).
    """
    stamp = datetime.fromtimestamp(int(until), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{_MARK}{stamp}: {former}" if former else f"{_MARK}{stamp}"


def quarantined_until(text: str | None) -> float | None:
    """Return the Unix time (seconds) a `quarantine_mark` text names, or None.

    None when ``text`` carries no mark, or a malformed one (such an entry is treated as not
    quarantined).
    """
    if not text or not text.startswith(_MARK):
        return None
    stamp = text[len(_MARK) : len(_MARK) + 20]
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


#: First word of every owner text ipam-bridge writes (`owner_text`, previous-release descriptions).
OWNER_PREFIX = "ipam-bridge"

# A claim key: a namespace (DNS label) and a claim name (DNS subdomain).
_CLAIM = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?/[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?"
# owner_text: "ipam-bridge <cluster id> <ns>/<name>"; previous release:
# "ipam-bridge <ns>/<name>[ cluster <capi-cluster>]"; phpIPAM note:
# "ipam-bridge cluster=<cluster id> claim=<ns>/<name>".
_OWNER_RE = re.compile(rf"^{OWNER_PREFIX} (?P<cluster>[^\s/=]+) (?P<claim>{_CLAIM})(?=\s|$)")
_LEGACY_RE = re.compile(rf"^{OWNER_PREFIX} (?P<claim>{_CLAIM})(?=\s|$)")
_NOTE_RE = re.compile(
    rf"^{OWNER_PREFIX} cluster=(?P<cluster>[^\s/]*) claim=(?P<claim>{_CLAIM})(?=\s|$)"
)


@dataclass(frozen=True)
class EntryOwner:
    """Who made an IPAM entry: a management cluster and one of its claims.

    Attributes
    ----------
    cluster_id:
        The management cluster's identity (setting ``IPAM_BRIDGE_CLUSTER_ID``, by default the
        uid of namespace ``kube-system``); ``""`` for an entry of the previous release, which
        carries no cluster identity.
    claim:
        ``<namespace>/<name>`` of the IPAddressClaim.
    """

    cluster_id: str
    claim: str

    def __str__(self) -> str:
        """``<claim> of cluster <cluster_id>`` (``<claim> (previous release)`` without one)."""
        if not self.cluster_id:
            return f"{self.claim} (an entry of the previous release, no cluster identity)"
        return f"{self.claim} of management cluster {self.cluster_id}"


def owner_text(owner: EntryOwner) -> str:
    """Return the text naming ``owner``: ``"ipam-bridge <cluster_id> <namespace>/<name>"``.

    Stored as phpIPAM's ``owner`` field and WAPI's ``comment``. Without a cluster id the text is
    the previous release's form ``"ipam-bridge <namespace>/<name>"`` (so `parse_owner` reads the
    same owner back).
    """
    if not owner.cluster_id:
        return f"{OWNER_PREFIX} {owner.claim}"
    return f"{OWNER_PREFIX} {owner.cluster_id} {owner.claim}"


def parse_owner(text: str | None) -> EntryOwner | None:
    """Return the `EntryOwner` a stored text names, or None when it names none.

    Reads, after an optional `quarantine_mark` prefix (whose former text follows it):

    - `owner_text`: ``ipam-bridge <cluster_id> <namespace>/<name>``;
    - phpIPAM's note: ``ipam-bridge cluster=<cluster_id> claim=<namespace>/<name>``;
    - the previous release's description ``ipam-bridge <namespace>/<name>[ cluster
      <capi-cluster>]``, as ``EntryOwner("", "<namespace>/<name>")``.

    Anything else (a person's text, another tool's, a reservation of ipam-bridge's own such as
    ``ipam-bridge: the subnet's gateway, never assign``) gives None.
    """
    if not text:
        return None
    text = text.strip()
    if text.startswith(_MARK):
        _, _, text = text.partition(": ")
        text = text.strip()
    for pattern in (_NOTE_RE, _LEGACY_RE, _OWNER_RE):
        found = pattern.match(text)
        if found is not None:
            cluster = found.groupdict().get("cluster") or ""
            return EntryOwner(cluster_id=cluster, claim=found["claim"])
    return None


@dataclass(frozen=True)
class SubnetRef:
    """One subnet of a pool, as the pool names it (an entry of ``spec.subnets``).

    Attributes
    ----------
    cidr:
        The subnet in CIDR notation (phpIPAM: resolved with ``subnets/cidr/``; WAPI: the
        ``network``/``ipv6network``), or None when `subnet_id` names it.
    subnet_id:
        The phpIPAM subnet id, or None (always None for Infoblox).
    gateway:
        Gateway override for this subnet (the pool's own override already folded in by the
        caller), or None to use what the IPAM records.
    prefix:
        Prefix length override for this subnet (folded like `gateway`), or None.
    """

    cidr: str | None = None
    subnet_id: int | None = None
    gateway: str | None = None
    prefix: int | None = None


@dataclass(frozen=True)
class SubnetInfo:
    """Facts about one subnet of the pool as the IPAM reports them.

    Attributes
    ----------
    cidr:
        The subnet in CIDR notation, e.g. ``"10.20.0.0/24"`` or ``"2001:db8:20::/64"``.
    prefix:
        The prefix length in bits (0-32 for IPv4, 0-128 for IPv6): the subnet entry's
        ``prefix`` override, else the pool's, else the subnet's own.
    gateway:
        The subnet's gateway: the subnet entry's override, else the pool's, else what the
        IPAM records for the subnet, or None when none is known.
    total:
        Addresses in the range the IPAM allocates from (IPv4 excludes network and broadcast
        below /31).
    used:
        Addresses registered in the IPAM, whoever registered them (quarantined entries
        included), plus a gateway in that range that nothing registers yet (it is never
        handed out either).
    free:
        ``total - used`` (never negative): what allocations can still get.
    """

    cidr: str
    prefix: int
    gateway: str | None
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class Allocation:
    """An address registered in the IPAM under a hostname.

    Attributes
    ----------
    address:
        The IP address, normalised (``"10.20.0.2"``, ``"2001:db8:20::1"``).
    prefix:
        Prefix length of the subnet the address is in (with the overrides of `SubnetInfo`).
    gateway:
        That subnet's gateway (with the overrides of `SubnetInfo`), or None.
    hostname:
        The hostname the address is registered under (the claim's key; for a quarantined
        entry the marked name, ``quarantined.<hostname>``).
    ref:
        The IPAM's own identifier of the entry (phpIPAM address id, WAPI ``_ref``).
    subnet:
        CIDR of the pool's subnet the address is in (``""`` only where unknown).
    description:
        The entry's provenance text (phpIPAM ``description``, WAPI ``comment``), as stored.
    quarantined_until:
        Unix time (seconds) the entry's quarantine ends, or None when it is not quarantined.
    owner:
        The ipam-bridge owner the entry names (see `parse_owner`), or None when it carries
        none (a network team's reservation, another tool's entry).
    """

    address: str
    prefix: int
    gateway: str | None
    hostname: str
    ref: str
    subnet: str = ""
    description: str = ""
    quarantined_until: float | None = None
    owner: EntryOwner | None = None


def may_adopt(entry: Allocation, owner: EntryOwner, address: str | None) -> bool:
    """Return True when the claim ``owner`` may take over (or release) ``entry``.

    True when the entry carries no ipam-bridge owner (a reservation: the documented way to pin
    an address), or its owner is the same claim of this cluster or of the previous release
    (``cluster_id`` ``""``), or ``address`` -- the address the claim's IPAddress already
    names (objects moved by ``clusterctl move`` or restored from a backup) -- is the entry's.
    False for an entry of another management cluster or another claim.

    Parameters
    ----------
    entry:
        The entry found under the claim's hostname.
    owner:
        This cluster and the claim.
    address:
        The address the claim's IPAddress names (normalised text), or None.
    """
    if entry.owner is None:
        return True
    if entry.owner.claim == owner.claim and entry.owner.cluster_id in ("", owner.cluster_id):
        return True
    return address is not None and _same_address(address, entry.address)


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.strip()) == ipaddress.ip_address(b.strip())
    except ValueError:
        return a.strip() == b.strip()


@runtime_checkable
class IPAMBackend(Protocol):
    """A client for one pool's subnets (an ordered list, 1-32) in one external IPAM.

    Implementations are synchronous (they run in worker threads), thread-safe, and retry
    transient failures themselves (`backends.retry`). Every method raises only
    `backends.errors.BackendError` subclasses. One HTTP session and one login serve all
    the subnets of the pool.
    """

    def describe_subnets(self) -> list[SubnetInfo]:
        """Return each subnet's CIDR, prefix, gateway and usage, in the pool's order.

        Raises
        ------
        SubnetNotFoundError
            When any subnet of the pool does not exist (the message names it).
        AuthenticationFailedError, BackendUnavailableError
        """
        ...

    def find(self, hostname: str) -> Allocation | None:
        """Return the address registered under ``hostname`` in the pool's subnets, or None.

        One search request where the IPAM can search every subnet at once (phpIPAM
        ``addresses/search_hostname/``, WAPI search by name), filtered to the pool's
        subnets. The match is exact (the IPAM may compare case-insensitively); entries in
        other subnets, quarantined entries, and entries at an address that is never handed
        out (gateway, network or broadcast address) are ignored. When several entries
        match, the oldest one wins. The Allocation's ``owner`` is the one the entry names,
        whoever it is (the caller decides with `may_adopt`).
        """
        ...

    def allocate(
        self,
        hostname: str,
        owner: EntryOwner,
        address: str | None = None,
        *,
        adopt: str | None = None,
    ) -> Allocation:
        """Register an address under ``hostname``: the requested one, or the first free.

        ``address`` if given, else the first free address of the first subnet (in the
        pool's order) that has one.

        Looks the hostname up first and returns the existing entry if there is one and
        `may_adopt` (entry, ``owner``, ``adopt``) allows it (when ``address`` is given, only
        an entry at that address counts as existing), so a repeated call never creates a
        second entry. When the found entry's stored owner differs from ``owner`` (a
        reservation, an entry of the previous release, a moved one), its owner fields are
        rewritten in the IPAM with one update request. The reservation itself is atomic on
        the IPAM side (phpIPAM ``POST addresses/first_free/`` or ``POST addresses/`` with
        ``ip``; WAPI ``func:nextavailableip`` or an explicit ``ipv4addr``/``ipv6addr``); a
        lost race is retried for first-free and reported for a requested address. Subnets
        the IPAM reports full are skipped without a further round trip where the IPAM's
        answer says so. Never returns the gateway, nor the network or broadcast address of
        an IPv4 subnet below /31.

        Parameters
        ----------
        hostname:
            The claim's key (see `bridge.reconcilers.claims.hostname_for`).
        owner:
            This management cluster and the claim, stored with the entry (see `owner_text`).
        address:
            A requested address (IPv4 or IPv6 text), or None for first free.
        adopt:
            The address the claim's IPAddress already names (moved or restored objects), or
            None: an entry at that address is adopted whoever owns it.

        Returns
        -------
        Allocation
            With ``owner`` set to ``owner``.

        Raises
        ------
        EntryOwnedError
            When the entry under ``hostname`` belongs to another cluster or claim; nothing
            was changed.
        SubnetExhaustedError
            When no subnet of the pool has a free address (first free only).
        AddressUnavailableError
            When ``address`` is held by another entry (``holder`` names its hostname where
            the IPAM tells), lies outside every subnet of the pool, or is never handed out.
        """
        ...

    def release(
        self,
        hostname: str,
        owner: EntryOwner,
        quarantine_until: float | None = None,
        *,
        address: str | None = None,
    ) -> bool:
        """Delete (or quarantine) the entries under ``hostname`` that ``owner`` may release.

        Only entries `may_adopt` (entry, ``owner``, ``address``) allows: ours, ours from the
        previous release, or an unowned entry at ``address`` (the address the claim's
        IPAddress names). Another owner's entry is left alone (logged at INFO) and does not
        count as released. When ``quarantine_until`` (Unix time, seconds) is given, the
        entries are marked quarantined until then (see the module docstring) instead of
        deleted; the owner stays readable.

        Idempotent: returns True when something was deleted or marked, False when nothing
        of this owner was registered under ``hostname`` (which is success, not an error).
        Quarantined entries are left as they are.
        """
        ...

    def purge_quarantined(self, now: float, cluster_id: str) -> list[str]:
        """Delete the quarantined entries of ``cluster_id`` whose quarantine ended.

        Ended means ``quarantined_until <= now`` (Unix time in seconds). Only entries whose
        owner's cluster is ``cluster_id`` or ``""`` (the previous release; an entry without
        an owner counts as that) are deleted: another management cluster purges its own.
        Idempotent.

        Returns the addresses deleted. Costs one list request per subnet (plus one delete
        per entry deleted).
        """
        ...

    def first_free(self) -> str | None:
        """Return the address a first-free `allocate` would take now, without taking it.

        Read-only (``ipam-bridge check-pool``): the lowest address of the first subnet, in
        the pool's order, that has one neither registered nor never handed out (gateway;
        network and broadcast of an IPv4 subnet below /31).

        Returns
        -------
        str or None
            The address as text, or None when no subnet of the pool has a free one.

        Raises
        ------
        SubnetNotFoundError
            When a subnet of the pool does not exist.
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError
        """
        ...

    def entries(self) -> list[Allocation]:
        """Return every entry registered in the pool's subnets, whoever made it.

        For the drift audit: quarantined entries (with `Allocation.quarantined_until`), entries of
        other tools and people, and reservations of ours (`RESERVED_HOSTNAMES`) included, each
        with the ``owner`` it names (None when it names none).

        One list request per subnet (phpIPAM ``GET subnets/{id}/addresses/``; WAPI the
        pool's entries in the network, paged).
        """
        ...

    def close(self) -> None:
        """Release the HTTP session (and log out where the IPAM has sessions)."""
        ...
