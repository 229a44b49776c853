"""phpIPAM REST API client for one pool: the `IPAMBackend` behind a ``PHPIPAMIPPool``.

A pool is an ordered list of 1-32 phpIPAM subnets (`PHPIPAMConfig.subnets`); one HTTP session
and one login serve all of them.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlsplit

import requests

from backends.base import (
    OWNER_PREFIX,
    QUARANTINE_PREFIX,
    Allocation,
    EntryOwner,
    SubnetInfo,
    SubnetRef,
    may_adopt,
    owner_text,
    parse_owner,
    quarantine_mark,
    quarantined_until,
)
from backends.errors import (
    AddressUnavailableError,
    AuthenticationFailedError,
    BackendError,
    BackendUnavailableError,
    ConflictError,
    EntryOwnedError,
    InvalidRequestError,
    SubnetExhaustedError,
    SubnetNotFoundError,
)
from backends.flowcontrol import FlowControl
from backends.retry import RetryPolicy
from backends.transport import (
    Transport,
    basic_auth,
    credential_id,
    default_user_agent,
    overloaded,
    status_error,
)

__all__ = [
    "DESCRIPTION_MAX_CHARS",
    "MAX_SUBNETS",
    "OWNER_MAX_CHARS",
    "RESERVED_BROADCAST_HOSTNAME",
    "RESERVED_GATEWAY_DESCRIPTION",
    "RESERVED_GATEWAY_HOSTNAME",
    "RESERVED_HOSTNAMES",
    "RESERVED_NETWORK_DESCRIPTION",
    "RESERVED_NETWORK_HOSTNAME",
    "PHPIPAMBackend",
    "PHPIPAMConfig",
    "lowest_free",
    "owner_fields",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: phpIPAM's ``ipaddresses.description`` column is ``varchar(64)``; MariaDB strict mode
#: rejects longer values with a 500, so descriptions are cut to this many characters.
DESCRIPTION_MAX_CHARS: Final = 64

#: phpIPAM's ``ipaddresses.owner`` column is ``varchar(128)``; ``note`` is ``text``
#: (``db/SCHEMA.sql``; reference phpipam-api.md section 12).
OWNER_MAX_CHARS: Final = 128

#: How many subnets one pool may list (``spec.subnets``, as the CRD allows).
MAX_SUBNETS: Final = 32

#: Hostname given to the IPv6 subnet-router anycast address (``prefix::``) that phpIPAM hands
#: out as the first "free" address of an IPv6 subnet
#: (https://github.com/phpipam/phpipam/issues/3676); the entry is kept so that phpIPAM never
#: offers the address again.
RESERVED_NETWORK_HOSTNAME: Final = "ipam-bridge-reserved-network-address"

#: Description stored with that entry (at most `DESCRIPTION_MAX_CHARS` characters).
RESERVED_NETWORK_DESCRIPTION: Final = (
    "ipam-bridge: IPv6 subnet-router anycast address, never assign"
)

#: Hostname of the entry that keeps a gateway phpIPAM holds no entry for (the pool's ``gateway``
#: override) out of first-free: phpIPAM skips registered addresses only
#: (``Addresses::get_first_available_address``, https://github.com/phpipam/phpipam/blob/master/functions/classes/class.Addresses.php),
#: so an unregistered gateway would be handed to a node.
RESERVED_GATEWAY_HOSTNAME: Final = "ipam-bridge-reserved-gateway"

#: Description stored with the gateway entry.
RESERVED_GATEWAY_DESCRIPTION: Final = "ipam-bridge: the subnet's gateway, never assign"

#: Hostname given to an IPv4 broadcast address phpIPAM handed out (only a subnet flagged
#: "is pool" does); the IPv4 network address gets `RESERVED_NETWORK_HOSTNAME`.
RESERVED_BROADCAST_HOSTNAME: Final = "ipam-bridge-reserved-broadcast-address"

#: Every hostname under which this client keeps an address out of first-free. Entries under
#: these names are never a claim's address (`PHPIPAMBackend.find` never returns them, and a
#: release never deletes them).
RESERVED_HOSTNAMES: Final = frozenset(
    {RESERVED_NETWORK_HOSTNAME, RESERVED_GATEWAY_HOSTNAME, RESERVED_BROADCAST_HOSTNAME}
)

# "Not found" answers of lookups (search_hostname, search, DELETE by id, a subnet's address
# list): results, not errors. phpIPAM >= 1.5 sends them as 404, <= 1.4 as HTTP 200 with
# success false.
_NOT_FOUND_MESSAGES: Final = frozenset(
    {"hostname not found", "address does not exist", "no addresses found", "address not found"}
)

_MESSAGE_MAX_CHARS: Final = 200


def _normalise_gateway(value: str, where: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"{where}gateway {value!r} is not an IP address") from None


def _check_prefix(prefix: int | None, network: IPNetwork | None, where: str) -> None:
    if prefix is None:
        return
    limit = network.max_prefixlen if network is not None else 128
    if isinstance(prefix, bool) or not 0 <= prefix <= limit:
        raise ValueError(f"{where}prefix must be an integer from 0 to {limit}")


def _normalise_ref(
    ref: SubnetRef, gateway: str | None, prefix: int | None, where: str
) -> SubnetRef:
    """Validate one item of ``subnets``; fold the pool-wide ``gateway``/``prefix`` defaults in."""
    if ref.cidr is None and ref.subnet_id is None:
        raise ValueError(f"{where}set cidr or subnet_id")
    if ref.subnet_id is not None and (isinstance(ref.subnet_id, bool) or ref.subnet_id <= 0):
        raise ValueError(f"{where}subnet_id must be a positive integer")
    network: IPNetwork | None = None
    cidr = ref.cidr
    if cidr is not None:
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=True)
        except ValueError as exc:
            raise ValueError(f"{where}subnet is not a valid CIDR network: {exc}") from None
        cidr = network.with_prefixlen
    raw_gateway = ref.gateway if ref.gateway is not None else gateway
    normalised: str | None = None
    if raw_gateway is not None:
        address = _normalise_gateway(raw_gateway, where)
        if network is not None and address.version != network.version:
            raise ValueError(f"{where}gateway and subnet must be of the same address family")
        normalised = address.compressed
    effective_prefix = ref.prefix if ref.prefix is not None else prefix
    _check_prefix(effective_prefix, network, where)
    return SubnetRef(
        cidr=cidr, subnet_id=ref.subnet_id, gateway=normalised, prefix=effective_prefix
    )


@dataclass(frozen=True)
class PHPIPAMConfig:
    """Where and how to reach the subnets of one pool in phpIPAM.

    Attributes
    ----------
    endpoint:
        API base URL such as ``https://ipam.example.com/api``; requests go to
        ``<endpoint>/<app_id>/<controller>/...``. Must be http(s) without user info,
        query or fragment.
    app_id:
        The phpIPAM API app id (Administration > API).
    subnets:
        The pool's subnets in order (1 to `MAX_SUBNETS` `SubnetRef` items, each naming
        one subnet by ``subnet_id`` or by ``cidr``, with optional ``gateway`` and ``prefix``
        overrides; an item with both is the subnet of that id, which must have that CIDR,
        else `SubnetNotFoundError`). A claim gets the first free address of the first
        subnet that has one. Leave empty to use the single-subnet form (`subnet_id` or
        `subnet`). Kept as given (so `dataclasses.replace` works); `effective_subnets` is
        what the client uses.
    subnet_id:
        Single-subnet form: the phpIPAM subnet id (the same as ``subnets`` with one
        ``SubnetRef(subnet_id=...)``). At most one of `subnet_id`, `subnet` and `subnets`.
    subnet:
        Single-subnet form: the subnet in CIDR notation (``10.20.0.0/24``), resolved once
        with ``GET subnets/cidr/{net}/{mask}/``; host bits must be zero.
    section_id:
        Optional section id that narrows every CIDR lookup when several sections (or VRFs)
        hold the same CIDR.
    gateway:
        The pool's gateway override (an IP address), the default of every subnet item
        without its own; None to use the gateway phpIPAM reports for each subnet (its
        ``is_gateway`` address). Reported in every `Allocation` and `SubnetInfo`, and never
        handed out: when it lies in the subnet and phpIPAM holds no entry for it, it is
        registered once under `RESERVED_GATEWAY_HOSTNAME` before the first allocation
        there. Normalised (``"2001:DB8::1"`` -> ``"2001:db8::1"``).
    prefix:
        The pool's prefix length override (bits), the default of every subnet item without
        its own; None to report each subnet's own prefix.
    username, password:
        phpIPAM user for the user token login (``POST /user/`` with HTTP Basic).
        Either both of these or `app_code` are set.
    app_code:
        The app code token of an app with security "SSL with App code token"; sent as
        the ``token`` header, no login.
    verify:
        TLS verification: True (default), False (off: ``insecureSkipVerify``).
    ca_pem:
        CA bundle (PEM text) to verify the server with instead of the system CAs.
    timeout_seconds:
        Connect and read timeout of each HTTP request, in seconds (cut to the time left of
        the operation, see `backends.transport`).
    retry:
        The retry policy every operation runs under; its ``total_seconds`` bounds each
        operation, requests in flight included.
    skip_ipv6_network_address:
        When phpIPAM hands out an IPv6 subnet's network address (``prefix::``), keep the
        entry under `RESERVED_NETWORK_HOSTNAME` and take the next address.
    user_agent:
        The ``User-Agent`` header.

    Raises
    ------
    ValueError
        From the constructor when the combination of fields is invalid (see above): no
        subnet or both forms, more than `MAX_SUBNETS` items, an item naming no subnet,
        the same subnet twice, a malformed CIDR or gateway, a gateway of the other address
        family, a prefix out of range.

    Notes
    -----
    ``password`` and ``app_code`` are left out of ``repr()``, so logging a config never
    shows them.

    """

    endpoint: str
    app_id: str
    subnet_id: int | None = None
    subnet: str | None = None
    section_id: int | None = None
    gateway: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    app_code: str | None = field(default=None, repr=False)
    verify: bool = True
    ca_pem: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    skip_ipv6_network_address: bool = True
    user_agent: str = field(default_factory=default_user_agent)
    subnets: tuple[SubnetRef, ...] = ()
    prefix: int | None = None

    def __post_init__(self) -> None:
        url = urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("endpoint must be an http:// or https:// URL")
        if url.username is not None or url.password is not None:
            raise ValueError("endpoint must not carry credentials; use username/password")
        if url.query or url.fragment:
            raise ValueError("endpoint must not have a query or fragment")
        if not self.app_id or "/" in self.app_id:
            raise ValueError("app_id must be a non-empty name without '/'")
        if self.gateway is not None:
            gateway = _normalise_gateway(self.gateway, "").compressed
            object.__setattr__(self, "gateway", gateway)
        self.effective_subnets  # noqa: B018 (validates the subnet items)
        user_login = bool(self.username) and bool(self.password)
        if user_login == bool(self.app_code) or (
            not user_login and (self.username or self.password)
        ):
            raise ValueError("set either username and password, or app_code (not both)")
        if self.timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")

    @property
    def effective_subnets(self) -> tuple[SubnetRef, ...]:
        """The pool's subnet items as the client uses them, in order (1 to `MAX_SUBNETS`).

        `subnets`, or the single-subnet form as one item; CIDRs and gateways normalised,
        the pool-wide `gateway` and `prefix` folded into items without their own.
        Computed from the fields on each call (cheap: at most `MAX_SUBNETS` items), so
        the config holds no state besides its fields.

        Raises
        ------
        ValueError
            As the constructor (which calls it), for invalid subnet items.
        """
        single = self.subnet_id is not None or self.subnet is not None
        items = tuple(self.subnets)
        if single and items:
            raise ValueError("set either subnets or subnet_id/subnet, not both")
        if single:
            if self.subnet_id is not None and self.subnet is not None:
                raise ValueError("set exactly one of subnet_id and subnet")
            items = (SubnetRef(cidr=self.subnet, subnet_id=self.subnet_id),)
        if not items:
            raise ValueError("set exactly one of subnet_id and subnet (or subnets)")
        if len(items) > MAX_SUBNETS:
            raise ValueError(f"a pool lists at most {MAX_SUBNETS} subnets, not {len(items)}")
        _check_prefix(self.prefix, None, "")
        # Errors of the single-subnet form name its fields, not subnets[0].
        refs = tuple(
            _normalise_ref(ref, self.gateway, self.prefix, "" if single else f"subnets[{n}]: ")
            for n, ref in enumerate(items)
        )
        seen: set[object] = set()
        for n, ref in enumerate(refs):
            key: object = ref.subnet_id if ref.subnet_id is not None else ref.cidr
            if key in seen:
                raise ValueError(f"subnets[{n}] names a subnet listed before it ({key})")
            seen.add(key)
        return refs

    @property
    def base_url(self) -> str:
        """``<endpoint>/<app_id>``, the prefix of every request URL."""
        return f"{self.endpoint.rstrip('/')}/{quote(self.app_id, safe='')}"


@dataclass(frozen=True)
class _Reply:
    """One HTTP answer: status, the API envelope (None when the body is not one)."""

    status: int
    envelope: dict[str, Any] | None
    content_type: str


@dataclass(frozen=True)
class _SubnetFacts:
    """One subnet of the pool: its ``subnets`` item, phpIPAM id and network, phpIPAM's gateway."""

    ref: SubnetRef
    id: int
    network: IPNetwork
    #: The gateway phpIPAM reports (``gateway.ip_addr``) and the id of its entry.
    gateway: str | None
    gateway_id: int | None = None

    @property
    def cidr(self) -> str:
        """The subnet in CIDR notation, as phpIPAM records it."""
        return self.network.with_prefixlen

    @property
    def prefix(self) -> int:
        """The prefix reported to callers: the subnet item's override, else the subnet's."""
        return self.ref.prefix if self.ref.prefix is not None else self.network.prefixlen

    @property
    def effective_gateway(self) -> str | None:
        """The gateway reported to callers: the subnet item's override, else phpIPAM's."""
        return self.ref.gateway or self.gateway


