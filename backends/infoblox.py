"""Infoblox NIOS WAPI client: one pool's networks, host records or fixed addresses."""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.cookiejar import Cookie, CookieJar
from types import MappingProxyType
from typing import Any, Literal, cast
from urllib.parse import quote

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
    NO_AUTH,
    Transport,
    basic_auth,
    credential_id,
    default_user_agent,
    status_error,
)

__all__ = [
    "DEFAULT_LOGIN_LIMIT",
    "MAX_SUBNETS",
    "NIOS_LOCKOUT_FAILURES",
    "InfobloxBackend",
    "InfobloxConfig",
    "owner_extattr_value",
]

log = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The session cookie the grid sets after a successful HTTP Basic login (WAPI guide,
#: "Transport and Authentication").
AUTH_COOKIE = "ibapauth"
#: MAC address of a fixed address that is a plain reservation (infoblox-go-client ``MACADDR_ZERO``).
ZERO_MAC = "00:00:00:00:00:00"
#: WAPI's ``record:host.comment`` and ``fixedaddress.comment`` hold at most 256 characters.
MAX_COMMENT = 256
#: Page size of paged searches (WAPI's default ``_max_results`` is -1000: an error above 1000).
PAGE_SIZE = 1000
#: Most networks one pool may list (``spec.subnets``, as the CRD allows).
MAX_SUBNETS = 32
#: Namespace of the deterministic DUID-UUID (RFC 6355) given to IPv6 fixed addresses.
_DUID_NAMESPACE = uuid.UUID("4a6f1c52-7b0e-4d5c-9a43-6d1f0b2c8e11")
#: Failed logins after which NIOS locks a local user (account lockout default).
NIOS_LOCKOUT_FAILURES = 5
#: Refused logins per endpoint and 5 minutes the client allows itself (below the lockout).
DEFAULT_LOGIN_LIMIT = 3
#: How long NIOS keeps a locked account locked by default (seconds).
NIOS_LOCKOUT_SECONDS = 300.0
#: Fields read from host records (search by name, listing of a network).
_HOST_FIELDS = "name,view,comment,ipv4addrs,ipv6addrs"

_EXHAUSTED_RE = re.compile(r"cannot find \d+ available ip", re.IGNORECASE)
_UNKNOWN_EA_RE = re.compile(r"unknown extensible attribute:?\s*(?P<name>[^\n]*)", re.IGNORECASE)
_NETWORK_MISSING_RE = re.compile(
    r"(cannot|can not|unable to) find (the )?(ipv6)?network"
    r"|no (such )?(ipv6)?network"
    r"|(ipv6)?network [^ ]+ (was )?(not found|does not exist)",
    re.IGNORECASE,
)
_UNSUPPORTED_VERSION_RE = re.compile(r"version\s+\S+\s+not supported", re.IGNORECASE)
#: Conflict texts of a lost race (for an address or a name); any other
#: ``Client.Ibap.Data.Conflict`` (an EA not allowed, superuser-only EA definitions, a member
#: of another network view) is a refusal a person must resolve.
_RACE_RE = re.compile(r"already exists|already in use|already (been )?(used|assigned)", re.I)
_LOCKED_RE = re.compile(r"\block(ed|out)\b|account (is )?disabled", re.IGNORECASE)
_TAG_RE = re.compile(r"<[^>]+>")


def _normal_gateway(text: str | None, network: IPNetwork, what: str) -> str | None:
    """Return ``text`` as a normalised address of ``network``'s family, or None when unset."""
    if text is None:
        return None
    try:
        gateway = ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an IP address") from None
    if gateway.version != network.version:
        raise ValueError(f"{what} {text!r} and subnet {network} are of different address families")
    return gateway.compressed


def _normal_subnet(ref: SubnetRef, gateway: str | None, prefix: int | None) -> SubnetRef:
    """Validate one `SubnetRef` and return it normalised, the pool's overrides folded in."""
    if ref.subnet_id is not None or not ref.cidr:
        raise ValueError("an Infoblox subnet is named by its CIDR (subnet_id is phpIPAM's)")
    try:
        network = ipaddress.ip_network(ref.cidr.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"subnet {ref.cidr!r} is not a CIDR: {exc}") from exc
    chosen_prefix = ref.prefix if ref.prefix is not None else prefix
    if chosen_prefix is not None and not 0 <= chosen_prefix <= network.max_prefixlen:
        raise ValueError(
            f"prefix {chosen_prefix} of subnet {network} is not in 0-{network.max_prefixlen}"
        )
    chosen_gateway = ref.gateway if ref.gateway is not None else gateway
    return SubnetRef(
        cidr=str(network),
        gateway=_normal_gateway(chosen_gateway, network, f"gateway of subnet {network}"),
        prefix=chosen_prefix,
    )


@dataclass(frozen=True, kw_only=True)
class InfobloxConfig:
    """Where and how to reach one pool's Infoblox networks (the pool spec plus its Secret).

    Keyword-only. Exactly one of ``subnet`` (the single-subnet form) and ``subnets`` is given;
    after construction ``subnets`` always holds the pool's networks (``subnet`` alone gives a
    list of one) and ``subnet`` the first one's CIDR.

    Attributes
    ----------
    endpoint:
        Grid master URL, e.g. ``"https://gm.example.com"``; requests go to
        ``<endpoint>/wapi/v<wapi_version>/...``.
    username, password:
        Credentials of a WAPI user (HTTP Basic). The password is hidden from ``repr``.
    subnets:
        The pool's networks in order (1-32 `backends.base.SubnetRef`, each with ``cidr``
        set to an existing WAPI ``network`` (IPv4) or ``ipv6network`` (IPv6) of
        ``network_view``, and optional ``gateway``/``prefix`` overrides). Normalised:
        CIDRs and gateways in canonical text, ``gateway``/``prefix`` below folded in where
        an entry sets none.
    subnet:
        The single-subnet form: the CIDR of the pool's only network. After construction,
        the CIDR of the first network.
    gateway:
        With ``subnet``: that network's gateway override; with ``subnets``: the default
        override of entries that set none. None uses each network's DHCP ``routers``
        option. Either way the gateway is reported in every `Allocation` and `SubnetInfo`
        of its network, and never handed out: next-available-IP does not know the
        ``routers`` option, so the gateways (override and ``routers``) are excluded in the
        allocation request itself.
    prefix:
        Prefix length override (bits), like ``gateway``; None uses each network's own.
    wapi_version:
        WAPI version in the URL (default ``"2.12"``); a grid that lacks it answers 400.
    network_view:
        WAPI network view that holds the networks (default ``"default"``).
    record_type:
        ``"host"`` (default): a ``record:host``; ``"fixedaddress"``: a ``fixedaddress``
        (IPv6: ``ipv6fixedaddress``) reservation.
    dns_view:
        DNS view of host records created in DNS (only used together with ``dns_zone``).
    dns_zone:
        With a zone (host records only) the entry is ``<hostname>.<zone>`` with
        ``configure_for_dns: true`` in ``dns_view``; without, ``configure_for_dns: false``
        and the entry lives only in ``network_view``.
    extensible_attributes:
        Extensible attributes (EA name -> value) stamped on every entry; each EA must be
        defined in the grid.
    owner_extensible_attribute:
        Name of an extensible attribute (a string EA the grid defines; the pool's
        ``spec.ownerExtensibleAttribute``) that carries each entry's owner as
        `owner_extattr_value` (``<cluster_id> <namespace>/<name>``), besides the ``comment``;
        None (default) writes the owner in the comment only. A grid that does not define it
        refuses the create with 400 ``Unknown extensible attribute``.
    verify:
        TLS verification: True (default), False (off: ``insecureSkipVerify``).
    ca_pem:
        CA bundle (PEM text) to verify the grid with instead of the system CAs.
    timeout_seconds:
        Connect and read timeout of every HTTP request, in seconds (cut to the time left of
        the operation, see `backends.transport`).
    retry:
        Retry policy every call goes through (`backends.retry.RetryPolicy`); its
        ``total_seconds`` bounds each operation, requests in flight included.
    user_agent:
        The ``User-Agent`` header.
    login_limit:
        Refused logins to the grid's endpoint within 5 minutes after which no login is sent
        until the oldest leaves the window (default 3; 1-4). NIOS's account lockout, when
        enabled, locks a local user after 5 failed logins for 5 minutes by default (NIOS
        admin guide, "Configuring Security Features"), so the operator can never lock the
        account it needs; the operator's whole endpoint budget (phpIPAM's is 5) is also an
        upper bound.

    Raises
    ------
    ValueError
        From the constructor when neither or both of ``subnet`` and ``subnets`` are given,
        ``subnets`` has more than 32 entries, an entry has no CIDR (or a phpIPAM
        ``subnet_id``), a CIDR is malformed, two entries overlap, a gateway is not an
        address of its subnet's family, a prefix is out of range, ``record_type`` is
        unknown, ``dns_zone`` is set with ``record_type="fixedaddress"``, or
        ``timeout_seconds`` is not positive, or ``login_limit`` is not 1-4.

    """

    endpoint: str
    username: str
    password: str = field(repr=False)
    subnets: tuple[SubnetRef, ...] = ()
    subnet: str | None = None
    gateway: str | None = None
    prefix: int | None = None
    wapi_version: str = "2.12"
    network_view: str = "default"
    record_type: Literal["host", "fixedaddress"] = "host"
    dns_view: str = "default"
    dns_zone: str | None = None
    extensible_attributes: Mapping[str, str] = field(default_factory=dict)
    owner_extensible_attribute: str | None = None
    verify: bool = True
    ca_pem: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    user_agent: str = field(default_factory=default_user_agent)
    login_limit: int = DEFAULT_LOGIN_LIMIT

    def __post_init__(self) -> None:
        if (self.subnet is None) == (not self.subnets):
            raise ValueError("give exactly one of subnet (one network) and subnets (a list)")
        given = tuple(self.subnets) or (SubnetRef(cidr=self.subnet),)
        if len(given) > MAX_SUBNETS:
            raise ValueError(f"a pool lists at most {MAX_SUBNETS} subnets, not {len(given)}")
        subnets = tuple(_normal_subnet(ref, self.gateway, self.prefix) for ref in given)
        networks = [ipaddress.ip_network(str(ref.cidr)) for ref in subnets]
        for index, network in enumerate(networks):
            for other in networks[:index]:
                if network.version == other.version and network.overlaps(other):
                    raise ValueError(f"subnets {other} and {network} overlap")
        if self.record_type not in ("host", "fixedaddress"):
            raise ValueError(
                f"record_type must be 'host' or 'fixedaddress', not {self.record_type!r}"
            )
        if self.dns_zone and self.record_type != "host":
            raise ValueError("dns_zone applies to host records only (record_type 'host')")
        if self.timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if not 1 <= self.login_limit < NIOS_LOCKOUT_FAILURES:
            raise ValueError(
                f"login_limit must be 1-{NIOS_LOCKOUT_FAILURES - 1} (below NIOS's lockout "
                f"threshold of {NIOS_LOCKOUT_FAILURES} failed logins), not {self.login_limit}"
            )
        if self.gateway is not None and self.subnet is not None:
            object.__setattr__(self, "gateway", subnets[0].gateway)
        object.__setattr__(self, "subnets", subnets)
        object.__setattr__(self, "subnet", subnets[0].cidr)
        object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))
        object.__setattr__(self, "dns_zone", (self.dns_zone or "").strip(".") or None)
        object.__setattr__(
            self, "extensible_attributes", MappingProxyType(dict(self.extensible_attributes))
        )


