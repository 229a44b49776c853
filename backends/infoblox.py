"""Infoblox NIOS WAPI client: one pool's network, host records or fixed addresses."""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.cookiejar import Cookie, CookieJar
from types import MappingProxyType
from typing import Any, Literal, cast
from urllib.parse import quote

import requests

from backends.base import Allocation, SubnetInfo
from backends.errors import (
    AuthenticationFailedError,
    BackendError,
    BackendUnavailableError,
    ConflictError,
    InvalidRequestError,
    SubnetExhaustedError,
    SubnetNotFoundError,
)
from backends.retry import RetryPolicy
from backends.transport import (
    NO_AUTH,
    EndpointRegistry,
    Transport,
    basic_auth,
    credential_id,
    default_user_agent,
    status_error,
)

__all__ = ["InfobloxBackend", "InfobloxConfig"]

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
#: Namespace of the deterministic DUID-UUID (RFC 6355) given to IPv6 fixed addresses.
_DUID_NAMESPACE = uuid.UUID("4a6f1c52-7b0e-4d5c-9a43-6d1f0b2c8e11")

_EXHAUSTED_RE = re.compile(r"cannot find \d+ available ip", re.IGNORECASE)
_UNKNOWN_EA_RE = re.compile(r"unknown extensible attribute:?\s*(?P<name>[^\n]*)", re.IGNORECASE)
_NETWORK_MISSING_RE = re.compile(
    r"(cannot|can not|unable to) find (the )?(ipv6)?network"
    r"|no (such )?(ipv6)?network"
    r"|(ipv6)?network [^ ]+ (was )?(not found|does not exist)",
    re.IGNORECASE,
)
_UNSUPPORTED_VERSION_RE = re.compile(r"version\s+\S+\s+not supported", re.IGNORECASE)


@dataclass(frozen=True)
class InfobloxConfig:
    """Where and how to reach one Infoblox network (the ``InfobloxIPPool`` spec plus its Secret).

    Attributes
    ----------
    endpoint:
        Grid master URL, e.g. ``"https://gm.example.com"``; requests go to
        ``<endpoint>/wapi/v<wapi_version>/...``.
    subnet:
        CIDR of an existing WAPI ``network`` (IPv4) or ``ipv6network`` (IPv6) in
        ``network_view``. Normalised (``"2001:DB8::/64"`` -> ``"2001:db8::/64"``).
    username, password:
        Credentials of a WAPI user (HTTP Basic). The password is hidden from ``repr``.
    wapi_version:
        WAPI version in the URL (default ``"2.12"``); a grid that lacks it answers 400.
    network_view:
        WAPI network view that holds the network (default ``"default"``).
    record_type:
        ``"host"`` (default): a ``record:host``; ``"fixedaddress"``: a ``fixedaddress``
        (IPv6: ``ipv6fixedaddress``) reservation.
    dns_view:
        DNS view of host records created in DNS (only used together with ``dns_zone``).
    dns_zone:
        With a zone (host records only) the record is ``<hostname>.<zone>`` with
        ``configure_for_dns: true`` in ``dns_view``; without, ``configure_for_dns: false``
        and the record lives only in ``network_view``.
    extensible_attributes:
        Extensible attributes (EA name -> value) stamped on every record; each EA must be
        defined in the grid.
    gateway:
        The pool's gateway override (an IP address), or None to use the network's DHCP
        ``routers`` option. Reported in every `Allocation` and `SubnetInfo`, and never
        handed out: next-available-IP does not know the ``routers`` option, so the gateway
        (override and ``routers``) is excluded in the allocation request itself. Normalised
        (``"2001:DB8::1"`` -> ``"2001:db8::1"``).
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

    Raises
    ------
    ValueError
        From the constructor when ``subnet`` is not a CIDR, ``record_type`` is unknown,
        ``dns_zone`` is set with ``record_type="fixedaddress"``, ``gateway`` is not an IP
        address of the subnet's family, or ``timeout_seconds`` is not positive.

    """

    endpoint: str
    subnet: str
    username: str
    password: str = field(repr=False)
    wapi_version: str = "2.12"
    network_view: str = "default"
    record_type: Literal["host", "fixedaddress"] = "host"
    dns_view: str = "default"
    dns_zone: str | None = None
    extensible_attributes: Mapping[str, str] = field(default_factory=dict)
    gateway: str | None = None
    verify: bool = True
    ca_pem: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    user_agent: str = field(default_factory=default_user_agent)

    def __post_init__(self) -> None:
        try:
            network = ipaddress.ip_network(self.subnet, strict=True)
        except ValueError as exc:
            raise ValueError(f"subnet {self.subnet!r} is not a CIDR: {exc}") from exc
        if self.record_type not in ("host", "fixedaddress"):
            raise ValueError(
                f"record_type must be 'host' or 'fixedaddress', not {self.record_type!r}"
            )
        if self.dns_zone and self.record_type != "host":
            raise ValueError("dns_zone applies to host records only (record_type 'host')")
        if self.timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if self.gateway is not None:
            try:
                gateway = ipaddress.ip_address(self.gateway.strip())
            except ValueError:
                raise ValueError(f"gateway {self.gateway!r} is not an IP address") from None
            if gateway.version != network.version:
                raise ValueError("gateway and subnet must be of the same address family")
            object.__setattr__(self, "gateway", gateway.compressed)
        object.__setattr__(self, "subnet", str(network))
        object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))
        object.__setattr__(self, "dns_zone", (self.dns_zone or "").strip(".") or None)
        object.__setattr__(
            self, "extensible_attributes", MappingProxyType(dict(self.extensible_attributes))
        )