@dataclass(frozen=True)
class _Reservation:
    """Hostname and description of an entry that keeps an address out of first-free."""

    hostname: str
    description: str
    what: str


_NETWORK_V6: Final = _Reservation(
    RESERVED_NETWORK_HOSTNAME, RESERVED_NETWORK_DESCRIPTION, "IPv6 subnet-router anycast address"
)
_NETWORK_V4: Final = _Reservation(
    RESERVED_NETWORK_HOSTNAME,
    "ipam-bridge: the subnet's network address, never assign",
    "network address",
)
_BROADCAST: Final = _Reservation(
    RESERVED_BROADCAST_HOSTNAME,
    "ipam-bridge: the subnet's broadcast address, never assign",
    "broadcast address",
)
_GATEWAY: Final = _Reservation(RESERVED_GATEWAY_HOSTNAME, RESERVED_GATEWAY_DESCRIPTION, "gateway")


@dataclass(frozen=True)
class _Entry:
    """An address entry of a phpIPAM answer that lies in one of the pool's subnets."""

    id: int
    subnet_id: int
    raw_ip: str
    hostname: str
    description: str
    #: The owner the entry names: its ``note``, else its ``owner`` field, else its description.
    owner: EntryOwner | None = None


@dataclass(frozen=True)
class _Claim:
    """What `PHPIPAMBackend.allocate` registers: the hostname, its owner, the address to adopt."""

    hostname: str
    owner: EntryOwner
    adopt: str | None = None


class _InvalidAddressError(InvalidRequestError):
    """phpIPAM's 500 ``<ip> is not a valid address for subnet <cidr>`` (``POST addresses/``)."""