@dataclass(frozen=True)
class _Claim:
    """What `InfobloxBackend.allocate` registers: the hostname, its owner, the address to adopt."""

    hostname: str
    owner: EntryOwner
    adopt: str | None = None


class _RefNotFoundError(InvalidRequestError):
    """A WAPI ``_ref`` that no longer exists (404 / ``AdmConDataNotFoundError``)."""


class _UnknownEAError(InvalidRequestError):
    """The pool names an extensible attribute the grid has not defined."""


@dataclass(frozen=True)
class _Net:
    """One network of the pool, with its overrides."""

    index: int
    network: IPNetwork
    gateway: str | None
    prefix: int | None

    @property
    def cidr(self) -> str:
        return str(self.network)

    @property
    def v6(self) -> bool:
        return self.network.version == 6

    @property
    def family(self) -> str:
        return "ipv6" if self.v6 else "ipv4"

    @property
    def network_type(self) -> str:
        return "ipv6network" if self.v6 else "network"

    @property
    def address_type(self) -> str:
        return "ipv6address" if self.v6 else "ipv4address"

    @property
    def fixed_type(self) -> str:
        return "ipv6fixedaddress" if self.v6 else "fixedaddress"

    @property
    def prefixlen(self) -> int:
        return self.prefix if self.prefix is not None else self.network.prefixlen


@dataclass(frozen=True)
class _Entry:
    """One address of an entry (a host record or a fixed address), as WAPI listed it."""

    address: IPAddr
    ref: str
    net: _Net
    #: The WAPI object's ``name`` as stored (host records in DNS: the FQDN).
    name: str
    comment: str
    #: For host records: the whole host record (to rewrite its address lists).
    host_record: Mapping[str, Any] | None = None
    #: The owner the entry names (the owner EA, else the comment), or None.
    owner: EntryOwner | None = None
    #: The object's ``extattrs`` as WAPI returned them (read only with an owner EA).
    extattrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def quarantined_until(self) -> float | None:
        return quarantined_until(self.comment)