class _RefNotFoundError(InvalidRequestError):
    """A WAPI ``_ref`` that no longer exists (404 / ``AdmConDataNotFoundError``)."""


class _UnknownEAError(InvalidRequestError):
    """The pool names an extensible attribute the grid has not defined."""


@dataclass(frozen=True)
class _Entry:
    """One address registered under a hostname, as a search found it."""

    address: IPAddr
    ref: str
    #: For host records: the whole record (to rewrite its address lists on release).
    record: Mapping[str, Any] | None = None


class InfobloxBackend:
    """`backends.base.IPAMBackend` for one Infoblox NIOS network over WAPI (``requests``).

    Host mode (``record_type="host"``) keeps one ``record:host`` per hostname; fixed-address
    mode keeps one ``fixedaddress`` (``ipv6fixedaddress`` for IPv6) per hostname. Addresses
    come from next-available-IP inside the create request, so WAPI picks and writes the
    address in one step (backends.md B.5; never the racy ``_function=next_available_ip``
    followed by a create, ansible#45218): ``func:nextavailableip:<cidr>,<network view>``,
    or, when the network has a gateway, the object-function form that excludes it
    (``{"_object_function": "next_available_ip", "_object": "network"|"ipv6network",
    "_object_parameters": {"network", "network_view"}, "_result_field": "ips",
    "_parameters": {"num": 1, "exclude": [<gateway>...]}}``; infoblox-go-client
    ``IpNextAvailableInfo``, nios-go-client ``FuncCall``). WAPI skips the network and
    broadcast addresses and used addresses on its own, but not the DHCP ``routers`` option.

    Never handed out to a claim: the gateway (the pool's override and the ``routers``
    option, read again before every create) and, for IPv4 below /31, the network and
    broadcast addresses. Should WAPI still return one, the record just created is deleted
    and the attempt fails with `BackendUnavailableError` (retried by the policy); a record
    of the hostname at such an address is removed before a new one is created, never
    adopted.

    Authentication is HTTP Basic (UTF-8) on the first request; afterwards the ``ibapauth``
    session cookie the grid sets is sent instead. A 401 drops the cookie and repeats the
    request once with Basic auth; a 401 to Basic auth raises `AuthenticationFailedError`.
    Requests with Basic auth go through the endpoint's login budget (a refused one counts).

    ``_ref`` values from WAPI are already URL-encoded (``ipv6fixedaddress/ZG5...:2001%3Adb8
    %3A%3A10/default``) and are sent as they are, never encoded a second time.

    Parameters
    ----------
    config:
        The pool's settings and credentials.
    session:
        The HTTP session to use (tests pass one); by default a new `requests.Session`.
        The backend owns it and closes it in `close`.
    endpoints:
        The operator's `EndpointRegistry` (breaker, concurrency, login budget per endpoint);
        None gives this client a registry of its own.

    Notes
    -----
    Thread-safe: the session's cookie jar is only changed under a lock, and the cached
    gateway is read and written atomically. Every public method is one operation of the
    shared `backends.transport.Transport` (bounded, in a slot of the endpoint, under
    ``config.retry``) and raises only `backends.errors.BackendError` subclasses.

    """

    def __init__(
        self,
        config: InfobloxConfig,
        session: requests.Session | None = None,
        *,
        endpoints: EndpointRegistry | None = None,
    ) -> None:
        self.config = config
        self._network: IPNetwork = ipaddress.ip_network(config.subnet)
        self._v6 = self._network.version == 6
        self._transport = Transport.of(config, label="WAPI", endpoints=endpoints, session=session)
        self._session = self._transport.session
        self._basic = basic_auth(config.username, config.password)
        self._credential = credential_id(config.username, config.password)
        self._auth_lock = threading.Lock()
        self._gateway_lock = threading.Lock()
        self._gateway_known = False
        self._gateway: str | None = None

    def __repr__(self) -> str:
        return (
            f"InfobloxBackend(endpoint={self.config.endpoint!r}, subnet={self.config.subnet!r}, "
            f"network_view={self.config.network_view!r}, record_type={self.config.record_type!r})"
        )

    # ----------------------------------------------------------------- public API

    def describe_subnet(self) -> SubnetInfo:
        """Return the network's CIDR, prefix, gateway and live usage.

        Reads ``GET network`` (``ipv6network``) with ``_return_fields=network,network_view,
        options`` and counts the used addresses with paged
        ``GET ipv4address|ipv6address?network=<cidr>&network_view=<view>&status=USED``.

        Returns
        -------
        SubnetInfo
            ``prefix`` comes from the CIDR; ``gateway`` is the first value of the DHCP
            option ``routers`` (option 3) on the network, or None when the network does not
            set it (inherited options are not resolved); ``total`` is ``2**(bits - prefix)``
            minus network and broadcast for IPv4 prefixes below /31; ``used`` counts
            addresses WAPI reports ``USED``, excluding the network and broadcast addresses;
            ``free = max(total - used, 0)``.

        Raises
        ------
        SubnetNotFoundError
            When no such network exists in the network view.
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        return self._transport.call("describe_subnet", self._describe_once)

    def find(self, hostname: str) -> Allocation | None:
        """Return the address registered under ``hostname`` in the pool's network, or None.

        Host mode: ``GET record:host?name=<fqdn>&view=<dns view>`` when the pool has a DNS
        zone, else ``GET record:host?name=<hostname>&network_view=<view>`` (records outside
        DNS have no DNS view, WAPI reports ``view: " "``). Fixed-address mode:
        ``GET fixedaddress?name=<hostname>&network_view=<view>&network=<cidr>``. Only
        addresses inside the pool's CIDR count; of several, the lowest address wins (WAPI
        exposes no creation order for them).

        Parameters
        ----------
        hostname:
            The claim's key (without the DNS zone).

        Returns
        -------
        Allocation or None
            ``hostname`` is the key given; ``ref`` is the WAPI ``_ref`` of the record.

        Raises
        ------
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError
            And `SubnetNotFoundError` when the network is gone (the gateway is read from it).

        """
        return self._transport.call("find", lambda: self._find_once(hostname))

    def allocate(self, hostname: str, description: str) -> Allocation:
        """Register the next available address of the network under ``hostname``.

        Looks the hostname up first and returns the existing entry (adoption, and a repeat
        after a lost answer never creates a second entry). Otherwise sends ONE create:
        ``POST record:host`` with ``ipv4addrs``/``ipv6addrs`` ``[{"ipv4addr":
        "func:nextavailableip:<cidr>,<view>", "configure_for_dhcp": false}]``, or
        ``POST fixedaddress``/``ipv6fixedaddress`` with the function as the address, MAC
        ``00:00:00:00:00:00`` (IPv6: a DUID derived from the hostname), ``comment`` (the
        description, cut to 256 characters) and ``extattrs``; ``_return_fields`` brings the
        address back in the same answer.

        Parameters
        ----------
        hostname:
            The claim's key; with a DNS zone the record is ``<hostname>.<zone>``.
        description:
            Provenance, stored as the record's ``comment``.

        Returns
        -------
        Allocation
            The address, prefix, gateway, ``hostname`` and the record's ``_ref``.

        Raises
        ------
        SubnetExhaustedError
            WAPI answered ``Cannot find 1 available IP address(es) in this network``.
        SubnetNotFoundError
            The network does not exist in the network view.
        InvalidRequestError
            An undefined extensible attribute, or (host mode) the name is already used in
            the view by a record that holds no address of this network: a person must
            rename or remove that record.
        ConflictError
            A lost race for an address (retried by the policy, which looks up again first).
        AuthenticationFailedError, BackendUnavailableError

        """
        return self._transport.call("allocate", lambda: self._allocate_once(hostname, description))

    def release(self, hostname: str) -> bool:
        """Remove every address registered under ``hostname`` in the pool's network.

        ``DELETE <_ref>`` of each matching fixed address or host record. A host record that
        also holds addresses outside the network (one a person registered) is not deleted:
        only this network's addresses are removed from it with ``PUT <_ref>``. A 404 /
        ``AdmConDataNotFoundError`` (already gone) is success.

        Returns
        -------
        bool
            True when something was registered (and is now gone), False when nothing was.

        Raises
        ------
        AuthenticationFailedError, BackendUnavailableError, InvalidRequestError

        """
        return self._transport.call("release", lambda: self._release_once(hostname))

    def close(self) -> None:
        """Log out (``POST logout``, best effort, with a session cookie only); close the session."""
        try:
            if self._auth_cookie() is not None:
                self._transport.request("POST", self._url("logout"), what="POST logout")
        except BackendError as exc:
            log.debug("infoblox logout failed: %s", exc)
        finally:
            self._session.close()

    # ----------------------------------------------------------------- operations

    def _describe_once(self) -> SubnetInfo:
        record = self._get_network()
        routers = _gateway_from_options(record.get("options"))
        with self._gateway_lock:
            self._gateway, self._gateway_known = routers, True
        total = _capacity(self._network)
        used_addresses = self._used_addresses()
        # A gateway nobody registered is not free either: it is never handed out.
        used = len(used_addresses | self._gateways(routers))
        return SubnetInfo(
            cidr=self.config.subnet,
            prefix=self._network.prefixlen,
            gateway=self.config.gateway or routers,
            total=total,
            used=used,
            free=max(total - used, 0),
        )

    def _find_once(self, hostname: str) -> Allocation | None:
        usable = self._usable(self._search(hostname))
        if not usable:
            return None
        return self._allocation(hostname, min(usable, key=lambda e: e.address))

    def _usable(self, entries: list[_Entry]) -> list[_Entry]:
        """Return the entries that may be a claim's address (not gateway, network, broadcast)."""
        if not entries:
            return []
        never = self._never_assigned(self._cached_gateway())
        return [e for e in entries if e.address not in never]

    def _allocate_once(self, hostname: str, description: str) -> Allocation:
        entries = self._search(hostname)
        usable = self._usable(entries)
        if usable:
            existing = self._allocation(hostname, min(usable, key=lambda e: e.address))
            log.debug("infoblox: %s already holds %s", hostname, existing.address)
            return existing
        if entries:
            # Only addresses that are never assigned (a record left by an older version, or
            # by an attempt interrupted below): ours to remove, never to adopt.
            self._remove_entries(hostname, entries)
        # The routers option as it is now: what next-available-IP must skip.
        routers = self._refresh_gateway()
        entry = self._create_or_explain(hostname, description, self._gateways(routers))
        if entry.address in self._never_assigned(routers):
            self._remove_entries(hostname, [entry])
            raise BackendUnavailableError(
                f"WAPI handed out {entry.address} of {self.config.subnet}, which is never "
                "assigned (the gateway, network or broadcast address); the record was removed"
            )
        allocation = self._allocation(hostname, entry)
        log.info(
            "infoblox: allocated %s to %s in %s", allocation.address, hostname, self.config.subnet
        )
        return allocation

    def _create_or_explain(
        self, hostname: str, description: str, exclude: frozenset[IPAddr]
    ) -> _Entry:
        """Create the record; turn WAPI's errors into what they mean for this pool."""
        try:
            return self._create(hostname, description, exclude)
        except ConflictError as exc:
            if self.config.record_type != "host":
                raise  # fixedaddress names are not unique: this is a lost address race
            again = self._usable(self._search(hostname))
            if again:
                # Another writer registered the same name meanwhile.
                return min(again, key=lambda e: e.address)
            name = self._record_name(hostname)
            if name.lower() in exc.message.lower():
                raise InvalidRequestError(
                    f"the name {name!r} is already used by another record in "
                    f"{self._view_description()} that holds no address of "
                    f"{self.config.subnet}; rename or remove that record ({exc.message})",
                    status=exc.status,
                ) from exc
            raise
        except InvalidRequestError as exc:
            if isinstance(exc, _RefNotFoundError | _UnknownEAError) or not self._network_missing():
                raise
            raise self._subnet_not_found() from exc

    def _release_once(self, hostname: str) -> bool:
        entries = self._search(hostname)
        self._remove_entries(hostname, entries)
        return bool(entries)

    def _remove_entries(self, hostname: str, entries: list[_Entry]) -> None:
        """Delete the records of ``entries``.

        A host record that also holds addresses outside the network keeps them: only this
        network's addresses are removed from it.
        """
        by_ref: dict[str, list[_Entry]] = {}
        for entry in entries:
            by_ref.setdefault(entry.ref, []).append(entry)
        for ref, group in by_ref.items():
            record = group[0].record
            if record is not None and self._has_other_addresses(record):
                self._remove_addresses(ref, record)
            else:
                self._delete(ref)
            log.info(
                "infoblox: released %s from %s",
                ", ".join(str(e.address) for e in group),
                hostname,
            )

    # ----------------------------------------------------------------- WAPI objects

    def _search(self, hostname: str) -> list[_Entry]:
        if self.config.record_type == "host":
            params: list[tuple[str, str]] = [("name", self._record_name(hostname))]
            if self.config.dns_zone:
                params.append(("view", self.config.dns_view))
            else:
                params.append(("network_view", self.config.network_view))
            params.append(("_return_fields", "name,view,ipv4addrs,ipv6addrs"))
            records = self._get_list("record:host", params)
            return [
                _Entry(address=address, ref=str(record["_ref"]), record=record)
                for record in records
                for address in self._host_addresses(record)
                if address in self._network
            ]
        addr_field = "ipv6addr" if self._v6 else "ipv4addr"
        records = self._get_list(
            self._fixed_type,
            [
                ("name", hostname),
                ("network_view", self.config.network_view),
                ("network", self.config.subnet),
                ("_return_fields", f"name,{addr_field},network,network_view"),
            ],
        )
        entries = []
        for record in records:
            address = _parse_address(record.get(addr_field))
            if address is not None and address in self._network:
                entries.append(_Entry(address=address, ref=str(record["_ref"])))
        return entries

    def _create(self, hostname: str, description: str, exclude: frozenset[IPAddr]) -> _Entry:
        nextavailable = self._next_available(exclude)
        body: dict[str, Any] = {
            "name": self._record_name(hostname),
            "comment": description[:MAX_COMMENT],
        }
        if self.config.record_type == "host":
            family = "ipv6" if self._v6 else "ipv4"
            body[f"{family}addrs"] = [{f"{family}addr": nextavailable, "configure_for_dhcp": False}]
            if self.config.dns_zone:
                body["configure_for_dns"] = True
                body["view"] = self.config.dns_view
            else:
                body["configure_for_dns"] = False
                body["network_view"] = self.config.network_view
            obj_type, return_fields = "record:host", f"name,{family}addrs"
        else:
            obj_type = self._fixed_type
            body["network_view"] = self.config.network_view
            if self._v6:
                body["ipv6addr"] = nextavailable
                body["duid"] = _duid_for(hostname)
                return_fields = "name,ipv6addr,network_view"
            else:
                body["ipv4addr"] = nextavailable
                body["mac"] = ZERO_MAC
                return_fields = "name,ipv4addr,network_view"
        if self.config.extensible_attributes:
            body["extattrs"] = {
                name: {"value": value} for name, value in self.config.extensible_attributes.items()
            }
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
        if self.config.record_type == "host":
            addresses = [a for a in self._host_addresses(answer) if a in self._network]
        else:
            address = _parse_address(answer.get("ipv6addr" if self._v6 else "ipv4addr"))
            addresses = [address] if address is not None and address in self._network else []
        if not addresses:
            raise BackendUnavailableError(
                f"WAPI created {answer['_ref']!r} but returned no address of {self.config.subnet}"
            )
        return _Entry(address=addresses[0], ref=str(answer["_ref"]), record=answer)

    def _delete(self, ref: str) -> None:
        try:
            self._call_json("DELETE", ref)
        except _RefNotFoundError:
            log.debug("infoblox: %s was already gone", ref)

    def _remove_addresses(self, ref: str, record: Mapping[str, Any]) -> None:
        family = "ipv6" if self._v6 else "ipv4"
        kept = []
        for item in record.get(f"{family}addrs") or []:
            address = _parse_address(item.get(f"{family}addr"))
            if address is not None and address in self._network:
                continue
            kept.append({k: v for k, v in item.items() if k not in ("_ref", "host")})
        try:
            self._call_json("PUT", ref, json={f"{family}addrs": kept})
        except _RefNotFoundError:
            log.debug("infoblox: %s was already gone", ref)

    def _get_network(self) -> dict[str, Any]:
        records = self._get_list(
            self._network_type,
            [
                ("network", self.config.subnet),
                ("network_view", self.config.network_view),
                ("_return_fields", "network,network_view,options"),
            ],
        )
        if not records:
            raise self._subnet_not_found()
        return records[0]

    def _network_missing(self) -> bool:
        try:
            self._get_network()
        except SubnetNotFoundError:
            return True
        except BackendError:
            return False
        return False

    def _used_addresses(self) -> set[IPAddr]:
        """Addresses WAPI reports ``USED`` in the network, without network and broadcast."""
        params = [
            ("network", self.config.subnet),
            ("network_view", self.config.network_view),
            ("status", "USED"),
            ("_return_fields", "ip_address,types"),
        ]
        skip = {"NETWORK", "BROADCAST"}
        used: set[IPAddr] = set()
        for item in self._paged(self._address_type, params):
            if skip.intersection(item.get("types") or ()):
                continue
            address = _parse_address(item.get("ip_address"))
            if address is None:
                raise BackendUnavailableError(
                    f"WAPI listed a used address of {self.config.subnet} without ip_address"
                )
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

    @property
    def _fixed_type(self) -> str:
        return "ipv6fixedaddress" if self._v6 else "fixedaddress"

    @property
    def _network_type(self) -> str:
        return "ipv6network" if self._v6 else "network"

    @property
    def _address_type(self) -> str:
        return "ipv6address" if self._v6 else "ipv4address"

    def _record_name(self, hostname: str) -> str:
        if self.config.record_type == "host" and self.config.dns_zone:
            return f"{hostname}.{self.config.dns_zone}"
        return hostname

    def _view_description(self) -> str:
        if self.config.dns_zone:
            return f"DNS view {self.config.dns_view!r}"
        return f"network view {self.config.network_view!r}"

    def _host_addresses(self, record: Mapping[str, Any]) -> list[IPAddr]:
        family = "ipv6" if self._v6 else "ipv4"
        found = []
        for item in record.get(f"{family}addrs") or []:
            address = _parse_address(item.get(f"{family}addr") if isinstance(item, dict) else None)
            if address is not None:
                found.append(address)
        return found

    def _has_other_addresses(self, record: Mapping[str, Any]) -> bool:
        for family in ("ipv4", "ipv6"):
            for item in record.get(f"{family}addrs") or []:
                address = _parse_address(item.get(f"{family}addr"))
                if address is None or address not in self._network:
                    return True
        return False

    def _subnet_not_found(self) -> SubnetNotFoundError:
        return SubnetNotFoundError(
            f"no {self._network_type} {self.config.subnet} in network view "
            f"{self.config.network_view!r}"
        )

    def _allocation(self, hostname: str, entry: _Entry) -> Allocation:
        return Allocation(
            address=str(entry.address),
            prefix=self._network.prefixlen,
            gateway=self.config.gateway or self._cached_gateway(),
            hostname=hostname,
            ref=entry.ref,
        )

    def _cached_gateway(self) -> str | None:
        """Return the network's ``routers`` gateway, read once (`describe_subnet` refreshes)."""
        with self._gateway_lock:
            if self._gateway_known:
                return self._gateway
        return self._refresh_gateway()

    def _refresh_gateway(self) -> str | None:
        gateway = _gateway_from_options(self._get_network().get("options"))
        with self._gateway_lock:
            self._gateway, self._gateway_known = gateway, True
        return gateway

    def _gateways(self, routers: str | None) -> frozenset[IPAddr]:
        """Return the gateways (override and ``routers``) next-available-IP could hand out."""
        found = set()
        for text in (self.config.gateway, routers):
            address = _parse_address(text)
            if address is not None and _in_hosts(address, self._network):
                found.add(address)
        return frozenset(found)

    def _never_assigned(self, routers: str | None) -> frozenset[IPAddr]:
        """Addresses of the network never given to a claim."""
        net = self._network
        never = set(self._gateways(routers))
        if net.version == 4 and net.prefixlen < 31:
            never.update((net.network_address, net.broadcast_address))
        return frozenset(never)

    def _next_available(self, exclude: frozenset[IPAddr]) -> str | dict[str, Any]:
        """Return the address value of a create, from which WAPI picks the address itself.

        Without exclusions the ``func:nextavailableip:<cidr>,<view>`` string (B.5 form 1);
        with them the object-function form (B.5 form 2), the only single-call way to
        exclude addresses.
        """
        if not exclude:
            return f"func:nextavailableip:{self.config.subnet},{self.config.network_view}"
        return {
            "_object_function": "next_available_ip",
            "_object": self._network_type,
            "_object_parameters": {
                "network": self.config.subnet,
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
            if answer.status_code == 401:
                raise AuthenticationFailedError(
                    f"the grid at {self.config.endpoint} refused the credentials of user "
                    f"{self.config.username!r} (HTTP 401)",
                    status=401,
                )
            return answer

        return self._transport.login(self._credential, with_basic_auth)

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
        raise _classify(response, self.config.wapi_version)


# --------------------------------------------------------------------- pure helpers


def _classify(response: requests.Response, wapi_version: str) -> BackendError:
    """Map a failed WAPI answer to a `BackendError`, by its ``code``/``text`` first.

    The WAPI error body is ``{"Error": ..., "code": ..., "text": ...}`` (backends.md B.6);
    401/403 bodies are HTML and an unsupported version is plain text, so the body is only
    trusted when it decodes to that shape.
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
        return _RefNotFoundError(f"WAPI object not found: {detail}", status=status)
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
        return ConflictError(f"WAPI conflict: {text}", status=status)
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


def _in_hosts(address: IPAddr, network: IPNetwork) -> bool:
    """Return True when next-available-IP can hand ``address`` out of ``network``.

    Everything in the network but, for IPv4 below /31, the network and broadcast addresses
    (backends.md B.5).
    """
    if address not in network:
        return False
    if network.version == 4 and network.prefixlen < 31:
        return address not in (network.network_address, network.broadcast_address)
    return True


def _capacity(network: IPNetwork) -> int:
    """Addresses that can be handed out (IPv4 loses network and broadcast below /31)."""
    if network.version == 4 and network.prefixlen < 31:
        return network.num_addresses - 2
    return network.num_addresses


def _duid_for(hostname: str) -> str:
    """Return a deterministic DUID-UUID (RFC 6355, type 4) for an IPv6 fixed address.

    WAPI requires a ``duid`` on ``ipv6fixedaddress``; deriving it from the hostname keeps it
    unique per claim and identical on every retry.
    """
    raw = b"\x00\x04" + uuid.uuid5(_DUID_NAMESPACE, hostname).bytes
    return ":".join(f"{byte:02x}" for byte in raw)