class PHPIPAMBackend:
    """`backends.base.IPAMBackend` for the subnets of one pool in phpIPAM, on a `requests.Session`.

    Thread-safe: the token is shared by every thread and (re)obtained under a lock, and the
    session keeps no cookies. Every public method is one operation of the shared
    `backends.transport.Transport`: bounded by ``config.retry.total_seconds``, in a slot of
    the endpoint, under ``config.retry`` (transient errors and lost allocation races are
    retried there, everything else is raised at once). Logins go through the endpoint's
    login budget, shared with every other client of the same
    `backends.flowcontrol.FlowControl`. One login serves every subnet of the pool.

    Parameters
    ----------
    config:
        Where and how to reach the subnets.
    session:
        An HTTP session to use instead of a new one (it is then not closed by `close`).
    endpoints:
        The operator's `backends.flowcontrol.FlowControl` (breaker, limit, login budget per
        endpoint); None gives this client one of its own.

    Notes
    -----
    Behaviour relied on (phpIPAM 1.4 to 1.8.2 API controllers ``User``, ``Subnets``,
    ``Addresses``: https://phpipam.net/api/api_documentation/ and the controllers' source,
    https://github.com/phpipam/phpipam/tree/master/api/controllers):

    * answers are the envelope ``{"code", "success", "message"?, "id"?, "data"?}``; values
      are strings or JSON numbers depending on version and settings;
    * ``POST user/`` with HTTP Basic returns the user's token (one per user, sliding 6 h
      expiry); an unknown or expired token gives 401 ``Unauthorized`` on other controllers;
    * ``POST addresses/first_free/{subnetId}/`` reserves the lowest free address atomically
      except for a race that surfaces as 409 or a 500 ``Duplicate entry``; a full subnet
      answers 404 ``No free addresses found``;
    * ``POST addresses/`` with ``subnetId`` and ``ip`` creates that address: 201 with the
      new id, 409 ``IP address already exists`` when the subnet holds it (under a
      lost race also the 500 ``Duplicate entry``), 500 ``<ip> is not a valid address for
      subnet <cidr>`` outside the subnet or at its IPv4 network/broadcast address;
    * ``PATCH addresses/{id}/`` changes ``hostname``, ``description``, ``owner`` and ``note``
      (200 ``Address updated``, no ``data``; PUT behaves the same; ``ip`` cannot change);
    * ``owner`` (``varchar(128)``) and ``note`` (``text``) are taken on create and returned on
      every read, ``search_hostname`` included (phpipam-api.md section 12);
    * ``addresses/search_hostname/{h}/`` matches exactly (case-insensitively) across every
      subnet; 2nd and later entries may carry ``ip`` as a decimal integer;
      ``addresses/search/{ip}/`` lists the entries of an address in every subnet;
    * ``GET subnets/{id}/addresses/`` lists every entry of a subnet; an empty subnet answers
      404 ``No addresses found``;
    * ``DELETE addresses/{ip}/{subnetId}/`` is broken (PHP fatal error when the address is
      gone), so addresses are deleted by id only;
    * first-free skips every address that has an entry, and for IPv4 below /31 (subnets not
      flagged "is pool") the network and broadcast addresses; nothing else. The
      gateway is skipped only because phpIPAM's gateway is itself an entry (``is_gateway``).

    Never handed out to a claim: the gateway (the subnet item's override and phpIPAM's), the IPv4
    network and broadcast addresses below /31, and (with ``skip_ipv6_network_address``) the
    IPv6 subnet-router anycast address. A gateway without an entry is registered once under
    `RESERVED_GATEWAY_HOSTNAME` (``POST addresses/``; a 409 means someone registered it
    already); should first-free still hand out one of these addresses, the entry it created is
    renamed to the matching reserved hostname instead of being given to the claim. Entries this
    client did not create are never changed or deleted, except entries under the claim's
    hostname that `backends.base.may_adopt` gives the claim (a reservation: its owner fields are
    rewritten on adoption).

    Ownership (`backends.base.EntryOwner`): every entry this client makes carries
    `owner_fields` (``note``, the full truth, read first; ``owner``; ``description``). An entry
    under a claim's hostname is adopted, released or purged only as `backends.base.may_adopt`
    allows; adopting one whose owner differs rewrites those fields with one ``PATCH
    addresses/{id}/``; another owner's entry raises `backends.errors.EntryOwnedError`.

    Quarantine (`backends.base`): a released entry may be kept with the hostname
    ``quarantined.<hostname>`` and the description `backends.base.quarantine_mark` (cut to
    `DESCRIPTION_MAX_CHARS`); `purge_quarantined` deletes it once the time has passed.

    """

    def __init__(
        self,
        config: PHPIPAMConfig,
        *,
        session: requests.Session | None = None,
        endpoints: FlowControl | None = None,
    ) -> None:
        self._config = config
        self._base_url = config.base_url
        # phpIPAM sets a PHP session cookie on every answer; the API does not use it, and a
        # cookie-free session has no shared mutable state between threads.
        self._transport = Transport.of(
            config,
            label="phpIPAM",
            endpoints=endpoints,
            session=session,
            keep_cookies=False,
            overloaded=self._overloaded,
        )
        self._auth_lock = threading.Lock()
        self._token: str | None = config.app_code
        self._refs: tuple[SubnetRef, ...] = config.effective_subnets
        self._subnet_lock = threading.Lock()
        self._subnet_ids: list[int | None] = [ref.subnet_id for ref in self._refs]
        self._facts: list[_SubnetFacts | None] = [None] * len(self._refs)
        # Gateways known to have an entry in their subnet (registered here or found registered).
        self._gateway_lock = threading.Lock()
        self._gateway_entries: set[tuple[int, str]] = set()

    @property
    def config(self) -> PHPIPAMConfig:
        """The configuration this client was built from (its repr hides the secrets)."""
        return self._config

    def __repr__(self) -> str:
        targets = [ref.subnet_id or ref.cidr for ref in self._refs]
        shown = targets[0] if len(targets) == 1 else targets
        return f"PHPIPAMBackend(endpoint={self._config.endpoint!r}, subnet={shown!r})"

    def __enter__(self) -> PHPIPAMBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- public API

    def describe_subnets(self) -> list[SubnetInfo]:
        """Return each subnet's CIDR, prefix, gateway and usage, in the pool's order.

        Per subnet: ``GET subnets/{id}/`` (CIDR from ``subnet`` + ``mask``, gateway from
        ``gateway.ip_addr`` when phpIPAM has a gateway address) and
        ``GET subnets/{id}/usage/`` (total = ``maxhosts``, used = ``used``, free =
        ``freehosts``; every entry counts as used, quarantined ones included). Also refreshes
        the facts (prefix, gateway) that `find` and `allocate` report.

        A gateway override that lies in the subnet counts as used even before it is
        registered (it is never handed out), so the figures do not move when the first
        allocation registers it; until its entry is known, ``GET addresses/search/{ip}/``
        tells whether it has one.

        Returns
        -------
        list[SubnetInfo]
            One per subnet item. ``prefix`` and ``gateway`` are the item's overrides when
            set, else phpIPAM's. Counts are Python ints and may exceed 2**63 for IPv6.

        Raises
        ------
        SubnetNotFoundError
            A subnet id or CIDR does not exist (or a CIDR matches several subnets); the
            message names it.
        AuthenticationFailedError, InvalidRequestError, BackendUnavailableError
            See `backends.errors`.

        """
        return self._retry(
            "describe_subnets",
            lambda: [self._describe_once(n) for n in range(len(self._refs))],
        )

    def find(self, hostname: str) -> Allocation | None:
        """Return the address registered under ``hostname`` in the pool's subnets, or None.

        One ``GET addresses/search_hostname/{hostname}/`` (phpIPAM searches every subnet),
        keeping only entries of the pool's subnets whose hostname equals ``hostname``
        (case-insensitively, like phpIPAM); the oldest (lowest id) entry wins. Quarantined
        entries (a `backends.base.quarantine_mark` description) and entries at an address that is
        never handed out (the gateway, the network or broadcast address; see the class
        notes) are not a claim's address and are ignored.

        Raises
        ------
        SubnetNotFoundError, AuthenticationFailedError, InvalidRequestError,
        BackendUnavailableError
            See `backends.errors`.

        """

        def attempt() -> Allocation | None:
            facts = self._facts_by_id()
            for entry in self._search(hostname, facts):
                subnet = facts[entry.subnet_id]
                address = _entry_address(entry, subnet.network)
                if address not in self._never_assigned(subnet):
                    return self._allocation(entry, address, subnet, hostname)
            return None

        return self._retry("find", attempt)

    def allocate(
        self,
        hostname: str,
        owner: EntryOwner,
        address: str | None = None,
        *,
        adopt: str | None = None,
    ) -> Allocation:
        """Return the address of ``hostname``, registering one if needed.

        Ownership: an entry found under ``hostname`` is adopted only when
        `backends.base.may_adopt` (entry, ``owner``, ``adopt``) allows it; of several, the oldest
        adoptable one. When its stored owner is not ``owner`` (a reservation, an entry of the
        previous release, a moved one), one ``PATCH addresses/{id}/`` with `owner_fields`
        (``{"description", "owner", "note"}``; phpIPAM answers 200 ``Address updated``)
        rewrites it. An entry of another owner raises `EntryOwnedError` and is left as it is.

        First free (``address`` None): searches first (an adoptable entry in any of the
        pool's subnets is returned, so a repeat never creates a second entry), then, subnet
        by subnet in the pool's order, ``POST addresses/first_free/{subnetId}/`` with JSON
        ``{"hostname", "description", "owner", "note"}``; a subnet answering 404 ``No free
        addresses found`` is skipped (that answer is the only round trip it costs). A lost
        race (409 ``IP address already exists``, 500 ``Duplicate entry``) raises
        `ConflictError` inside the retry policy, which searches again before the next POST.

        Requested address: the subnet of the pool that contains it is chosen; unless
        ``hostname`` already holds that very address (returned as it is) or another one of
        the pool (`AddressUnavailableError`: one address per claim), ``POST
        addresses/`` with ``{"subnetId", "ip", "hostname", "description", "owner", "note"}``.
        When phpIPAM answers that the address exists (409, or the 500 ``Duplicate entry`` of a
        race with a first-free), ``GET addresses/search/{ip}/`` tells who holds it: the claim's
        own hostname (a repeat whose answer was lost) is returned when adoptable, anyone else
        is `AddressUnavailableError` naming the holder.

        Before the first POST into a subnet, a gateway without an entry (the subnet item's override)
        is registered under `RESERVED_GATEWAY_HOSTNAME` with ``POST addresses/``
        ``{"subnetId", "ip", "hostname", "description"}`` (once per client and subnet; 409
        ``IP address already exists`` means it is registered already). When first-free
        still hands out an address that is never assigned (the gateway, the IPv4 network or
        broadcast address of an "is pool" subnet, or with
        `PHPIPAMConfig.skip_ipv6_network_address` the IPv6 network address), the new entry
        is renamed to the matching reserved hostname (``PATCH addresses/{id}/``) and the
        POST repeated; entries of ``hostname`` at such an address (left by an interrupted
        attempt) are renamed the same way, never adopted.

        Parameters
        ----------
        hostname:
            The claim's key.
        owner:
            This management cluster and the claim (`owner_fields`).
        address:
            The requested address (IPv4 or IPv6 text), or None for first free.
        adopt:
            The address the claim's IPAddress already names, or None (see
            `backends.base.may_adopt`).

        Returns
        -------
        Allocation
            ``ref`` is the phpIPAM address id as a string; ``prefix`` and ``gateway`` are
            those of the subnet the address is in; ``owner`` is ``owner``.

        Raises
        ------
        EntryOwnedError
            The entry under ``hostname`` names another cluster or claim.
        SubnetExhaustedError
            Every subnet of the pool answered ``No free addresses found`` (first free).
        AddressUnavailableError
            The requested address is held by another entry (``holder`` is its hostname), lies
            outside every subnet of the pool, is never handed out (gateway, network,
            broadcast address), or is not an IP address. Nothing was registered.
        ConflictError
            The race was lost on every attempt of the retry policy.
        SubnetNotFoundError, AuthenticationFailedError, InvalidRequestError,
        BackendUnavailableError
            See `backends.errors`.

        """
        claim = _Claim(hostname, owner, adopt)
        if address is None:
            return self._retry("allocate", lambda: self._allocate_first_free(claim))
        return self._retry("allocate", lambda: self._allocate_address(claim, address))

    def release(
        self,
        hostname: str,
        owner: EntryOwner,
        quarantine_until: float | None = None,
        *,
        address: str | None = None,
    ) -> bool:
        """Delete (or quarantine) the entries under ``hostname`` that ``owner`` may release.

        One search (``GET addresses/search_hostname/{hostname}/``), then for each entry of the
        pool's subnets that `backends.base.may_adopt` (entry, ``owner``, ``address``) allows
        (another owner's entry is left alone, logged at INFO) either ``DELETE
        addresses/{id}/`` (never ``addresses/{ip}/{subnetId}/``, which phpIPAM answers with
        a PHP fatal error when the address is already gone; 404 ``Address does not exist``
        counts as done), or, with ``quarantine_until``, ``PATCH addresses/{id}/``
        with ``{"hostname": "quarantined.<hostname>", "description": quarantine_mark(until,
        former)}`` (cut to `DESCRIPTION_MAX_CHARS` and stripped of trailing blanks, so little
        of the former description survives; ``owner`` and ``note`` are kept, so the owner
        stays readable; the entry and its address stay registered). Entries already
        quarantined are left as they are.

        Parameters
        ----------
        hostname:
            The claim's key.
        owner:
            This management cluster and the claim.
        address:
            The address the claim's IPAddress names, or None.
        quarantine_until:
            Unix time (seconds) until which the address stays out of use, or None to delete.

        Returns
        -------
        bool
            True when this call deleted or marked at least one entry, False when there was
            none that ``owner`` may release.

        Raises
        ------
        SubnetNotFoundError
            Only when the pool names a subnet by CIDR and that CIDR no longer resolves.
        AuthenticationFailedError, InvalidRequestError, BackendUnavailableError
            See `backends.errors`.

        """
        done: list[int] = []  # survives retries: an entry handled by attempt 1 counts

        def attempt() -> bool:
            for entry in self._search(hostname, self._resolve_ids()):
                if not self._releasable(entry, owner, address):
                    continue
                if quarantine_until is None:
                    if self._lookup("DELETE", f"addresses/{entry.id}/") is not None:
                        done.append(entry.id)
                        log.debug("phpIPAM: deleted address id %d of %s", entry.id, hostname)
                    continue
                mark = quarantine_mark(quarantine_until, entry.description)
                body = {
                    "hostname": f"{QUARANTINE_PREFIX}{hostname}",
                    "description": mark[:DESCRIPTION_MAX_CHARS].rstrip(),
                }
                if self._lookup("PATCH", f"addresses/{entry.id}/", json=body) is not None:
                    done.append(entry.id)
                    log.debug(
                        "phpIPAM: quarantined address id %d of %s: %s", entry.id, hostname, mark
                    )
            return bool(done)

        return self._retry("release", attempt)

    def purge_quarantined(self, now: float, cluster_id: str) -> list[str]:
        """Delete the quarantined entries of ``cluster_id`` whose quarantine ended.

        Per subnet ``GET subnets/{id}/addresses/`` (404 ``No addresses found`` is an empty
        subnet), then ``DELETE addresses/{id}/`` for each entry whose hostname starts with
        ``quarantined.``, whose description carries a `backends.base.quarantine_mark`
        at or before ``now`` and whose owner's cluster is ``cluster_id`` or ``""`` (the
        previous release; a mark without a readable owner counts as that). Idempotent.

        Parameters
        ----------
        now:
            The current Unix time in seconds.
        cluster_id:
            This management cluster's identity.

        Returns
        -------
        list[str]
            The addresses this call deleted.

        Raises
        ------
        SubnetNotFoundError, AuthenticationFailedError, InvalidRequestError,
        BackendUnavailableError
            See `backends.errors`.

        """
        deleted: list[str] = []  # survives retries

        def attempt() -> list[str]:
            for subnet in self._all_facts():
                for entry in self._list_entries(subnet):
                    until = _quarantine_end(entry)
                    if until is None or until > now:
                        continue
                    if entry.owner is not None and entry.owner.cluster_id not in ("", cluster_id):
                        continue
                    if self._lookup("DELETE", f"addresses/{entry.id}/") is not None:
                        address = _entry_address(entry, subnet.network)
                        deleted.append(address)
                        log.info(
                            "phpIPAM: deleted %s (id %d): its quarantine ended",
                            address,
                            entry.id,
                        )
            return list(deleted)

        return self._retry("purge_quarantined", attempt)

    def first_free(self) -> str | None:
        """Return the address a first-free `allocate` would take now, without taking it.

        Read-only (``ipam-bridge check-pool``): `describe_subnets` and `entries`, then the
        lowest address of the first subnet with one free (`lowest_free`): phpIPAM's
        ``POST addresses/first_free/`` takes the lowest address without a row, and every
        registered address is a row.

        Returns
        -------
        str or None
            The address as text, or None when no subnet of the pool has a free one.

        Raises
        ------
        SubnetNotFoundError, AuthenticationFailedError, InvalidRequestError,
        BackendUnavailableError
            See `backends.errors`.
        """
        return lowest_free(self.describe_subnets(), self.entries())

    def entries(self) -> list[Allocation]:
        """Return every entry registered in the pool's subnets, whoever made it.

        One ``GET subnets/{id}/addresses/`` per subnet (404 ``No addresses found`` is an
        empty subnet), for the drift audit. Every entry is returned: other people's and
        tools' entries, the gateway, reservations of ours (`RESERVED_HOSTNAMES`) and
        quarantined entries (with `Allocation.quarantined_until`). ``hostname`` and
        ``description`` are as stored (``""`` when phpIPAM has none), ``subnet`` is the
        subnet's CIDR, ``prefix`` and ``gateway`` are those of the subnet.

        Raises
        ------
        SubnetNotFoundError, AuthenticationFailedError, InvalidRequestError,
        BackendUnavailableError
            See `backends.errors`.

        """

        def attempt() -> list[Allocation]:
            found: list[Allocation] = []
            for subnet in self._all_facts():
                for entry in self._list_entries(subnet):
                    allocation = self._allocation(
                        entry, _entry_address(entry, subnet.network), subnet
                    )
                    found.append(allocation)
            return found

        return self._retry("entries", attempt)

    def close(self) -> None:
        """Close the HTTP session (if this client created it).

        The token is deliberately not revoked with ``DELETE /user/``: phpIPAM keeps one
        token per *user* (``users.token``), shared by every client that logs in as that
        user -- other pools, other replicas, scripts -- and revoking it would log all of
        them out. The token expires on its own 6 h after its last use.
        """
        self._transport.close()

    # ----------------------------------------------------------------- operations

    def _retry(self, name: str, fn: Callable[[], T]) -> T:
        return self._transport.call(name, fn)

    def _describe_once(self, index: int) -> SubnetInfo:
        facts = self._subnet_facts(index, refresh=True)
        usage = self._data(self._call("GET", f"subnets/{facts.id}/usage/"), dict)
        total = _to_int(usage.get("maxhosts"), "maxhosts")
        used = _to_int(usage.get("used", usage.get("Used")), "used")
        free_raw = usage.get("freehosts")
        free = _to_int(free_raw, "freehosts") if free_raw is not None else total - used
        gateway = self._gateway_without_known_entry(facts)
        if gateway is not None and not self._gateway_has_entry(facts, gateway):
            # Not free although phpIPAM counts it so: it is registered before any allocation.
            used, free = used + 1, free - 1
        return SubnetInfo(
            cidr=facts.cidr,
            prefix=facts.prefix,
            gateway=facts.effective_gateway,
            total=total,
            used=used,
            free=max(free, 0),
        )

    def _adopt(self, claim: _Claim, facts: Mapping[int, _SubnetFacts]) -> Allocation | None:
        """Return the oldest adoptable entry of the claim in the pool, renaming unusable ones.

        Raises `EntryOwnedError` when every usable entry names another owner.
        """
        usable: list[tuple[_Entry, str]] = []
        for entry in self._search(claim.hostname, facts):
            subnet = facts[entry.subnet_id]
            address = _entry_address(entry, subnet.network)
            never = self._never_assigned(subnet)
            if address in never:
                # Left behind by an attempt interrupted between the POST and the PATCH.
                self._reserve_entry(entry.id, address, never[address], subnet)
            else:
                usable.append((entry, address))
        if not usable:
            return None
        for entry, address in usable:
            if self._adoptable(entry, address, facts[entry.subnet_id], claim):
                log.info("phpIPAM: %s already has address id %d", claim.hostname, entry.id)
                return self._take_over(entry, address, facts[entry.subnet_id], claim)
        entry, address = usable[0]
        raise self._owned(entry, address, claim)

    def _adoptable(self, entry: _Entry, address: str, facts: _SubnetFacts, claim: _Claim) -> bool:
        return may_adopt(self._allocation(entry, address, facts), claim.owner, claim.adopt)

    def _take_over(
        self, entry: _Entry, address: str, facts: _SubnetFacts, claim: _Claim
    ) -> Allocation:
        """Return an adoptable entry as the claim's; rewrite its owner fields when they differ.

        One ``PATCH addresses/{id}/`` with `owner_fields` (200 ``Address updated``); an entry
        deleted meanwhile (404 ``Address does not exist``) is a lost race, retried.
        """
        if entry.owner != claim.owner:
            done = self._lookup("PATCH", f"addresses/{entry.id}/", json=owner_fields(claim.owner))
            if done is None:
                raise ConflictError(f"phpIPAM: address id {entry.id} went away; retrying")
            log.info(
                "phpIPAM: %s (id %d) of %s now names its owner %s (was %s)",
                address,
                entry.id,
                claim.hostname,
                claim.owner,
                entry.owner or "none",
            )
        allocation = self._allocation(entry, address, facts, claim.hostname)
        return replace(allocation, owner=claim.owner)

    @staticmethod
    def _owned(entry: _Entry, address: str, claim: _Claim) -> EntryOwnedError:
        owner = entry.owner or claim.owner  # never None here: an unowned entry is adoptable
        return EntryOwnedError(
            f"phpIPAM: {entry.hostname} ({address}, address id {entry.id}) belongs to claim "
            f"{owner}; it is not adopted",
            hostname=entry.hostname,
            address=address,
            owner=owner,
        )

    def _releasable(self, entry: _Entry, owner: EntryOwner, address: str | None) -> bool:
        """Return True when ``owner`` may release ``entry`` (`backends.base.may_adopt`).

        The entry's subnet facts (its address) are read only when the owner alone does not
        decide.
        """
        found = Allocation(
            address="", prefix=0, gateway=None, hostname=entry.hostname, ref=str(entry.id)
        )
        found = replace(found, owner=entry.owner)
        if may_adopt(found, owner, None):
            return True
        if address is not None:
            held = _entry_address(entry, self._facts_by_id()[entry.subnet_id].network)
            if may_adopt(replace(found, address=held), owner, address):
                return True
        log.info(
            "phpIPAM: left %s (address id %d) alone: it belongs to claim %s",
            entry.hostname,
            entry.id,
            entry.owner,
        )
        return False

    def _allocate_first_free(self, claim: _Claim) -> Allocation:
        subnets = self._all_facts()
        existing = self._adopt(claim, {s.id: s for s in subnets})
        if existing is not None:
            return existing
        body = {"hostname": claim.hostname, **owner_fields(claim.owner)}
        full: list[str] = []
        status: int | None = None
        for subnet in subnets:
            try:
                return self._first_free_in(subnet, claim, body)
            except SubnetExhaustedError as exc:
                full.append(subnet.cidr)
                status = exc.status
                log.info("phpIPAM: subnet %s (id %d) is full", subnet.cidr, subnet.id)
        which = "the subnet" if len(full) == 1 else f"all {len(full)} subnets"
        raise SubnetExhaustedError(
            f"phpIPAM: no free address in {which} of the pool ({', '.join(full)}): "
            "No free addresses found",
            status=status,
        )

    def _first_free_in(
        self, subnet: _SubnetFacts, claim: _Claim, body: Mapping[str, Any]
    ) -> Allocation:
        never = self._never_assigned(subnet)
        self._register_gateway(subnet)
        # Once such an address has an entry phpIPAM never offers it again: one POST more than
        # there are addresses that are never assigned is always enough.
        for _ in range(len(never) + 1):
            created = self._call("POST", f"addresses/first_free/{subnet.id}/", json=body)
            address = _parse_ip(created.get("data"), "first_free data")
            ref = str(created.get("id") or "")
            if not ref.isdigit():
                raise BackendUnavailableError("phpIPAM created an address but sent no id")
            if address in never:
                self._reserve_entry(int(ref), address, never[address], subnet)
                continue
            log.debug("phpIPAM: allocated %s (id %s) to %s", address, ref, claim.hostname)
            return _created(subnet, address, claim, ref)
        raise BackendUnavailableError(
            f"phpIPAM kept offering addresses that are never assigned ({', '.join(sorted(never))})"
        )

    def _allocate_address(self, claim: _Claim, requested: str) -> Allocation:
        hostname = claim.hostname
        text = requested.strip()
        try:
            address = ipaddress.ip_address(text).compressed
        except ValueError:
            raise AddressUnavailableError(
                f"requested address {text!r} is not an IP address; nothing registered",
                address=text,
            ) from None
        subnets = self._all_facts()
        subnet = next((s for s in subnets if ipaddress.ip_address(address) in s.network), None)
        if subnet is None:
            cidrs = ", ".join(s.cidr for s in subnets)
            raise AddressUnavailableError(
                f"requested address {address} lies outside every subnet of the pool ({cidrs}); "
                "nothing registered",
                address=address,
            )
        reservation = self._never_assigned(subnet).get(address)
        if reservation is not None:
            raise AddressUnavailableError(
                f"requested address {address} is the {reservation.what} of subnet "
                f"{subnet.cidr} and is never handed out; nothing registered",
                address=address,
            )
        facts = self._facts_by_id()
        for entry in self._search(hostname, facts):
            held = _entry_address(entry, facts[entry.subnet_id].network)
            if held in self._never_assigned(facts[entry.subnet_id]):
                continue
            if not self._adoptable(entry, held, facts[entry.subnet_id], claim):
                raise self._owned(entry, held, claim)
            if held == address:
                log.info("phpIPAM: %s already has %s (id %d)", hostname, address, entry.id)
                return self._take_over(entry, address, subnet, claim)
            raise AddressUnavailableError(
                f"requested address {address}: {hostname} already holds {held} in the "
                "pool (one address per claim); nothing registered",
                address=address,
            )
        body = {"subnetId": subnet.id, "ip": address, "hostname": hostname}
        body.update(owner_fields(claim.owner))
        try:
            created = self._call("POST", "addresses/", json=body)
        except ConflictError:
            return self._holder_of(address, subnet, claim)
        except _InvalidAddressError as exc:
            raise AddressUnavailableError(
                f"requested address {address} is not valid in subnet {subnet.cidr} for "
                f"phpIPAM ({exc.message}); nothing registered",
                address=address,
                status=exc.status,
            ) from None
        ref = str(created.get("id") or "")
        if not ref.isdigit():
            raise BackendUnavailableError("phpIPAM created an address but sent no id")
        log.info("phpIPAM: registered requested %s (id %s) to %s", address, ref, hostname)
        return _created(subnet, address, claim, ref)

    def _holder_of(self, address: str, subnet: _SubnetFacts, claim: _Claim) -> Allocation:
        """After phpIPAM said ``address`` exists: ours (returned) or someone else's (raise)."""
        answer = self._lookup("GET", f"addresses/search/{address}/")
        found = self._entries_in(answer, {subnet.id}) if answer is not None else []
        if not found:
            # Deleted again since phpIPAM refused it: try once more under the retry policy.
            raise ConflictError(f"phpIPAM: {address} was taken, then freed again; retrying")
        entry = found[0]
        hostname = claim.hostname
        if entry.hostname.lower() == hostname.lower() and _quarantine_end(entry) is None:
            if not self._adoptable(entry, address, subnet, claim):
                raise self._owned(entry, address, claim)
            log.info("phpIPAM: %s already has %s (id %d)", hostname, address, entry.id)
            return self._take_over(entry, address, subnet, claim)
        holder = entry.hostname or None
        shown = repr(holder) if holder is not None else "an entry without hostname"
        raise AddressUnavailableError(
            f"requested address {address} in subnet {subnet.cidr} is held by {shown}; "
            "nothing registered",
            address=address,
            holder=holder,
        )

    def _reserve_entry(
        self, address_id: int, address: str, reservation: _Reservation, facts: _SubnetFacts
    ) -> None:
        """Rename an entry this client created to a reserved hostname (the entry stays)."""
        self._lookup(
            "PATCH",
            f"addresses/{address_id}/",
            json={
                "hostname": reservation.hostname,
                "description": reservation.description[:DESCRIPTION_MAX_CHARS],
            },
        )
        if reservation is _GATEWAY:
            with self._gateway_lock:
                self._gateway_entries.add((facts.id, address))
        log.info(
            "phpIPAM: kept %s (id %d) as %s: it is never assigned",
            address,
            address_id,
            reservation.hostname,
        )

    # ----------------------------------------------------------------- gateway

    def _never_assigned(self, facts: _SubnetFacts) -> dict[str, _Reservation]:
        """Addresses of the subnet never given to a claim, with the entry name that keeps each."""
        net = facts.network
        never: dict[str, _Reservation] = {}
        if net.version == 4 and net.prefixlen < 31:
            never[net.network_address.compressed] = _NETWORK_V4
            never[net.broadcast_address.compressed] = _BROADCAST
        elif net.version == 6 and self._config.skip_ipv6_network_address:
            never[net.network_address.compressed] = _NETWORK_V6
        for gateway in (facts.gateway, facts.ref.gateway):
            if gateway is not None and ipaddress.ip_address(gateway) in net:
                never.setdefault(gateway, _GATEWAY)
        return never

    def _gateway_without_known_entry(self, facts: _SubnetFacts) -> str | None:
        """Return the gateway first-free could hand out unless registered, or None.

        phpIPAM's own gateway is an entry; the override is one only once registered. An address
        outside the subnet, or its IPv4 network or broadcast address, is never offered.
        """
        gateway = facts.ref.gateway
        if gateway is None and facts.gateway_id is None:
            gateway = facts.gateway  # a gateway without an entry id: not seen in phpIPAM
        if gateway is None or (gateway == facts.gateway and facts.gateway_id is not None):
            return None
        if not _offered_by_first_free(gateway, facts.network):
            return None
        with self._gateway_lock:
            if (facts.id, gateway) in self._gateway_entries:
                return None
        return gateway

    def _gateway_has_entry(self, facts: _SubnetFacts, gateway: str) -> bool:
        """Look the gateway up (``GET addresses/search/{ip}/``); remember an entry once seen."""
        answer = self._lookup("GET", f"addresses/search/{gateway}/")
        found = answer is not None and bool(self._entries_in(answer, {facts.id}))
        if found:
            with self._gateway_lock:
                self._gateway_entries.add((facts.id, gateway))
        return found

    def _register_gateway(self, facts: _SubnetFacts) -> None:
        """Give a gateway without an entry one, under `RESERVED_GATEWAY_HOSTNAME` (idempotent).

        ``POST addresses/`` with the address (201 ``Address created``). 409 ``IP address
        already exists``, or the 500 ``Duplicate entry`` of a lost race, means the address
        has an entry already (another replica or operator, a person): that entry is left as
        it is.
        """
        gateway = self._gateway_without_known_entry(facts)
        if gateway is None:
            return
        with self._gateway_lock:
            if (facts.id, gateway) in self._gateway_entries:
                return  # another thread registered it meanwhile
            try:
                created = self._call(
                    "POST",
                    "addresses/",
                    json={
                        "subnetId": facts.id,
                        "ip": gateway,
                        "hostname": RESERVED_GATEWAY_HOSTNAME,
                        "description": RESERVED_GATEWAY_DESCRIPTION[:DESCRIPTION_MAX_CHARS],
                    },
                )
            except ConflictError:
                log.info("phpIPAM: gateway %s already has an entry in subnet %d", gateway, facts.id)
            else:
                log.info(
                    "phpIPAM: registered gateway %s (id %s) as %s so that it is never assigned",
                    gateway,
                    created.get("id"),
                    RESERVED_GATEWAY_HOSTNAME,
                )
            self._gateway_entries.add((facts.id, gateway))

    # ----------------------------------------------------------------- entries

    def _search(self, hostname: str, subnet_ids: Collection[int]) -> list[_Entry]:
        """Entries of the given subnets registered under ``hostname``, oldest first.

        Quarantined entries (a `backends.base.quarantine_mark` description) are left out.
        """
        if not hostname.strip() or "/" in hostname:
            # phpIPAM drops empty path segments and splits on "/" before decoding.
            raise InvalidRequestError(f"invalid hostname {hostname!r} for phpIPAM")
        if hostname.strip().lower() in RESERVED_HOSTNAMES:
            raise InvalidRequestError(
                f"{hostname!r} is reserved by ipam-bridge for addresses that are never assigned"
            )
        answer = self._lookup("GET", f"addresses/search_hostname/{quote(hostname, safe='')}/")
        if answer is None:
            return []
        return [
            entry
            for entry in self._entries_in(answer, subnet_ids)
            if entry.hostname.lower() == hostname.lower()
            and quarantined_until(entry.description) is None
        ]

    def _list_entries(self, facts: _SubnetFacts) -> list[_Entry]:
        """Every entry of one subnet (``GET subnets/{id}/addresses/``), oldest first."""
        answer = self._lookup("GET", f"subnets/{facts.id}/addresses/")
        return self._entries_in(answer, {facts.id}) if answer is not None else []

    def _entries_in(self, answer: dict[str, Any], subnet_ids: Collection[int]) -> list[_Entry]:
        """Return the address entries of an answer that lie in ``subnet_ids``, by id."""
        entries: list[_Entry] = []
        for raw in self._data(answer, list):
            if not isinstance(raw, Mapping):
                raise BackendUnavailableError("phpIPAM answer holds a non-object address entry")
            subnet_id = _to_int(raw.get("subnetId"), "subnetId")
            if subnet_id not in subnet_ids:
                continue
            entries.append(
                _Entry(
                    id=_to_int(raw.get("id"), "id"),
                    subnet_id=subnet_id,
                    raw_ip=str(raw.get("ip")),
                    hostname=str(raw.get("hostname") or ""),
                    description=str(raw.get("description") or ""),
                    owner=_entry_owner(raw),
                )
            )
        return sorted(entries, key=lambda r: r.id)

    def _allocation(
        self, entry: _Entry, address: str, facts: _SubnetFacts, hostname: str | None = None
    ) -> Allocation:
        """Return an entry's `Allocation`, under ``hostname`` (the claim's key) when given."""
        return Allocation(
            address=address,
            prefix=facts.prefix,
            gateway=facts.effective_gateway,
            hostname=hostname if hostname is not None else entry.hostname,
            ref=str(entry.id),
            subnet=facts.cidr,
            description=entry.description,
            quarantined_until=_quarantine_end(entry),
            owner=entry.owner,
        )

    # ----------------------------------------------------------------- subnets

    def _resolve_id(self, index: int) -> int:
        known = self._subnet_ids[index]
        if known is not None:
            return known
        with self._subnet_lock:
            resolved = self._subnet_ids[index]
            if resolved is None:
                resolved = self._lookup_cidr(self._refs[index])
                self._subnet_ids[index] = resolved
            return resolved

    def _resolve_ids(self) -> list[int]:
        return [self._resolve_id(n) for n in range(len(self._refs))]

    def _lookup_cidr(self, ref: SubnetRef) -> int:
        assert ref.cidr is not None  # guaranteed by PHPIPAMConfig
        net = ipaddress.ip_network(ref.cidr)
        # The CIDR goes in as two path segments: phpIPAM splits the path before decoding.
        answer = self._call(
            "GET", f"subnets/cidr/{net.network_address.compressed}/{net.prefixlen}/"
        )
        matches = [r for r in self._data(answer, list) if isinstance(r, Mapping)]
        section = self._config.section_id
        if section is not None:
            matches = [r for r in matches if _to_int(r.get("sectionId"), "sectionId") == section]
        where = f" in section {section}" if section is not None else ""
        if not matches:
            raise SubnetNotFoundError(f"phpIPAM has no subnet {net}{where}")
        if len(matches) > 1:
            sections = ", ".join(str(r.get("sectionId")) for r in matches)
            raise SubnetNotFoundError(
                f"phpIPAM has {len(matches)} subnets {net}{where} (sections {sections}); "
                "set sectionId or subnetId to choose one"
            )
        subnet_id = _to_int(matches[0].get("id"), "id")
        log.info("phpIPAM: subnet %s%s is id %d", net, where, subnet_id)
        return subnet_id

    def _all_facts(self) -> list[_SubnetFacts]:
        return [self._subnet_facts(n) for n in range(len(self._refs))]

    def _facts_by_id(self) -> dict[int, _SubnetFacts]:
        return {facts.id: facts for facts in self._all_facts()}

    def _subnet_facts(self, index: int, *, refresh: bool = False) -> _SubnetFacts:
        cached = self._facts[index]
        if cached is not None and not refresh:
            return cached
        subnet_id = self._resolve_id(index)
        data = self._data(self._call("GET", f"subnets/{subnet_id}/"), dict)
        try:
            network = ipaddress.ip_network(f"{data.get('subnet')}/{data.get('mask')}", strict=False)
        except ValueError:
            raise BackendUnavailableError(
                f"phpIPAM subnet {subnet_id} has no usable subnet/mask fields"
            ) from None
        gateway_obj = data.get("gateway")
        gateway = None
        gateway_id = None
        if isinstance(gateway_obj, Mapping) and gateway_obj.get("ip_addr"):
            gateway = _parse_ip(gateway_obj.get("ip_addr"), "gateway.ip_addr")
            raw_id = gateway_obj.get("id", data.get("gatewayId"))
            gateway_id = _to_int(raw_id, "gateway.id") if raw_id not in (None, "") else None
        ref = self._refs[index]
        if (
            ref.cidr is not None
            and ref.subnet_id is not None
            and network.with_prefixlen != ref.cidr
        ):
            raise SubnetNotFoundError(
                f"phpIPAM subnet {subnet_id} is {network.with_prefixlen}, not {ref.cidr} as the "
                "pool names it"
            )
        facts = _SubnetFacts(
            ref=ref,
            id=subnet_id,
            network=network,
            gateway=gateway,
            gateway_id=gateway_id,
        )
        self._facts[index] = facts
        return facts

    # ----------------------------------------------------------------- HTTP

    def _data(self, answer: dict[str, Any] | None, kind: type[T]) -> T:
        data = answer.get("data") if answer is not None else None
        if not isinstance(data, kind):
            raise BackendUnavailableError(
                f"phpIPAM answer has no {kind.__name__} in 'data' (unexpected API version?)"
            )
        return data

    def _call(
        self, method: str, path: str, *, json: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Send an authenticated request and return the success envelope (or raise)."""
        answer = self._request(method, path, json=json, lookup=False)
        assert answer is not None  # only lookups return None
        return answer

    def _lookup(
        self, method: str, path: str, *, json: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Like `_call`, but a "not found" answer returns None."""
        return self._request(method, path, json=json, lookup=True)

    def _request(
        self, method: str, path: str, *, json: Mapping[str, Any] | None, lookup: bool
    ) -> dict[str, Any] | None:
        token = self._current_token()
        reply = self._send(method, path, token=token, json=json)
        if _token_rejected(reply):
            if self._config.app_code is not None:
                raise AuthenticationFailedError(
                    f"phpIPAM app {self._config.app_id!r} refused the app code token "
                    "(is the app's security 'SSL with App code token'?)",
                    status=reply.status,
                )
            # One re-login, then the same request once more: a 401 means phpIPAM rejected
            # the request before doing anything, so repeating a POST is safe.
            token = self._relogin(stale=token)
            reply = self._send(method, path, token=token, json=json)
            if _token_rejected(reply):
                raise AuthenticationFailedError(
                    "phpIPAM refused a token it had just issued (HTTP 401 'Unauthorized')",
                    status=reply.status,
                )
        return self._interpret(reply, f"{method} {path}", lookup=lookup)

    def _current_token(self) -> str:
        token = self._token
        if token is not None:
            return token
        with self._auth_lock:
            if self._token is None:
                self._token = self._login()
            return self._token

    def _relogin(self, stale: str) -> str:
        with self._auth_lock:
            if self._token is not None and self._token != stale:
                return self._token  # another thread logged in again meanwhile
            self._token = None
            log.info("phpIPAM: token refused (expired?); logging in again")
            self._token = self._login()
            return self._token

    def _login(self) -> str:
        """Log in (the caller holds ``_auth_lock``) and return the token.

        Goes through the endpoint's login budget (`backends.transport.Endpoint.check_login`):
        after too many refused logins to this endpoint a login is held back, not sent.
        """
        config = self._config
        assert config.username is not None and config.password is not None
        # UTF-8, as a browser or curl would send it (requests would use Latin-1 for str).
        auth = basic_auth(config.username, config.password)

        def login() -> dict[str, Any] | None:
            reply = self._send("POST", "user/", auth=auth)
            return self._interpret(reply, "POST user/ (login)", lookup=False)

        answer = self._transport.login(
            credential_id(config.username, config.password), login, blocked_for=_blocked_for
        )
        data = answer.get("data") if answer is not None else None
        token = data.get("token") if isinstance(data, Mapping) else None
        if not isinstance(token, str) or not token:
            raise BackendUnavailableError("phpIPAM login answer carries no token")
        log.info(
            "phpIPAM: logged in to app %r at %s as %r",
            config.app_id,
            config.endpoint,
            config.username,
        )
        return token

    def _send(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        auth: requests.auth.AuthBase | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> _Reply:
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["token"] = token
        response = self._transport.request(
            method,
            f"{self._base_url}/{path}",
            what=f"{method} {path}",
            headers=headers,
            auth=auth,
            json=json,
        )
        envelope: dict[str, Any] | None = None
        try:
            parsed = response.json()
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "success" in parsed:
            envelope = parsed
        return _Reply(
            status=response.status_code,
            envelope=envelope,
            content_type=response.headers.get("Content-Type", ""),
        )

    def _interpret(self, reply: _Reply, what: str, *, lookup: bool) -> dict[str, Any] | None:
        status = reply.status
        envelope = reply.envelope
        if envelope is None:
            # A PHP fatal error (empty text/html 500), a proxy's error page, ...
            raise BackendUnavailableError(
                f"phpIPAM {what}: HTTP {status} without an API answer "
                f"(Content-Type {reply.content_type or 'none'!r})",
                status=status,
            )
        success = _truthy(envelope.get("success"))
        if success and 200 <= status < 300:
            return envelope
        message = _cut(str(envelope.get("message") or ""))
        if not success and lookup and message.strip().lower() in _NOT_FOUND_MESSAGES:
            return None
        code = envelope.get("code")
        # phpIPAM <= 1.4 sends some errors as HTTP 200 with the real code in the body.
        effective = code if status < 400 and isinstance(code, int) and code >= 400 else status
        raise self._error(effective, message, what, status)

    def _overloaded(self, response: requests.Response) -> bool:
        """Return True when a phpIPAM answer says the server is overloaded or failing.

        As `backends.transport.overloaded` (HTTP 429, 5xx), except an answer whose JSON
        message `_error` maps to a refusal of the request itself rather than to
        `BackendUnavailableError`: phpIPAM sends a lost first-free race (``Duplicate
        entry``), wrong credentials, a blocked client address or an address outside the
        subnet as HTTP 500 (phpipam-api.md in the project's references). A 5xx without a
        JSON envelope (a PHP fatal error) or about a lock (``Cannot obtain lock``) stays one.
        """
        if not overloaded(response):
            return False
        try:
            envelope = response.json()
        except ValueError:
            return True
        message = str(envelope.get("message") or "") if isinstance(envelope, dict) else ""
        status = response.status_code
        return isinstance(self._error(status, message, "", status), BackendUnavailableError)

    def _error(self, code: int, message: str, what: str, status: int) -> BackendError:
        m = message.strip().lower()
        app = self._config.app_id
        text = f"phpIPAM {what}: {message or 'no message'} (HTTP {status})"
        if "has been blocked" in m:
            return AuthenticationFailedError(
                f"{text}; too many failed logins from this address: fix the credentials, "
                "then wait 5 minutes",
                status=status,
            )
        if m in ("invalid username or password", "please provide username and password"):
            return AuthenticationFailedError(f"{text}; check username and password", status=status)
        if m == "invalid permissions":
            return AuthenticationFailedError(
                f"{text}; API app {app!r} needs Read/Write permission", status=status
            )
        if m in ("invalid application id", "application disabled"):
            return AuthenticationFailedError(
                f"{text}; check that API app {app!r} exists and is enabled", status=status
            )
        if m == "unauthorized":
            return AuthenticationFailedError(text, status=status)
        if "ssl connection is required" in m:
            return InvalidRequestError(
                f"{text}; API app {app!r} only accepts HTTPS: use an https:// endpoint, or set "
                "the app's security to 'none' and $api_allow_unsafe = true in phpIPAM's "
                "config.php (behind a TLS proxy: $trust_x_forwarded_headers = true)",
                status=status,
            )
        if m.startswith(("invalid subnet id", "invalid subnet identifier", "no subnets found")):
            return SubnetNotFoundError(text, status=status)
        if m.startswith("no free addresses found"):
            return SubnetExhaustedError(text, status=status)
        if "is not a valid address for subnet" in m:
            # POST addresses/ with an ip outside the subnet or at its network/broadcast.
            return _InvalidAddressError(text, status=status)
        if "ip address already exists" in m or "duplicate entry" in m or "sid_ip_unique" in m:
            return ConflictError(f"{text}; lost a first-free race", status=status)
        transient = status_error("phpIPAM", what, code, f"{message or 'no message'}")
        if transient is not None:
            return BackendUnavailableError(text, status=status)
        return InvalidRequestError(text, status=status)


# --------------------------------------------------------------------- helpers


#: How long phpIPAM blocks an address after more than 10 failed logins in 5 minutes.
_BLOCK_SECONDS: Final = 300.0


def _created(subnet: _SubnetFacts, address: str, claim: _Claim, ref: str) -> Allocation:
    """Return the `Allocation` of an entry this client just created in ``subnet``."""
    return Allocation(
        address=address,
        prefix=subnet.prefix,
        gateway=subnet.effective_gateway,
        hostname=claim.hostname,
        ref=ref,
        subnet=subnet.cidr,
        description=owner_fields(claim.owner)["description"],
        owner=claim.owner,
    )


def owner_fields(owner: EntryOwner) -> dict[str, str]:
    """Return the phpIPAM address fields that name ``owner`` (create and ``PATCH`` bodies).

    ``note`` (``text``): ``ipam-bridge cluster=<cluster_id> claim=<namespace>/<name>``, the
    full truth, read first; ``owner`` (``varchar(128)``): `backends.base.owner_text` cut to
    `OWNER_MAX_CHARS`, for people; ``description`` (``varchar(64)``): ``ipam-bridge
    <namespace>/<name>`` cut to `DESCRIPTION_MAX_CHARS` (phpipam-api.md section 12: a longer
    value is cut, or refused with a 500 under MariaDB strict mode).
    """
    return {
        "description": f"{OWNER_PREFIX} {owner.claim}"[:DESCRIPTION_MAX_CHARS],
        "owner": owner_text(owner)[:OWNER_MAX_CHARS],
        "note": f"{OWNER_PREFIX} cluster={owner.cluster_id} claim={owner.claim}",
    }


def _entry_owner(raw: Mapping[str, Any]) -> EntryOwner | None:
    """Return the owner an address entry names: its ``note``, else ``owner``, else description."""
    for name in ("note", "owner", "description"):
        owner = parse_owner(str(raw.get(name) or ""))
        if owner is not None:
            return owner
    return None


def _blocked_for(exc: AuthenticationFailedError) -> float:
    """Return how long phpIPAM blocks logins from this address after the refusal ``exc``."""
    return _BLOCK_SECONDS if "too many failed logins" in exc.message else 0.0


def _token_rejected(reply: _Reply) -> bool:
    """Return True for phpIPAM's answer to a missing, unknown or expired token."""
    message = str((reply.envelope or {}).get("message") or "")
    return reply.status == 401 and message.strip().lower() == "unauthorized"


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true")
    return bool(value)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_MAX_CHARS else text[: _MESSAGE_MAX_CHARS - 3] + "..."


def _to_int(value: object, name: str) -> int:
    """Return an integer field sent as a JSON number or as a string (``"254"``)."""
    if isinstance(value, bool):
        raise BackendUnavailableError(f"phpIPAM sent a boolean for {name!r}")
    if isinstance(value, int):
        return value
    try:
        if isinstance(value, float):
            return int(value)
        if isinstance(value, str):
            text = value.strip()
            return int(text) if text.lstrip("-").isdigit() else int(float(text))
    except (ValueError, OverflowError):
        pass
    raise BackendUnavailableError(f"phpIPAM sent {name!r} that is not a number")


def _parse_ip(value: object, name: str) -> str:
    try:
        return ipaddress.ip_address(str(value).strip()).compressed
    except ValueError:
        raise BackendUnavailableError(f"phpIPAM sent {name!r} that is not an IP address") from None


def _entry_address(entry: _Entry, network: IPNetwork) -> str:
    """Return the entry's address, also when sent as a decimal integer (2nd+ entries).

    ``network`` is the entry's subnet: its address family decides how a decimal is read.
    """
    raw = entry.raw_ip.strip()
    if not raw.isdigit():
        return _parse_ip(raw, "ip")
    try:
        number = int(raw)
        if network.version == 4:
            return ipaddress.IPv4Address(number).compressed
        return ipaddress.IPv6Address(number).compressed
    except ValueError:
        raise BackendUnavailableError(
            f"phpIPAM sent ip {raw!r} for address id {entry.id}, out of range"
        ) from None


def _quarantine_end(entry: _Entry) -> float | None:
    """Return when a quarantined entry's quarantine ends (Unix seconds), or None.

    Quarantined means both parts of the mark: the hostname starts with
    `backends.base.QUARANTINE_PREFIX` and the description is a `quarantine_mark`.
    """
    if not entry.hostname.lower().startswith(QUARANTINE_PREFIX):
        return None
    return quarantined_until(entry.description)


def _offered_by_first_free(address: str, network: IPNetwork) -> bool:
    """Return True when first-free can hand ``address`` out of ``network``.

    phpIPAM's first-free walks the whole subnet except, for IPv4 below /31, the network and
    broadcast addresses (``Addresses::get_first_available_address``,
    https://github.com/phpipam/phpipam/blob/master/functions/classes/class.Addresses.php).
    """
    ip = ipaddress.ip_address(address)
    if ip not in network:
        return False
    if network.version == 4 and network.prefixlen < 31:
        return ip not in (network.network_address, network.broadcast_address)
    return True


def lowest_free(infos: Sequence[SubnetInfo], entries: Iterable[Allocation]) -> str | None:
    """Return the lowest address of the first subnet with one free, as first-free takes it.

    phpIPAM's ``first_free`` takes the lowest address without a row (every registered
    address is a row, listed by `PHPIPAMBackend.entries`). An address is free when no entry
    is registered at it and it is not the subnet's gateway; the network and broadcast
    addresses of an IPv4 subnet below /31 are never offered (``ipaddress`` ``hosts()``).
    Subnets reporting no free address are skipped.

    Parameters
    ----------
    infos:
        `PHPIPAMBackend.describe_subnets`, in the pool's order.
    entries:
        `PHPIPAMBackend.entries`: every entry of the pool's subnets.

    Returns
    -------
    str or None
        The address as text, or None when no subnet has a free one.
    """
    used = {ipaddress.ip_address(entry.address) for entry in entries}
    for info in infos:
        if info.free <= 0:
            continue
        taken = used | ({ipaddress.ip_address(info.gateway)} if info.gateway else set())
        for host in ipaddress.ip_network(info.cidr, strict=False).hosts():
            if host not in taken:
                return str(host)
    return None