class InfobloxBackend:
    """`backends.base.IPAMBackend` for one pool's Infoblox NIOS networks over WAPI (``requests``).

    Host mode (``record_type="host"``) keeps one ``record:host`` per hostname; fixed-address
    mode keeps one ``fixedaddress`` (``ipv6fixedaddress`` for IPv6) per hostname. The pool's
    networks (``config.subnets``, 1-32, IPv4 and IPv6 may mix) are served in order: a new
    claim gets the next available IP of the first network that has one. Addresses come from
    next-available-IP inside the create request, so WAPI picks and writes the address in
    one step (WAPI documentation, https://ipam.illinois.edu/wapidoc/, "Function calls";
    never the racy ``_function=next_available_ip`` followed by a create,
    https://github.com/ansible/ansible/issues/45218):
    ``func:nextavailableip:<cidr>,<network view>``, or, when the network has a gateway, the
    object-function form that excludes it
    (``{"_object_function": "next_available_ip", "_object": "network"|"ipv6network",
    "_object_parameters": {"network", "network_view"}, "_result_field": "ips",
    "_parameters": {"num": 1, "exclude": [<gateway>...]}}``; infoblox-go-client
    ``IpNextAvailableInfo``, nios-go-client ``FuncCall``). WAPI skips the network and
    broadcast addresses and used addresses on its own, but not the DHCP ``routers`` option.
    A network WAPI reports full (400 "Cannot find 1 available IP address(es) in this
    network.") is skipped for the next one with no further request.

    Never handed out to a claim: the gateway of each network (its override and its
    ``routers`` option, read again before every create) and, for IPv4 below /31, the
    network and broadcast addresses. Should WAPI still return one, the entry just created
    is deleted and the attempt fails with `BackendUnavailableError` (retried by the policy);
    an entry of the hostname at such an address is removed before a new one is created,
    never adopted.

    Quarantine (`release` with ``quarantine_until``): the entry is renamed
    ``quarantined.<name>`` and its ``comment`` becomes `backends.base.quarantine_mark`
    (``PUT <_ref>``); it keeps its address, so next-available-IP skips it, until
    `purge_quarantined` deletes it.

    Ownership (`backends.base.EntryOwner`): every entry's ``comment`` is
    `backends.base.owner_text`; with `InfobloxConfig.owner_extensible_attribute` the EA of that
    name holds `owner_extattr_value` too (and is read first). An entry under a claim's
    hostname is adopted, released or purged only as `backends.base.may_adopt` allows; adopting
    one whose owner differs rewrites ``comment`` (and ``extattrs``, the object's own kept)
    with one ``PUT <_ref>``; another owner's entry raises `backends.errors.EntryOwnedError`.

    Authentication is HTTP Basic (UTF-8) on the first request; afterwards the ``ibapauth``
    session cookie the grid sets is sent instead (one session for all the pool's networks).
    A 401 drops the cookie and repeats the request once with Basic auth; a 401 to Basic
    auth raises `AuthenticationFailedError`. Requests with Basic auth go through the
    endpoint's login budget (a refused one counts).

    ``_ref`` values from WAPI are already URL-encoded (``ipv6fixedaddress/ZG5...:2001%3Adb8
    %3A%3A10/default``) and are sent as they are, never encoded a second time.

    Requests follow the WAPI 2.12 schema Infoblox generated from a grid (public repository
    infobloxopen/infoblox-swagger-wapi): only its search fields, return fields and body
    fields are sent (the unit tests check every request against it). Compared with
    Infoblox's own Python client ``infoblox-client`` 0.6.2 (``objects.py``,
    ``object_manager.py``): the same ``func:nextavailableip:<cidr>,<network view>`` string
    and host records searched by ``name`` and ``view``; its ``fixedaddress`` searchable
    fields lack ``name`` too, and it finds fixed addresses by ``ipv4addr``/``mac`` and
    ``network_view``. This client cannot search by address (a claim knows only its
    hostname; every fixed address it makes has the zero MAC), so it goes through the
    address view, ``ipv4address?names=``. It differs where a bounded, idempotent operator
    needs it: the object-function form of next-available-IP to exclude gateways in the
    same create (infoblox-client has no exclusion), ``network_view`` on every host record
    (infoblox-client omits it and relies on the DNS view's default), names lower-cased
    before every search, and every call bounded by the shared transport (one place of the
    endpoint, a time budget, a login budget) instead of infoblox-client's unbounded
    connector retries.

    Parameters
    ----------
    config:
        The pool's settings and credentials.
    session:
        The HTTP session to use (tests pass one); by default a new `requests.Session`.
        The backend owns it and closes it in `close`.
    endpoints:
        The operator's `backends.flowcontrol.FlowControl` (breaker, limit, login budget per
        endpoint); None gives this client one of its own.

    Notes
    -----
    Thread-safe: the session's cookie jar is only changed under a lock, and the cached
    gateways are read and written under a lock. Every public method is one operation of
    the shared `backends.transport.Transport` (bounded, in a place of the endpoint, under
    ``config.retry``) and raises only `backends.errors.BackendError` subclasses.

    """

    def __init__(
        self,
        config: InfobloxConfig,
        session: requests.Session | None = None,
        *,
        endpoints: FlowControl | None = None,
    ) -> None:
        self.config = config
        self._nets = tuple(
            _Net(
                index=index,
                network=ipaddress.ip_network(str(ref.cidr)),
                gateway=ref.gateway,
                prefix=ref.prefix,
            )
            for index, ref in enumerate(config.subnets)
        )
        self._transport = Transport.of(config, label="WAPI", endpoints=endpoints, session=session)
        self._session = self._transport.session
        self._basic = basic_auth(config.username, config.password)
        self._credential = credential_id(config.username, config.password)
        self._auth_lock = threading.Lock()
        self._gateway_lock = threading.Lock()
        #: ``routers`` gateway per network CIDR, once read.
        self._routers: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return (
            f"InfobloxBackend(endpoint={self.config.endpoint!r}, "
            f"subnets={[n.cidr for n in self._nets]!r}, "
            f"network_view={self.config.network_view!r}, record_type={self.config.record_type!r})"
        )

    # ----------------------------------------------------------------- public API

    def describe_subnets(self) -> list[SubnetInfo]:
        """Return each network's CIDR, prefix, gateway and live usage, in the pool's order.

        Per network: ``GET network`` (``ipv6network``) with ``_return_fields=network,
        network_view,options``, the used addresses counted with paged
        ``GET ipv4address|ipv6address?network=<cidr>&network_view=<view>&status=USED``, and
        the DHCP (and reserved) ranges with ``GET range|ipv6range?network=<cidr>&
        network_view=<view>``.

        Returns
        -------
        list of SubnetInfo
            ``prefix`` is the override, else the CIDR's; ``gateway`` the override, else the
            first value of the DHCP option ``routers`` (option 3) on the network, or None
            when the network does not set it (inherited options are not resolved);
            ``total`` is ``2**(bits - prefix)`` minus network and broadcast for IPv4
            prefixes below /31 and minus the subnet-router anycast address ``prefix::`` for
            IPv6 below /127 (next-available-IP hands none of them out); ``used`` counts
            every address inside a ``range``/``ipv6range`` (next-available-IP never hands
            those out, used or not), plus, outside the ranges, addresses WAPI reports
            ``USED`` (entries of anyone, quarantined ones included) and a gateway nothing
            registers; ``free = max(total - used, 0)``.

        Raises
        ------
        SubnetNotFoundError
            When a network of the pool does not exist in the network view (names it).
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        return self._transport.call(
            "describe_subnets", lambda: [self._describe_once(net) for net in self._nets]
        )

    def find(self, hostname: str) -> Allocation | None:
        """Return the address registered under ``hostname`` in the pool's networks, or None.

        Host mode: one search by name, ``GET record:host?name=<fqdn>&view=<dns view>`` when
        the pool has a DNS zone, else ``GET record:host?name=<hostname>&network_view=<view>``
        (entries outside DNS have no DNS view, WAPI reports ``view: " "``); the name is
        lower-cased, as NIOS stores DNS names. Fixed-address mode: ``name`` is not a search
        field of ``fixedaddress``/``ipv6fixedaddress`` (WAPI 2.12 schema), so
        ``GET ipv4address|ipv6address?names=<hostname>&network_view=<view>`` (``names`` is
        searchable there) lists the addresses held under that name with the ``_ref`` of
        each object (``objects``), and each fixed address among them is read with
        ``GET <_ref>`` (only those whose ``name`` is exactly ``hostname`` count; IPv6 only
        when the pool has an IPv6 network). Only addresses inside the
        pool's networks count; quarantined entries (a `backends.base.quarantine_mark`
        comment) and gateway, network or broadcast addresses are ignored; of several, the
        first network's, then the lowest address wins (WAPI exposes no creation order).

        Parameters
        ----------
        hostname:
            The claim's key (without the DNS zone).

        Returns
        -------
        Allocation or None
            ``hostname`` is the key given; ``ref`` the WAPI ``_ref`` of the entry;
            ``subnet``, ``prefix``, ``gateway`` those of the address's network;
            ``description`` the entry's ``comment``.

        Raises
        ------
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError
            And `SubnetNotFoundError` when the address's network is gone (its gateway is
            read from it).

        """
        return self._transport.call("find", lambda: self._find_once(hostname))

    def allocate(
        self,
        hostname: str,
        owner: EntryOwner,
        address: str | None = None,
        *,
        adopt: str | None = None,
    ) -> Allocation:
        """Register an address under ``hostname``: the requested one, or the next available.

        Looks the hostname up first (as `find`) and returns the existing entry when
        `backends.base.may_adopt` (entry, ``owner``, ``adopt``) allows it (adoption, and a
        repeat after a lost answer never creates a second entry); with ``address`` only an
        entry at that address counts. When the adopted entry's owner is not ``owner`` (a
        reservation, an entry of the previous release, a moved one), one ``PUT <_ref>``
        with ``comment`` (`backends.base.owner_text`) and, with an owner EA, ``extattrs``
        (the object's EAs with the owner EA set: WAPI's ``extattrs`` replaces them all)
        rewrites it. An entry of another owner raises `EntryOwnedError`, unchanged.

        Next available (``address`` None): for each network in order, ONE create:
        ``POST record:host`` with ``ipv4addrs``/``ipv6addrs`` ``[{"ipv4addr":
        "func:nextavailableip:<cidr>,<view>", "configure_for_dhcp": false}]``, or
        ``POST fixedaddress``/``ipv6fixedaddress`` with the function as the address, MAC
        ``00:00:00:00:00:00`` (IPv6: a DUID derived from the hostname), ``comment`` (the
        owner text, cut to 256 characters) and ``extattrs`` (the pool's, plus the owner EA
        when `InfobloxConfig.owner_extensible_attribute` is set); ``_return_fields`` brings the
        address back in the same answer. A network WAPI answers full is skipped.

        Requested address: refused at once when it lies outside every network of the pool
        or is a gateway, network or broadcast address. Else ``GET ipv4address|ipv6address?
        ip_address=<a>&network_view=<view>`` tells whether anything uses it (the holder is
        its first ``names`` entry); the create carries the explicit ``ipv4addr``/``ipv6addr``
        (a fixed address WAPI refuses with ``Client.Ibap.Data.Conflict`` when another holds
        it); a host record, which WAPI accepts on a used address, is checked once more
        after the create and deleted again when another object shares the address.

        Parameters
        ----------
        hostname:
            The claim's key; with a DNS zone the entry is ``<hostname>.<zone>``.
        owner:
            This management cluster and the claim, stored as the ``comment`` (and the owner EA).
        address:
            A requested IPv4 or IPv6 address, or None for the next available one.
        adopt:
            The address the claim's IPAddress already names, or None.

        Returns
        -------
        Allocation
            The address, its network's prefix, gateway and CIDR, ``hostname``, the entry's
            ``_ref`` and comment; ``owner`` is ``owner``.

        Raises
        ------
        EntryOwnedError
            The entry under ``hostname`` names another cluster or claim; nothing changed.
        SubnetExhaustedError
            Next available only: WAPI answered "Cannot find 1 available IP address(es)" for
            every network of the pool.
        AddressUnavailableError
            ``address`` is used (``holder`` is the name WAPI lists for it), outside every
            network of the pool, a gateway, network or broadcast address, or ``hostname``
            already holds another address of the pool; nothing was registered.
        SubnetNotFoundError
            A network tried does not exist in the network view.
        InvalidRequestError
            An undefined extensible attribute, or (host mode) the name is already used in
            the view by a DNS record that holds no address of the pool: a person must rename
            or remove that DNS record.
        ConflictError
            A lost race for an address (retried by the policy, which looks up again first):
            a ``Client.Ibap.Data.Conflict`` whose text says "already exists" / "already in
            use". Any other ``Client.Ibap.Data.Conflict`` (an extensible attribute not
            allowed for the object, superuser-only EA definitions, a member assigned to
            another network view) is an `InvalidRequestError` with the grid's text, and a
            404 on the create (an unknown DNS view, network view or zone) too.
        AuthenticationFailedError, BackendUnavailableError

        """
        claim = _Claim(hostname, owner, adopt)
        return self._transport.call("allocate", lambda: self._allocate_once(claim, address))

    def release(
        self,
        hostname: str,
        owner: EntryOwner,
        quarantine_until: float | None = None,
        *,
        address: str | None = None,
    ) -> bool:
        """Remove (or quarantine) the addresses under ``hostname`` that ``owner`` may release.

        Only entries `backends.base.may_adopt` (entry, ``owner``, ``address``) allows; another
        owner's entry is left alone (logged at INFO). The quarantine mark precedes the former
        comment, so the owner stays readable (and the owner EA is kept).

        Without ``quarantine_until``: ``DELETE <_ref>`` of each matching fixed address or
        host record. A host record that also holds addresses outside the pool (one a person
        registered) is not deleted: only the pool's addresses are removed from it with
        ``PUT <_ref>``. A 404 / ``AdmConDataNotFoundError`` (already gone) is success.

        With ``quarantine_until`` (Unix time, seconds): ``PUT <_ref>`` with ``name``
        ``quarantined.<name>`` and ``comment`` ``quarantine_mark(quarantine_until, <former
        comment>)`` (cut to 256 characters, the mark kept). When a quarantined host record
        of that name already exists in the view (host names are unique), the addresses are
        added to it (its quarantine then ends at the later of both times) and this entry is
        deleted. A host record holding addresses outside the pool only loses the pool's
        addresses, without quarantine (logged).

        Quarantined entries are never touched (they are not found by name).

        Returns
        -------
        bool
            True when something of ``owner`` was registered (and is now gone or
            quarantined), False when nothing was.

        Raises
        ------
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        claim = _Claim(hostname, owner, address)
        return self._transport.call("release", lambda: self._release_once(claim, quarantine_until))

    def purge_quarantined(self, now: float, cluster_id: str) -> list[str]:
        """Delete the quarantined entries of ``cluster_id`` whose quarantine ended.

        Host mode: one paged search for the quarantined host records of the pool's view,
        ``GET record:host?name~=^quarantined[.]&view=<dns view>`` (``network_view=<view>``
        without a DNS zone; ``name`` is searchable, with the regular-expression modifier),
        whatever the number of live entries. Fixed-address mode: each network's fixed
        addresses as `entries` lists them. Then ``DELETE <_ref>`` for each entry of the
        pool's networks whose `backends.base.quarantined_until` is ``<= now`` (Unix time,
        seconds) and whose owner's cluster is ``cluster_id`` or ``""`` (the previous
        release; a mark without a readable owner counts as that). Idempotent: an entry
        already gone is success.

        Returns
        -------
        list of str
            The addresses (of the pool's networks) the deleted entries held.

        Raises
        ------
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        return self._transport.call("purge_quarantined", lambda: self._purge_once(now, cluster_id))

    def entries(self) -> list[Allocation]:
        """Return every entry in the pool's networks, whoever registered it.

        Per network, paged (``_paging=1``, 1000 a page): fixed-address mode ``GET
        fixedaddress|ipv6fixedaddress?network=<cidr>&network_view=<view>``; host mode
        ``GET ipv4address|ipv6address?network=<cidr>&network_view=<view>&status=USED&
        _return_fields=ip_address,objects`` (``network`` is not a search field of
        ``record:host`` at WAPI 2.12), then ``GET <_ref>?_return_fields=name,view,comment,
        ipv4addrs,ipv6addrs`` for each host record named in ``objects`` (once per host record).
        Objects of other types (A records, leases, fixed addresses in host mode) are not
        listed.

        Returns
        -------
        list of Allocation
            Per network in the pool's order, by address: ``hostname`` is the entry name
            without the pool's DNS zone (``quarantined.<hostname>`` for quarantined
            entries), ``description`` the ``comment``, ``quarantined_until`` from the mark,
            ``subnet``, ``prefix`` and ``gateway`` those of the network (the gateway needs
            the network's ``routers`` option, read once).

        Raises
        ------
        SubnetNotFoundError
            When a network is gone (its gateway is read from it).
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        return self._transport.call("entries", self._entries_once)

    def close(self) -> None:
        """Log out (``POST logout``, best effort, with a session cookie only); close the session."""
        try:
            if self._auth_cookie() is not None:
                self._transport.request("POST", self._url("logout"), what="POST logout")
        except BackendError as exc:
            log.debug("infoblox logout failed: %s", exc)
        finally:
            self._session.close()

    # ----------------------------------------------------------------- read-only check

    def first_free(self) -> str | None:
        """Return the address a first-free `allocate` would take now, without taking it.

        Read-only (``ipam-bridge check-pool``): per network in the pool's order, the
        network's ``routers`` option (``GET network?network=<cidr>&network_view=<view>``)
        and its used addresses (``GET ipv4address|ipv6address?network=<cidr>&
        network_view=<view>&status=USED``, as `describe_subnets` reads them), then the lowest
        address that is neither used nor never handed out (gateways; network and broadcast
        of an IPv4 network below /31). Any record type counts as used (A records, leases,
        fixed addresses), as it does for WAPI's ``next_available_ip``.

        Returns
        -------
        str or None
            The address as text, or None when every network of the pool is full.

        Raises
        ------
        SubnetNotFoundError
            When a network of the pool does not exist.
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError
        """
        return self._transport.call("first_free", self._first_free_once)

    def _first_free_once(self) -> str | None:
        for net in self._nets:
            taken = self._used_addresses(net) | self._never_assigned(
                net, self._refresh_gateway(net)
            )
            # Each address skipped is in `taken`: at most len(taken) + 1 steps per network.
            for address in net.network:
                if address not in taken:
                    return str(address)
        return None

    # ----------------------------------------------------------------- operations

    def _describe_once(self, net: _Net) -> SubnetInfo:
        routers = self._refresh_gateway(net)
        total = _capacity(net.network)
        # Addresses inside DHCP (and reserved) ranges are never handed out by
        # next-available-IP, and neither is a gateway nobody registered.
        spans = self._range_spans(net)
        outside = {
            a
            for a in self._used_addresses(net) | self._gateways(net, routers)
            if not any(lo <= int(a) <= hi for lo, hi in spans)
        }
        used = len(outside) + sum(hi - lo + 1 for lo, hi in spans)
        return SubnetInfo(
            cidr=net.cidr,
            prefix=net.prefixlen,
            gateway=net.gateway or routers,
            total=total,
            used=used,
            free=max(total - used, 0),
        )

    def _find_once(self, hostname: str) -> Allocation | None:
        usable = self._usable(self._search(hostname))
        return self._allocation(hostname, usable[0]) if usable else None

    def _usable(self, entries: list[_Entry]) -> list[_Entry]:
        """Return the entries that may be a claim's address, best first.

        Not quarantined, not a gateway, network or broadcast address; sorted by the pool's
        network order, then address.
        """
        out = []
        for entry in entries:
            if entry.quarantined_until is not None:
                continue
            if entry.address in self._never_assigned(entry.net, self._cached_gateway(entry.net)):
                continue
            out.append(entry)
        return sorted(out, key=lambda e: (e.net.index, int(e.address)))

    def _allocate_once(self, claim: _Claim, address: str | None) -> Allocation:
        hostname = claim.hostname
        live = [e for e in self._search(hostname) if e.quarantined_until is None]
        usable = self._usable(live)
        mine = [e for e in usable if self._adoptable(e, claim)]
        if usable and not mine:
            raise self._owned(usable[0], claim)
        if address is not None:
            return self._allocate_address(claim, address, live, mine)
        if mine:
            existing = self._take_over(mine[0], claim)
            log.debug("infoblox: %s already holds %s", hostname, existing.address)
            return existing
        live = [e for e in live if self._adoptable(e, claim)]
        if live:
            # Only addresses that are never assigned (an entry left by an attempt interrupted
            # below, or by a client that did not skip them): ours to remove, never to adopt.
            self._remove_entries(hostname, live)
        full: SubnetExhaustedError | None = None
        for net in self._nets:
            # The routers option as WAPI holds it: what next-available-IP must skip.
            routers = self._refresh_gateway(net)
            value = self._next_available(net, self._gateways(net, routers))
            try:
                entry = self._create_or_explain(claim, net, value)
            except SubnetExhaustedError as exc:
                log.debug("infoblox: %s is full; trying the next network", net.cidr)
                full = exc
                continue
            if entry.net is net and entry.address in self._never_assigned(net, routers):
                self._remove_entries(hostname, [entry])
                raise BackendUnavailableError(
                    f"WAPI handed out {entry.address} of {net.cidr}, which is never assigned "
                    "(the gateway, network or broadcast address); the entry was removed"
                )
            allocation = self._take_over(entry, claim)
            log.debug("infoblox: allocated %s to %s in %s", allocation.address, hostname, net.cidr)
            return allocation
        raise SubnetExhaustedError(
            f"no free address in any network of the pool ({self._pool_description()})"
            + (f": {full.message}" if full is not None else ""),
            status=full.status if full is not None else None,
        )

    def _allocate_address(
        self,
        claim: _Claim,
        address: str,
        live: list[_Entry],
        usable: list[_Entry],
    ) -> Allocation:
        """Register the requested ``address`` (see `allocate`); ``usable`` are adoptable."""
        hostname = claim.hostname
        ip = _parse_address(address.strip())
        if ip is None:
            raise AddressUnavailableError(
                f"requested address {address!r} is not an IP address", address=address
            )
        net = self._net_of(ip)
        if net is None:
            raise AddressUnavailableError(
                f"requested address {ip} lies outside every network of the pool "
                f"({self._pool_description()})",
                address=str(ip),
            )
        for entry in usable:
            if entry.address == ip:
                return self._take_over(entry, claim)
        routers = self._refresh_gateway(net)
        if ip in self._never_assigned(net, routers):
            raise AddressUnavailableError(
                f"requested address {ip} is the gateway, network or broadcast address of "
                f"{net.cidr} and is never handed out",
                address=str(ip),
            )
        if usable:
            raise AddressUnavailableError(
                f"cannot register {ip} under {hostname}: {hostname} already holds "
                f"{usable[0].address} in the pool; release that address or drop the request",
                address=str(ip),
            )
        live = [e for e in live if self._adoptable(e, claim)]
        if live:
            self._remove_entries(hostname, live)  # never-assigned leftovers, as next-available
        used, names, _ = self._address_use(net, ip)
        if used:
            raise self._held(ip, names[0] if names else None)
        try:
            entry = self._create_or_explain(claim, net, str(ip))
        except ConflictError as exc:
            # A fixed address WAPI refuses on a used address (or a lost race for it).
            _, names, _ = self._address_use(net, ip)
            raise self._held(ip, names[0] if names else None, status=exc.status) from exc
        if entry.address != ip:
            raise AddressUnavailableError(
                f"cannot register {ip} under {hostname}: another writer registered "
                f"{hostname} at {entry.address} meanwhile",
                address=str(ip),
            )
        if self.config.record_type == "host":
            # WAPI accepts a host record on a used address: make sure nobody else got it.
            _, names, objects = self._address_use(net, ip)
            mine = _ref_id(entry.ref)
            if any(_ref_id(o) != mine for o in objects):
                self._remove_entries(hostname, [entry])
                other = next((n for n in names if n.casefold() != entry.name.casefold()), None)
                raise self._held(ip, other)
        allocation = self._take_over(entry, claim)
        log.debug("infoblox: registered requested %s to %s in %s", ip, hostname, net.cidr)
        return allocation

    def _held(self, ip: IPAddr, holder: str | None, status: int | None = None) -> BackendError:
        by = f" by {holder}" if holder else ""
        if holder and holder.startswith(QUARANTINE_PREFIX):
            by += " (a released address in its reuse grace period)"
        return AddressUnavailableError(
            f"requested address {ip} is already used{by}",
            address=str(ip),
            holder=holder,
            status=status,
        )

    def _create_or_explain(self, claim: _Claim, net: _Net, value: str | dict[str, Any]) -> _Entry:
        """Create the entry; turn WAPI's errors into what they mean for this pool."""
        hostname = claim.hostname
        try:
            return self._create(hostname, claim.owner, net, value)
        except ConflictError as exc:
            if self.config.record_type != "host":
                raise  # fixedaddress names are not unique: this is a lost address race
            again = self._usable([e for e in self._search(hostname) if e.quarantined_until is None])
            if again:
                # Another writer registered the same name meanwhile.
                if not self._adoptable(again[0], claim):
                    raise self._owned(again[0], claim) from exc
                return again[0]
            name = self._wapi_name(hostname)
            if name.lower() in exc.message.lower():
                raise InvalidRequestError(
                    f"the name {name!r} is already used by another record in "
                    f"{self._view_description()} that holds no address of the pool "
                    f"({self._pool_description()}); rename or remove that record "
                    f"({exc.message})",
                    status=exc.status,
                ) from exc
            raise
        except InvalidRequestError as exc:
            if isinstance(exc, _RefNotFoundError | _UnknownEAError) or not self._network_missing(
                net
            ):
                raise
            raise self._subnet_not_found(net) from exc

    def _adoptable(self, entry: _Entry, claim: _Claim) -> bool:
        """Return True when `backends.base.may_adopt` gives ``entry`` to the claim."""
        found = Allocation(str(entry.address), 0, None, entry.name, entry.ref, owner=entry.owner)
        return may_adopt(found, claim.owner, claim.adopt)

    def _owned(self, entry: _Entry, claim: _Claim) -> EntryOwnedError:
        owner = entry.owner or claim.owner  # never None here: an unowned entry is adoptable
        return EntryOwnedError(
            f"infoblox: {entry.name} ({entry.address}) belongs to claim {owner}; it is not adopted",
            hostname=claim.hostname,
            address=str(entry.address),
            owner=owner,
        )

    def _take_over(self, entry: _Entry, claim: _Claim) -> Allocation:
        """Return an adoptable entry as the claim's; rewrite its owner when it differs.

        When its comment is not the claim's `backends.base.owner_text` (or its owner EA not
        the claim's): one ``PUT <_ref>`` with ``comment`` (and ``extattrs`` with an owner
        EA); an object gone meanwhile is a lost race, retried.
        """
        ea = self.config.owner_extensible_attribute
        stored = entry.extattrs.get(ea) if ea else None
        stale_ea = ea is not None and (
            not isinstance(stored, Mapping)
            or stored.get("value") != owner_extattr_value(claim.owner)
        )
        comment = owner_text(claim.owner)[:MAX_COMMENT]
        if entry.comment != comment or stale_ea:
            body: dict[str, Any] = {"comment": comment}
            if ea is not None:
                body["extattrs"] = self._extattrs(claim.owner, entry.extattrs)
            try:
                self._call_json("PUT", entry.ref, json=body)
            except _RefNotFoundError:
                raise ConflictError(f"infoblox: {entry.ref} went away; retrying") from None
            log.info(
                "infoblox: %s (%s) now names its owner %s (was %s)",
                entry.name,
                entry.address,
                claim.owner,
                entry.owner or "none",
            )
        return replace(self._allocation(claim.hostname, entry), owner=claim.owner)

    def _release_once(self, claim: _Claim, until: float | None) -> bool:
        hostname = claim.hostname
        entries = []
        for entry in self._search(hostname):
            if entry.quarantined_until is not None:
                continue
            if self._adoptable(entry, claim):
                entries.append(entry)
            else:
                log.info(
                    "infoblox: left %s (%s) alone: it belongs to claim %s",
                    entry.name,
                    entry.address,
                    entry.owner,
                )
        if not entries:
            return False
        if until is None:
            self._remove_entries(hostname, entries)
        else:
            self._quarantine(hostname, entries, until)
        return True

    def _quarantine(self, hostname: str, entries: list[_Entry], until: float) -> None:
        """Rename and mark the WAPI objects of ``entries`` (see `release`)."""
        for ref, group in _by_ref(entries).items():
            first = group[0]
            if first.host_record is not None and self._has_other_addresses(first.host_record):
                log.warning(
                    "infoblox: %s also holds addresses outside the pool; releasing %s from "
                    "it without quarantine",
                    first.name,
                    ", ".join(str(e.address) for e in group),
                )
                self._remove_addresses(ref, first.host_record)
                continue
            name = QUARANTINE_PREFIX + first.name
            body = {"name": name, "comment": quarantine_mark(until, first.comment)[:MAX_COMMENT]}
            try:
                self._call_json("PUT", ref, json=body)
            except _RefNotFoundError:
                log.debug("infoblox: %s was already gone", ref)
                continue
            except ConflictError:
                if first.host_record is None:
                    raise
                self._merge_quarantined(first, name, until)
            log.debug(
                "infoblox: quarantined %s of %s until %d (Unix time)",
                ", ".join(str(e.address) for e in group),
                hostname,
                int(until),
            )

    def _merge_quarantined(self, entry: _Entry, name: str, until: float) -> None:
        """Add a host record's addresses to the quarantined host record ``name``; delete it."""
        params = [
            ("name", name),
            *self._host_scope(),
            ("_return_fields", self._fields(_HOST_FIELDS)),
        ]
        found = self._get_list("record:host", params)
        host_record = entry.host_record
        if not found or host_record is None:
            raise ConflictError(f"WAPI refused to rename {entry.name} to {name}; retrying")
        target = found[0]
        later = max(until, quarantined_until(str(target.get("comment") or "")) or 0.0)
        body: dict[str, Any] = {
            "comment": quarantine_mark(later, str(host_record.get("comment") or ""))[:MAX_COMMENT]
        }
        for family in ("ipv4", "ipv6"):
            # By address: a repeat after a lost answer must not add an address twice.
            items: dict[str, dict[str, Any]] = {}
            for source in (target, host_record):
                for item in source.get(f"{family}addrs") or []:
                    if isinstance(item, dict):
                        items.setdefault(
                            str(item.get(f"{family}addr")),
                            {k: v for k, v in item.items() if k not in ("_ref", "host")},
                        )
            if items:
                body[f"{family}addrs"] = list(items.values())
        self._call_json("PUT", str(target["_ref"]), json=body)
        self._delete(entry.ref)

    def _purge_once(self, now: float, cluster_id: str) -> list[str]:
        if self.config.record_type == "host":
            params = [
                ("name~", "^" + QUARANTINE_PREFIX.replace(".", "[.]")),
                *self._host_scope(),
                ("_return_fields", self._fields(_HOST_FIELDS)),
            ]
            marked = self._host_entries(list(self._paged("record:host", params)), None)
        else:
            marked = [e for net in self._nets for e in self._list_network(net)]
        ended = [
            e
            for e in marked
            if (until := e.quarantined_until) is not None
            and until <= now
            and (e.owner is None or e.owner.cluster_id in ("", cluster_id))
        ]
        deleted: list[str] = []
        for ref, group in _by_ref(ended).items():
            self._delete(ref)
            addresses = [str(e.address) for e in group]
            deleted.extend(addresses)
            log.info("infoblox: quarantine of %s ended; deleted %s", ", ".join(addresses), ref)
        return deleted

    def _entries_once(self) -> list[Allocation]:
        out: list[Allocation] = []
        for net in self._nets:
            for entry in sorted(self._list_network(net), key=lambda e: int(e.address)):
                out.append(
                    self._allocation(
                        self._hostname_of(entry.name),
                        entry,
                        quarantined=entry.quarantined_until,
                    )
                )
        return out

    def _remove_entries(self, hostname: str, entries: list[_Entry]) -> None:
        """Delete the WAPI objects of ``entries``.

        A host record that also holds addresses outside the pool keeps them: only the pool's
        addresses are removed from it.
        """
        for ref, group in _by_ref(entries).items():
            host_record = group[0].host_record
            if host_record is not None and self._has_other_addresses(host_record):
                self._remove_addresses(ref, host_record)
            else:
                self._delete(ref)
            log.debug(
                "infoblox: released %s from %s",
                ", ".join(str(e.address) for e in group),
                hostname,
            )

    # ----------------------------------------------------------------- WAPI objects

    def _fields(self, fields: str) -> str:
        """``_return_fields`` with ``extattrs`` added when the pool names an owner EA."""
        return fields + ",extattrs" if self.config.owner_extensible_attribute else fields

    def _extattrs(
        self, owner: EntryOwner, current: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Return the ``extattrs`` of an entry of ``owner``: ``current``, the pool's, the owner EA.

        WAPI's ``extattrs`` in a PUT replaces every EA of the object, so the object's own
        (``current``) are kept.
        """
        extattrs: dict[str, Any] = {
            name: {"value": item["value"]}
            for name, item in (current or {}).items()
            if isinstance(item, Mapping) and "value" in item
        }
        for name, value in self.config.extensible_attributes.items():
            extattrs[name] = {"value": value}
        if self.config.owner_extensible_attribute:
            extattrs[self.config.owner_extensible_attribute] = {"value": owner_extattr_value(owner)}
        return extattrs

    def _owner_of(self, obj: Mapping[str, Any]) -> EntryOwner | None:
        """Return the owner a WAPI object names: its owner EA, else its comment."""
        ea = self.config.owner_extensible_attribute
        extattrs = obj.get("extattrs")
        if ea and isinstance(extattrs, Mapping) and isinstance(extattrs.get(ea), Mapping):
            owner = parse_owner(f"{OWNER_PREFIX} {extattrs[ea].get('value') or ''}")
            if owner is not None:
                return owner
        return parse_owner(str(obj.get("comment") or ""))

    def _host_scope(self) -> list[tuple[str, str]]:
        """Search arguments that scope host records to the pool's DNS or network view."""
        if self.config.dns_zone:
            return [("view", self.config.dns_view)]
        return [("network_view", self.config.network_view)]

    def _search(self, hostname: str) -> list[_Entry]:
        """Every entry of the pool's networks named ``hostname``."""
        if self.config.record_type == "host":
            params = [("name", self._wapi_name(hostname)), *self._host_scope()]
            params.append(("_return_fields", self._fields(_HOST_FIELDS)))
            return self._host_entries(self._get_list("record:host", params), None)
        entries: list[_Entry] = []
        for v6 in self._families():
            fixed_type, addr_field = _fixed_names(v6)
            # ``name`` is not a search field of fixedaddress/ipv6fixedaddress: the address
            # view lists every object by name (``names`` is searchable) with its refs.
            found = self._get_list(
                "ipv6address" if v6 else "ipv4address",
                [
                    ("names", hostname),
                    ("network_view", self.config.network_view),
                    ("_return_fields", "ip_address,names,objects"),
                ],
            )
            fields = self._fields(f"name,comment,{addr_field},network_view")
            objects = [
                obj
                for ref in self._object_refs(found, fixed_type)
                if (obj := self._read(ref, fields)) is not None and obj.get("name") == hostname
            ]
            entries.extend(self._fixed_entries(objects, addr_field, None))
        return entries

    def _object_refs(self, items: Iterable[Mapping[str, Any]], obj_type: str) -> list[str]:
        """Return the ``_ref`` of each ``obj_type`` object an address-view answer lists.

        In order; only addresses inside the pool's networks count; each ref appears once.
        """
        refs: dict[str, None] = {}
        for item in items:
            address = _parse_address(item.get("ip_address"))
            if address is None or self._net_of(address) is None:
                continue
            for ref in item.get("objects") or []:
                if isinstance(ref, str) and ref.startswith(obj_type + "/"):
                    refs.setdefault(ref)
        return list(refs)

    def _read(self, ref: str, fields: str) -> dict[str, Any] | None:
        """``GET <ref>`` with ``_return_fields``; None when the object is gone meanwhile."""
        try:
            answer = self._call_json("GET", ref, params=[("_return_fields", fields)])
        except _RefNotFoundError:
            return None
        if isinstance(answer, dict) and "_ref" not in answer:
            answer = answer.get("result")
        return answer if isinstance(answer, dict) and "_ref" in answer else None

    def _list_network(self, net: _Net) -> list[_Entry]:
        """Every entry in ``net`` (see `entries`)."""
        scope = [("network", net.cidr), ("network_view", self.config.network_view)]
        if self.config.record_type == "host":
            # ``network`` is not a search field of record:host at WAPI 2.12: the address
            # view of the network lists the host records that use its addresses.
            used = self._paged(
                net.address_type,
                [*scope, ("status", "USED"), ("_return_fields", "ip_address,objects")],
            )
            host_records = [
                host_record
                for ref in self._object_refs(used, "record:host")
                if (host_record := self._read(ref, self._fields(_HOST_FIELDS))) is not None
            ]
            return self._host_entries(host_records, net)
        fixed_type, addr_field = _fixed_names(net.v6)
        fields = ("_return_fields", self._fields(f"name,comment,{addr_field},network_view"))
        return self._fixed_entries(list(self._paged(fixed_type, [*scope, fields])), addr_field, net)

    def _host_entries(self, host_records: list[dict[str, Any]], only: _Net | None) -> list[_Entry]:
        """Return an entry per address of each host record (in ``only``, else in the pool)."""
        entries = []
        for host_record in host_records:
            for family in ("ipv4", "ipv6"):
                for item in host_record.get(f"{family}addrs") or []:
                    if not isinstance(item, dict):
                        continue
                    address = _parse_address(item.get(f"{family}addr"))
                    net = self._net_of(address) if address is not None else None
                    if address is None or net is None or (only is not None and net is not only):
                        continue
                    entries.append(
                        _Entry(
                            address=address,
                            ref=str(host_record["_ref"]),
                            net=net,
                            name=str(host_record.get("name") or ""),
                            comment=str(host_record.get("comment") or ""),
                            host_record=host_record,
                            owner=self._owner_of(host_record),
                            extattrs=_extattrs_of(host_record),
                        )
                    )
        return entries

    def _fixed_entries(
        self, objects: list[dict[str, Any]], addr_field: str, only: _Net | None
    ) -> list[_Entry]:
        """Return an entry per fixed address (in ``only``, else in the pool's networks)."""
        entries = []
        for obj in objects:
            address = _parse_address(obj.get(addr_field))
            net = self._net_of(address) if address is not None else None
            if address is None or net is None or (only is not None and net is not only):
                continue
            entries.append(
                _Entry(
                    address=address,
                    ref=str(obj["_ref"]),
                    net=net,
                    name=str(obj.get("name") or ""),
                    comment=str(obj.get("comment") or ""),
                    owner=self._owner_of(obj),
                    extattrs=_extattrs_of(obj),
                )
            )
        return entries

    def _create(
        self, hostname: str, owner: EntryOwner, net: _Net, value: str | dict[str, Any]
    ) -> _Entry:
        body: dict[str, Any] = {
            "name": self._wapi_name(hostname),
            "comment": owner_text(owner)[:MAX_COMMENT],
        }
        family = net.family
        if self.config.record_type == "host":
            body[f"{family}addrs"] = [{f"{family}addr": value, "configure_for_dhcp": False}]
            # The entry's own network_view places it: the view named in
            # func:nextavailableip only picks the address.
            body["network_view"] = self.config.network_view
            if self.config.dns_zone:
                body["configure_for_dns"] = True
                body["view"] = self.config.dns_view
            else:
                body["configure_for_dns"] = False
            obj_type, return_fields = "record:host", f"name,comment,{family}addrs"
        else:
            obj_type = net.fixed_type
            body["network_view"] = self.config.network_view
            body[f"{family}addr"] = value
            if net.v6:
                body["duid"] = _duid_for(hostname)
            else:
                body["mac"] = ZERO_MAC
            return_fields = f"name,comment,{family}addr,network_view"
        return_fields = self._fields(return_fields)
        extattrs = self._extattrs(owner)
        if extattrs:
            body["extattrs"] = extattrs
        answer = self._call_json(
            "POST", obj_type, params=[("_return_fields", return_fields)], json=body
        )
        if (
            isinstance(answer, dict)
            and "_ref" not in answer
            and isinstance(answer.get("result"), dict | str)
        ):
            answer = answer["result"]  # _return_as_object=1 shape
        if isinstance(answer, str):
            # A grid that ignored _return_fields answered with the bare _ref: read it back.
            answer = self._call_json("GET", answer, params=[("_return_fields", return_fields)])
        if not isinstance(answer, dict) or "_ref" not in answer:
            raise BackendUnavailableError(
                f"WAPI answered the {obj_type} create with an unexpected body"
            )
        # What this create wrote, whatever the answer echoes (a grid may leave fields out).
        answer["comment"] = body["comment"]
        if "extattrs" in body:
            answer["extattrs"] = body["extattrs"]
        if self.config.record_type == "host":
            entries = self._host_entries([answer], net)
        else:
            entries = self._fixed_entries([answer], f"{family}addr", net)
        if not entries:
            raise BackendUnavailableError(
                f"WAPI created {answer['_ref']!r} but returned no address of {net.cidr}"
            )
        return entries[0]

    def _address_use(self, net: _Net, ip: IPAddr) -> tuple[bool, list[str], list[str]]:
        """Return whether WAPI reports ``ip`` used, its ``names`` and its ``objects``.

        ``GET ipv4address|ipv6address?ip_address=<ip>&network_view=<view>``.
        """
        found = self._get_list(
            net.address_type,
            [
                ("ip_address", str(ip)),
                ("network_view", self.config.network_view),
                ("_return_fields", "ip_address,status,names,objects,types"),
            ],
        )
        if not found:
            return False, [], []
        item = found[0]
        names = [str(n) for n in item.get("names") or [] if n]
        objects = [str(o) for o in item.get("objects") or [] if o]
        return item.get("status") == "USED", names, objects

    def _delete(self, ref: str) -> None:
        try:
            self._call_json("DELETE", ref)
        except _RefNotFoundError:
            log.debug("infoblox: %s was already gone", ref)

    def _remove_addresses(self, ref: str, host_record: Mapping[str, Any]) -> None:
        """``PUT`` the host record with only its addresses outside the pool's networks."""
        body: dict[str, Any] = {}
        for family in ("ipv4", "ipv6"):
            items = host_record.get(f"{family}addrs")
            if not items:
                continue
            kept = []
            for item in items:
                address = _parse_address(item.get(f"{family}addr"))
                if address is not None and self._net_of(address) is not None:
                    continue
                kept.append({k: v for k, v in item.items() if k not in ("_ref", "host")})
            body[f"{family}addrs"] = kept
        try:
            self._call_json("PUT", ref, json=body)
        except _RefNotFoundError:
            log.debug("infoblox: %s was already gone", ref)

    def _get_network(self, net: _Net) -> dict[str, Any]:
        networks = self._get_list(
            net.network_type,
            [
                ("network", net.cidr),
                ("network_view", self.config.network_view),
                ("_return_fields", "network,network_view,options"),
            ],
        )
        if not networks:
            raise self._subnet_not_found(net)
        return networks[0]

    def _network_missing(self, net: _Net) -> bool:
        try:
            self._get_network(net)
        except SubnetNotFoundError:
            return True
        except BackendError:
            return False
        return False

    def _range_spans(self, net: _Net) -> list[tuple[int, int]]:
        """Return the network's ``range``/``ipv6range`` objects as ``(first, last)`` ints.

        ``GET range|ipv6range?network=<cidr>&network_view=<view>``; clipped to the addresses
        next-available-IP could hand out, merged where they overlap, sorted.
        """
        items = self._get_list(
            "ipv6range" if net.v6 else "range",
            [
                ("network", net.cidr),
                ("network_view", self.config.network_view),
                ("_return_fields", "start_addr,end_addr"),
            ],
        )
        first, last = _host_bounds(net.network)
        spans: list[tuple[int, int]] = []
        for item in items:
            start = _parse_address(item.get("start_addr"))
            end = _parse_address(item.get("end_addr"))
            if start is None or end is None:
                continue
            lo, hi = max(int(start), first), min(int(end), last)
            if lo <= hi:
                spans.append((lo, hi))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return merged

    def _used_addresses(self, net: _Net) -> set[IPAddr]:
        """Addresses WAPI reports ``USED`` in the network, without network and broadcast."""
        params = [
            ("network", net.cidr),
            ("network_view", self.config.network_view),
            ("status", "USED"),
            ("_return_fields", "ip_address,types"),
        ]
        skip = {"NETWORK", "BROADCAST"}
        used: set[IPAddr] = set()
        for item in self._paged(net.address_type, params):
            if skip.intersection(item.get("types") or ()):
                continue
            address = _parse_address(item.get("ip_address"))
            if address is None:
                raise BackendUnavailableError(
                    f"WAPI listed a used address of {net.cidr} without ip_address"
                )
            if _in_hosts(address, net.network):
                used.add(address)
        return used

    def _paged(self, obj_type: str, params: list[tuple[str, str]]) -> Iterator[dict[str, Any]]:
        """Yield every result of a search, page by page (``_paging=1``, ``next_page_id``)."""
        paging = [
            ("_paging", "1"),
            ("_max_results", str(PAGE_SIZE)),
            ("_return_as_object", "1"),
        ]
        page_id: str | None = None
        while True:
            query = params + paging + ([("_page_id", page_id)] if page_id else [])
            answer = self._call_json("GET", obj_type, params=query)
            if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
                raise BackendUnavailableError(f"WAPI answered a paged {obj_type} search oddly")
            yield from (item for item in answer["result"] if isinstance(item, dict))
            next_id = answer.get("next_page_id")
            if not next_id or next_id == page_id:
                return
            page_id = str(next_id)

    def _get_list(self, obj_type: str, params: list[tuple[str, str]]) -> list[dict[str, Any]]:
        answer = self._call_json("GET", obj_type, params=params)
        if isinstance(answer, dict) and isinstance(answer.get("result"), list):
            answer = answer["result"]
        if not isinstance(answer, list):
            raise BackendUnavailableError(f"WAPI answered a {obj_type} search with a non-list")
        return [item for item in answer if isinstance(item, dict) and "_ref" in item]

    # ----------------------------------------------------------------- helpers

    def _families(self) -> list[bool]:
        """Return the address families of the pool (False: IPv4, True: IPv6), in first-use order."""
        return list(dict.fromkeys(net.v6 for net in self._nets))

    def _net_of(self, address: IPAddr) -> _Net | None:
        """Return the first network of the pool that contains ``address``."""
        for net in self._nets:
            if address.version == net.network.version and address in net.network:
                return net
        return None

    def _wapi_name(self, hostname: str) -> str:
        """Return the WAPI ``name`` of a claim's key (host records lower-cased, as NIOS stores)."""
        if self.config.record_type == "host" and self.config.dns_zone:
            return f"{hostname}.{self.config.dns_zone}".lower()
        if self.config.record_type == "host":
            return hostname.lower()
        return hostname

    def _hostname_of(self, name: str) -> str:
        """Return a WAPI ``name`` without the pool's DNS zone (the inverse of `_wapi_name`)."""
        zone = self.config.dns_zone
        if self.config.record_type == "host" and zone and name.lower().endswith("." + zone.lower()):
            return name[: -len(zone) - 1]
        return name

    def _view_description(self) -> str:
        if self.config.dns_zone:
            return f"DNS view {self.config.dns_view!r}"
        return f"network view {self.config.network_view!r}"

    def _pool_description(self) -> str:
        nets = ", ".join(net.cidr for net in self._nets)
        return f"{nets} in network view {self.config.network_view!r}"

    def _has_other_addresses(self, host_record: Mapping[str, Any]) -> bool:
        """Return True when a host record holds an address outside the pool's networks."""
        for family in ("ipv4", "ipv6"):
            for item in host_record.get(f"{family}addrs") or []:
                address = _parse_address(item.get(f"{family}addr"))
                if address is None or self._net_of(address) is None:
                    return True
        return False

    def _subnet_not_found(self, net: _Net) -> SubnetNotFoundError:
        return SubnetNotFoundError(
            f"no {net.network_type} {net.cidr} in network view {self.config.network_view!r}"
        )

    def _allocation(
        self, hostname: str, entry: _Entry, *, quarantined: float | None = None
    ) -> Allocation:
        net = entry.net
        return Allocation(
            address=str(entry.address),
            prefix=net.prefixlen,
            gateway=net.gateway or self._cached_gateway(net),
            hostname=hostname,
            ref=entry.ref,
            subnet=net.cidr,
            description=entry.comment,
            quarantined_until=quarantined,
            owner=entry.owner,
        )

    def _cached_gateway(self, net: _Net) -> str | None:
        """Return the network's ``routers`` gateway, read once (`describe_subnets` refreshes)."""
        with self._gateway_lock:
            if net.cidr in self._routers:
                return self._routers[net.cidr]
        return self._refresh_gateway(net)

    def _refresh_gateway(self, net: _Net) -> str | None:
        gateway = _gateway_from_options(self._get_network(net).get("options"))
        with self._gateway_lock:
            self._routers[net.cidr] = gateway
        return gateway

    def _gateways(self, net: _Net, routers: str | None) -> frozenset[IPAddr]:
        """Return the gateways (override and ``routers``) next-available-IP could hand out."""
        found = set()
        for text in (net.gateway, routers):
            address = _parse_address(text)
            if address is not None and _in_hosts(address, net.network):
                found.add(address)
        return frozenset(found)

    def _never_assigned(self, net: _Net, routers: str | None) -> frozenset[IPAddr]:
        """Addresses of the network never given to a claim."""
        never = set(self._gateways(net, routers))
        network = net.network
        if network.version == 4 and network.prefixlen < 31:
            never.update((network.network_address, network.broadcast_address))
        if network.version == 6 and network.prefixlen < 127:
            never.add(network.network_address)  # the subnet-router anycast address
        return frozenset(never)

    def _next_available(self, net: _Net, exclude: frozenset[IPAddr]) -> str | dict[str, Any]:
        """Return the address value of a create, from which WAPI picks the address itself.

        Without exclusions the ``func:nextavailableip:<cidr>,<view>`` string (WAPI's
        function-call form); with them the object-function form (``_object_function``,
        https://ipam.illinois.edu/wapidoc/), the only single-call way to exclude addresses.
        """
        if not exclude:
            return f"func:nextavailableip:{net.cidr},{self.config.network_view}"
        return {
            "_object_function": "next_available_ip",
            "_object": net.network_type,
            "_object_parameters": {
                "network": net.cidr,
                "network_view": self.config.network_view,
            },
            "_result_field": "ips",
            "_parameters": {"num": 1, "exclude": [str(a) for a in sorted(exclude)]},
        }

    # ----------------------------------------------------------------- transport

    def _url(self, path: str) -> str:
        # '%' is safe: a _ref is already URL-encoded by WAPI (":2001%3Adb8%3A%3A10"), and
        # object types and function names have nothing to encode.
        return f"{self.config.endpoint}/wapi/v{self.config.wapi_version}/{quote(path, safe='/:%')}"

    def _cookies(self) -> list[Cookie]:
        # RequestsCookieJar is an http.cookiejar.CookieJar: iterating it yields Cookie objects.
        return list(cast(CookieJar, self._session.cookies))

    def _auth_cookie(self) -> str | None:
        for cookie in self._cookies():
            if cookie.name == AUTH_COOKIE:
                return cookie.value
        return None

    def _drop_auth_cookie(self, sent: str | None) -> None:
        with self._auth_lock:
            for cookie in self._cookies():
                if cookie.name == AUTH_COOKIE and (sent is None or cookie.value == sent):
                    self._session.cookies.clear(cookie.domain, cookie.path, cookie.name)

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
    ) -> requests.Response:
        """Send one request; re-authenticate once on 401. Raise on transport failures."""
        url = self._url(path)
        what = f"{method} {path.split('/')[0]}"
        with self._auth_lock:
            cookie = self._auth_cookie()
        if cookie is not None:
            response = self._transport.request(
                method, url, what=what, params=params, json=json, auth=NO_AUTH
            )
            if response.status_code != 401:
                return response
            log.info("infoblox: HTTP 401 on %s; re-authenticating", what)
            self._drop_auth_cookie(cookie)

        def with_basic_auth() -> requests.Response:
            answer = self._transport.request(
                method, url, what=what, params=params, json=json, auth=self._basic
            )
            if answer.status_code == 401 or (
                answer.status_code == 403 and _LOCKED_RE.search(_plain_text(answer))
            ):
                raise self._refused_login(answer)
            return answer

        return self._transport.login(
            self._credential,
            with_basic_auth,
            blocked_for=lambda exc: NIOS_LOCKOUT_SECONDS if _LOCKED_RE.search(exc.message) else 0,
            limit=self.config.login_limit,
        )

    def _refused_login(self, answer: requests.Response) -> AuthenticationFailedError:
        """Return the error of a refused Basic-auth answer (a locked account in the grid's text)."""
        text = _plain_text(answer)
        status = answer.status_code
        if _LOCKED_RE.search(text):
            return AuthenticationFailedError(
                f"the grid at {self.config.endpoint} reports the account of user "
                f"{self.config.username!r} locked (HTTP {status}): {text}; no login is sent "
                f"for {NIOS_LOCKOUT_SECONDS:g}s",
                status=status,
            )
        return AuthenticationFailedError(
            f"the grid at {self.config.endpoint} refused the credentials of user "
            f"{self.config.username!r} (HTTP {status})",
            status=status,
        )

    def _call_json(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
    ) -> Any:
        """Send a request and return its decoded JSON body, or raise the classified error."""
        response = self._send(method, path, params=params, json=json)
        if 200 <= response.status_code < 300:
            try:
                return response.json()
            except ValueError as exc:
                raise BackendUnavailableError(
                    f"WAPI {method} {path.split('/')[0]} answered HTTP "
                    f"{response.status_code} with a body that is not JSON",
                    status=response.status_code,
                ) from exc
        raise _classify(response, self.config.wapi_version, on_ref="/" in path)


# --------------------------------------------------------------------- pure helpers


def _plain_text(response: requests.Response) -> str:
    """Return an answer's human text: a WAPI error's ``text``, else the body without tags."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and (body.get("text") or body.get("Error")):
        return str(body.get("text") or body.get("Error"))[:300]
    return " ".join(_TAG_RE.sub(" ", response.text or "").split())[:300]


def _classify(response: requests.Response, wapi_version: str, *, on_ref: bool) -> BackendError:
    """Map a failed WAPI answer to a `BackendError`, by its ``code``/``text`` first.

    The WAPI error body is ``{"Error": ..., "code": ..., "text": ...}``; 401/403 bodies are
    HTML and an unsupported version is plain text, so the body is only trusted when it
    decodes to that shape. ``on_ref``: the request named a ``_ref`` (a 404 then means the
    object is gone); a 404 on an object type means the grid does not know a view, network
    view or zone the request names (``Client.Ibap.Data.NotFound``), which a person must fix.
    ``Client.Ibap.Data.Conflict`` is a retryable `ConflictError` only for the "already
    exists / in use" texts of a lost race; NIOS uses the same code for extensible attributes
    not allowed on an object, superuser-only EA definitions and members of another network
    view, which become `InvalidRequestError` with the grid's text.
    """
    status = response.status_code
    error = code = text = ""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = str(body.get("Error") or "")
        code = str(body.get("code") or "")
        text = str(body.get("text") or error)
    raw = "" if body is not None else (response.text or "").strip()[:200]
    detail = text or raw or f"HTTP {status}"

    if status == 403:
        if _LOCKED_RE.search(plain := _plain_text(response)):
            return AuthenticationFailedError(
                f"the grid reports the WAPI account locked (HTTP 403): {plain}", status=status
            )
        return AuthenticationFailedError(
            f"the WAPI user lacks permission (HTTP 403): {text or 'forbidden'}", status=status
        )
    if (transient := status_error("WAPI", "answered", status, detail)) is not None:
        return transient
    if (
        status == 404
        or code == "Client.Ibap.Data.NotFound"
        or error.startswith("AdmConDataNotFoundError")
    ):
        if on_ref:
            return _RefNotFoundError(f"WAPI object not found: {detail}", status=status)
        return InvalidRequestError(
            f"the grid does not know a view, network view or zone the pool names: {detail}",
            status=status,
        )
    if body is None and _UNSUPPORTED_VERSION_RE.search(raw):
        return InvalidRequestError(
            f"the grid does not support WAPI version {wapi_version}: {raw}", status=status
        )
    if _EXHAUSTED_RE.search(text):
        return SubnetExhaustedError(f"no free address: {text}", status=status)
    if match := _UNKNOWN_EA_RE.search(text):
        name = match.group("name").strip() or "?"
        return _UnknownEAError(
            f"extensible attribute {name!r} is not defined in the grid; define it or remove "
            f"it from the pool's extensibleAttributes ({text})",
            status=status,
        )
    if code.startswith("Client.Ibap.Data.Conflict") or "IBDataConflictError" in error:
        if _RACE_RE.search(text):
            return ConflictError(f"WAPI conflict: {text}", status=status)
        return InvalidRequestError(f"the grid refused the request: {text}", status=status)
    if _NETWORK_MISSING_RE.search(text) and not _EXHAUSTED_RE.search(text):
        return SubnetNotFoundError(f"network not found: {text}", status=status)
    return InvalidRequestError(
        f"WAPI rejected the request (HTTP {status}): {detail}", status=status
    )


def _parse_address(value: object) -> IPAddr | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _gateway_from_options(options: object) -> str | None:
    """Return the first address of DHCP option ``routers`` (3) in a WAPI ``options`` list."""
    if not isinstance(options, list):
        return None
    for option in options:
        if not isinstance(option, dict):
            continue
        if option.get("name") != "routers" and option.get("num") != 3:
            continue
        if option.get("use_option") is False:
            continue
        first = str(option.get("value") or "").split(",")[0].strip()
        address = _parse_address(first)
        if address is not None:
            return str(address)
    return None


def _host_bounds(network: IPNetwork) -> tuple[int, int]:
    """Return the first and last address (as ints) next-available-IP can hand out.

    IPv4 below /31 loses the network and broadcast addresses; IPv6 below /127 loses the
    subnet-router anycast address ``prefix::`` (RFC 4291 section 2.6.1).
    """
    first, last = int(network.network_address), int(network.broadcast_address)
    if network.version == 4 and network.prefixlen < 31:
        return first + 1, last - 1
    if network.version == 6 and network.prefixlen < 127:
        return first + 1, last
    return first, last


def _in_hosts(address: IPAddr, network: IPNetwork) -> bool:
    """Return True when next-available-IP can hand ``address`` out of ``network``.

    Everything in the network but the addresses `_host_bounds` leaves out.
    """
    if address.version != network.version or address not in network:
        return False
    first, last = _host_bounds(network)
    return first <= int(address) <= last


def _capacity(network: IPNetwork) -> int:
    """Addresses that can be handed out (see `_host_bounds`)."""
    first, last = _host_bounds(network)
    return last - first + 1


def _duid_for(hostname: str) -> str:
    """Return a deterministic DUID-UUID (RFC 6355, type 4) for an IPv6 fixed address.

    WAPI requires a ``duid`` on ``ipv6fixedaddress``; deriving it from the hostname keeps it
    unique per claim and identical on every retry.
    """
    raw = b"\x00\x04" + uuid.uuid5(_DUID_NAMESPACE, hostname).bytes
    return ":".join(f"{byte:02x}" for byte in raw)


def owner_extattr_value(owner: EntryOwner) -> str:
    """Return the owner EA's value for ``owner``: ``<cluster_id> <namespace>/<name>``.

    Without a cluster id, ``<namespace>/<name>`` (the previous release's owner).
    """
    return f"{owner.cluster_id} {owner.claim}" if owner.cluster_id else owner.claim


def _extattrs_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    extattrs = obj.get("extattrs")
    return extattrs if isinstance(extattrs, Mapping) else {}


def _by_ref(entries: list[_Entry]) -> dict[str, list[_Entry]]:
    """Group entries by their WAPI object's ``_ref`` (a host record may hold several addresses)."""
    groups: dict[str, list[_Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.ref, []).append(entry)
    return groups


def _ref_id(ref: str) -> str:
    """Return the ``<type>/<id>`` part of a ``_ref`` (the name part after ``:`` may differ).

    The type may hold a colon itself (``record:host/ZG5z...:m1.ns1/%20``).
    """
    type_name, _, rest = ref.partition("/")
    return f"{type_name}/{rest.partition(':')[0]}"


def _fixed_names(v6: bool) -> tuple[str, str]:
    """Return the fixed-address object type and its address field for a family."""
    return ("ipv6fixedaddress", "ipv6addr") if v6 else ("fixedaddress", "ipv4addr")
