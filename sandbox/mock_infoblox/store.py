"""In-memory, seedable state of the mock grid: objects, next-available-IP, sessions, pages."""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from mock_infoblox.errors import WAPIError, conflict, data_error, not_found, proto_error
from mock_infoblox.schema import OBJECT_TYPES, ObjectType

__all__ = [
    "DEFAULT_PASSWORD",
    "DEFAULT_USER",
    "NON_DNS_VIEW",
    "RECORD_TYPES",
    "InfobloxStore",
    "SearchFilter",
    "UsedAddress",
    "network_not_found",
    "no_free_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "infoblox"  # the well-known NIOS factory default; mock only

#: The ``view`` NIOS reports for a host record with ``configure_for_dns: false``.
NON_DNS_VIEW = " "
_FUNC_PREFIX = "func:nextavailableip:"
#: The object types the admin API edits as "records" (what pools register).
RECORD_TYPES = ("record:host", "fixedaddress", "ipv6fixedaddress")
_NETWORK_TYPES = {4: "network", 6: "ipv6network"}
_RANGE_TYPES = {4: "range", 6: "ipv6range"}
#: NIOS account lockout defaults (when enabled): 5 failed logins lock a user for 5 minutes.
LOCKOUT_FAILURES = 5
LOCKOUT_SECONDS = 300.0
#: ``allowed_object_types`` names of an extensible attribute definition, per WAPI type.
_EA_OBJECT_TYPES = {
    "record:host": "HostRecord",
    "fixedaddress": "FixedAddress",
    "ipv6fixedaddress": "IPv6FixedAddress",
    "network": "Network",
    "ipv6network": "IPv6Network",
}
_FIXED_TYPES = {4: "fixedaddress", 6: "ipv6fixedaddress"}
_ADDR_KEYS = {4: "ipv4addr", 6: "ipv6addr"}
_HOST_LISTS = {4: "ipv4addrs", 6: "ipv6addrs"}
_ADDRESS_FIELDS = frozenset({"ipv4addr", "ipv6addr", "ip_address", "start_addr", "end_addr"})
#: DHCP option numbers for the option names the mock fills in (RFC 2132).
_OPTION_NUMBERS = {
    "routers": 3,
    "domain-name-servers": 6,
    "domain-name": 15,
    "broadcast-address": 28,
    "ntp-servers": 42,
}
_SEED_KEYS = frozenset(
    {
        "users",
        "session_timeout",
        "wapi_version",
        "network_views",
        "dns_views",
        "zones",
        "extensible_attributes",
        "networks",
        "ranges",
        "hosts",
        "fixed_addresses",
        "ipv6_fixed_addresses",
        "used",
    }
)


def no_free_address(where: str = "network") -> WAPIError:
    """Return the error NIOS answers when ``func:nextavailableip`` finds nothing free.

    Parameters
    ----------
    where:
        ``"network"`` (CIDR form) or ``"range"`` (range form).

    Returns
    -------
    WAPIError
        400 ``Client.Ibap.Data`` "Cannot find 1 available IP address(es) in this network."
        (https://github.com/theforeman/smart_proxy_dhcp_infoblox/issues/6).
    """
    return data_error(f"Cannot find 1 available IP address(es) in this {where}.")


def network_not_found(cidr: str, network_view: str) -> WAPIError:
    """Return the error for ``func:nextavailableip`` naming a network that does not exist.

    Parameters
    ----------
    cidr:
        The network as the request named it.
    network_view:
        The network view searched.

    Returns
    -------
    WAPIError
        400 ``Client.Ibap.Data``. The exact NIOS text is not publicly documented; this
        wording is the mock's own (see README), so clients must classify by ``code`` and by
        the text "Cannot find 1 available IP" for exhaustion, not by this text.
    """
    return data_error(f"Network {cidr} not found in network view {network_view}.")


@dataclass(frozen=True)
class SearchFilter:
    """One search argument of a WAPI GET.

    Attributes
    ----------
    field:
        The field name, or ``"*<EA name>"`` for an extensible-attribute search.
    values:
        The accepted values (a repeated query key gives several; any may match).
    case_insensitive:
        The ``:=`` modifier.
    regex:
        The ``~=`` modifier (Python regular expression, searched anywhere in the value).
    """

    field: str
    values: tuple[str, ...]
    case_insensitive: bool = False
    regex: bool = False


@dataclass(frozen=True)
class UsedAddress:
    """An address in use by something the mock does not model (A record, lease, device).

    Attributes
    ----------
    ip:
        The address.
    network_view:
        Its network view.
    names:
        Names shown in ``ipv4address.names``.
    types:
        Types shown in ``ipv4address.types`` (e.g. ``["A"]``, ``["LEASE"]``).
    usage:
        Usage shown in ``ipv4address.usage`` (e.g. ``["DNS"]``).
    """

    ip: IPAddress
    network_view: str = "default"
    names: tuple[str, ...] = ()
    types: tuple[str, ...] = ("UNMANAGED",)
    usage: tuple[str, ...] = ()


@dataclass
class _Session:
    user: str
    ctime: float
    timeout: int


@dataclass
class _Pager:
    items: list[dict[str, Any]]
    size: int
    created: float = field(default_factory=time.monotonic)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _reverse_labels(fqdn: str) -> str:
    return ".".join(reversed(fqdn.lower().rstrip(".").split(".")))


def _ref_key(ref: str) -> str:
    """Return the opaque identity of a ``_ref``: ``<type>/<id>`` without the name part."""
    type_name, sep, rest = ref.partition("/")
    if not sep:
        return ref
    return f"{type_name}/{rest.partition(':')[0]}"


def _parse_ip(value: Any, version: int | None, field_name: str) -> IPAddress:
    try:
        ip = ipaddress.ip_address(str(value))
    except ValueError:
        raise proto_error(f"Invalid value for {field_name}: '{value}'") from None
    if version is not None and ip.version != version:
        raise proto_error(f"Invalid value for {field_name}: '{value}'")
    return ip


def _usable_bounds(net: IPNetwork) -> tuple[int, int]:
    """First and last address next-available-IP may offer in ``net``.

    IPv4 below /31 skips network and broadcast; IPv6 below /127 skips the subnet-router
    anycast address ``prefix::`` (RFC 4291 section 2.6.1).
    """
    first, last = int(net.network_address), int(net.broadcast_address)
    if net.version == 4 and net.prefixlen < 31:
        return first + 1, last - 1
    if net.version == 6 and net.prefixlen < 127:
        return first + 1, last
    return first, last


def _text_values(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, list | tuple):
        out: list[str] = []
        for item in value:
            out.extend(_text_values(item))
        return out
    return [str(value)]


def _holds(network: object, address: str) -> bool:
    """Return whether the CIDR ``network`` holds ``address`` (False for malformed values)."""
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(str(network), strict=False)
    except ValueError:
        return False


def _normalise(field_name: str, value: str) -> str:
    try:
        if field_name == "network":
            return str(ipaddress.ip_network(value, strict=False))
        if field_name in _ADDRESS_FIELDS:
            return str(ipaddress.ip_address(value))
    except ValueError:
        return value
    return value


class _Allocator:
    """Taken-address sets per (network view, IP version) for one atomic write."""

    def __init__(self, store: InfobloxStore, skip_key: str | None) -> None:
        self._store = store
        self._skip_key = skip_key
        self._taken: dict[tuple[str, int], set[int]] = {}
        self._literals: dict[int, set[int]] = {4: set(), 6: set()}

    def reserve_literals(self, version: int, values: Iterable[Any]) -> None:
        """Keep literal addresses of the same request out of its allocations."""
        for value in values:
            if isinstance(value, str) and not value.startswith(_FUNC_PREFIX):
                try:
                    ip = ipaddress.ip_address(value)
                except ValueError:
                    continue
                if ip.version == version:
                    self._literals[version].add(int(ip))
                    for (_, taken_version), taken in self._taken.items():
                        if taken_version == version:
                            taken.add(int(ip))

    def taken(self, network_view: str, version: int) -> set[int]:
        key = (network_view, version)
        if key not in self._taken:
            used = self._store._used_ints(network_view, version, self._skip_key)
            self._taken[key] = used | self._literals[version]
        return self._taken[key]


class InfobloxStore:
    """The state of one mock NIOS grid, shared by every request of the mock server.

    Parameters
    ----------
    users:
        Usernames and passwords accepted for HTTP Basic auth (default ``admin``/``infoblox``).
    session_timeout:
        Lifetime of an ``ibapauth`` cookie in seconds from its creation (NIOS grid setting
        "session timeout").
    wapi_version:
        The highest WAPI version the grid serves; older 1.x/2.x versions are served too,
        newer ones answer 400 ``Version X not supported``.
    clock:
        Returns the current time in seconds (epoch); tests pass a fake one to expire cookies
        without sleeping.

    Notes
    -----
    Every public method holds ``lock`` (a re-entrant lock), so a create that evaluates
    ``func:nextavailableip`` chooses and records its address atomically, whatever thread
    calls it. Methods raise `mock_infoblox.errors.WAPIError` for anything WAPI would reject.
    """

    def __init__(
        self,
        *,
        users: Mapping[str, str] | None = None,
        session_timeout: int = 600,
        wapi_version: str = "2.12.3",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self._initial_users = dict(users) if users is not None else {DEFAULT_USER: DEFAULT_PASSWORD}
        self._initial_timeout = session_timeout
        self._initial_version = wapi_version
        self.users: dict[str, str] = {}
        self.session_timeout = session_timeout
        self.wapi_version = wapi_version
        self._objects: dict[str, dict[str, Any]] = {}
        self._used: list[UsedAddress] = []
        self._sessions: dict[str, _Session] = {}
        self._pagers: dict[str, _Pager] = {}
        #: Refused logins per user (times) and the end of each user's lockout.
        self._refused: dict[str, list[float]] = {}
        self._locked_until: dict[str, float] = {}
        #: A Grid Master Candidate: read-only API access (writes answer 403).
        self.read_only = False
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every object, session and page; keep only the default views.

        The grid then has the network view ``default`` and the DNS view ``default`` (both
        ``is_default: true``), the constructor's users, session timeout and WAPI version.
        """
        with self.lock:
            self.users = dict(self._initial_users)
            self.session_timeout = self._initial_timeout
            self.wapi_version = self._initial_version
            self._objects.clear()
            self._used.clear()
            self._sessions.clear()
            self._pagers.clear()
            self._refused.clear()
            self._locked_until.clear()
            self.read_only = False
            self._insert_view("networkview", {"name": "default", "is_default": True})
            self._insert_view(
                "view", {"name": "default", "is_default": True, "network_view": "default"}
            )

    @classmethod
    def from_seed(cls, seed: Mapping[str, Any] | None = None, **kwargs: Any) -> InfobloxStore:
        """Create a store and load ``seed`` into it.

        Parameters
        ----------
        seed:
            A seed document (see `seed`), or None for an empty grid.
        **kwargs:
            Passed to the constructor (``users``, ``session_timeout``, ``clock`` ...).

        Returns
        -------
        InfobloxStore
            The seeded store.

        Raises
        ------
        ValueError
            If the seed is malformed or WAPI would reject one of its objects.
        """
        store = cls(**kwargs)
        if seed:
            store.seed(seed)
        return store

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> InfobloxStore:
        """Create a store from a YAML seed file (format: ``seed.example.yaml``).

        Parameters
        ----------
        path:
            The YAML file.
        **kwargs:
            Passed to the constructor.

        Returns
        -------
        InfobloxStore
            The seeded store.

        Raises
        ------
        OSError
            If the file cannot be read.
        ValueError
            If the document is not a mapping or one of its objects is rejected.
        """
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(doc, Mapping):
            raise ValueError(f"{path}: a seed must be a YAML mapping")
        return cls.from_seed(doc, **kwargs)

    def seed(self, seed: Mapping[str, Any]) -> None:
        """Add the objects of a seed document to the grid.

        Parameters
        ----------
        seed:
            A mapping with any of the keys ``users`` (name -> password),
            ``session_timeout`` (seconds), ``wapi_version``, ``network_views`` (names),
            ``dns_views`` (names or ``{name, network_view}``), ``zones`` (``{fqdn, view}``),
            ``extensible_attributes`` (names or ``{name, type}``), ``networks`` (WAPI
            ``network``/``ipv6network`` bodies; a ``gateway`` key becomes the DHCP option
            ``routers``), ``ranges``, ``hosts``, ``fixed_addresses``,
            ``ipv6_fixed_addresses`` (WAPI bodies, ``func:nextavailableip`` allowed) and
            ``used`` (``{ip, network_view, names, types, usage}``: addresses taken by
            objects the mock does not model). Extensible attribute values may be plain.

        Raises
        ------
        ValueError
            On an unknown key, a malformed entry, or an entry WAPI would reject (the
            message carries the WAPI error text).
        """
        unknown = set(seed) - _SEED_KEYS
        if unknown:
            raise ValueError(f"unknown seed keys: {sorted(unknown)}")
        with self.lock:
            try:
                self._seed(seed)
            except WAPIError as exc:
                raise ValueError(f"seed rejected: {exc.text}") from exc

    def _seed(self, seed: Mapping[str, Any]) -> None:
        if "users" in seed:
            self.users.update({str(k): str(v) for k, v in dict(seed["users"]).items()})
        if "session_timeout" in seed:
            self.session_timeout = int(seed["session_timeout"])
        if "wapi_version" in seed:
            self.wapi_version = str(seed["wapi_version"])
        for name in seed.get("network_views") or []:
            if not self._find("networkview", name=str(name)):
                self.create("networkview", {"name": str(name)})
        for view in seed.get("dns_views") or []:
            body = {"name": view} if isinstance(view, str) else dict(view)
            if not self._find("view", name=body["name"]):
                self.create("view", body)
        for ea in seed.get("extensible_attributes") or []:
            body = {"name": ea, "type": "STRING"} if isinstance(ea, str) else dict(ea)
            body.setdefault("type", "STRING")
            self.create("extensibleattributedef", body)
        for zone in seed.get("zones") or []:
            self.create("zone_auth", {"fqdn": zone} if isinstance(zone, str) else dict(zone))
        for net in seed.get("networks") or []:
            body = dict(net)
            cidr = ipaddress.ip_network(str(body["network"]), strict=False)
            gateway = body.pop("gateway", None)
            if gateway is not None:
                options = list(body.get("options") or [])
                options.append({"name": "routers", "value": str(gateway)})
                body["options"] = options
            self.create(_NETWORK_TYPES[cidr.version], self._plain_extattrs(body))
        for rng in seed.get("ranges") or []:
            start = ipaddress.ip_address(str(rng["start_addr"]))
            self.create(_RANGE_TYPES[start.version], self._plain_extattrs(dict(rng)))
        for used in seed.get("used") or []:
            self._used.append(
                UsedAddress(
                    ip=ipaddress.ip_address(str(used["ip"])),
                    network_view=str(used.get("network_view", "default")),
                    names=tuple(used.get("names") or ()),
                    types=tuple(used.get("types") or ("UNMANAGED",)),
                    usage=tuple(used.get("usage") or ()),
                )
            )
        for host in seed.get("hosts") or []:
            self.create("record:host", self._plain_extattrs(dict(host)))
        for fixed in seed.get("fixed_addresses") or []:
            self.create("fixedaddress", self._plain_extattrs(dict(fixed)))
        for fixed in seed.get("ipv6_fixed_addresses") or []:
            self.create("ipv6fixedaddress", self._plain_extattrs(dict(fixed)))

    @staticmethod
    def _plain_extattrs(body: dict[str, Any]) -> dict[str, Any]:
        eas = body.get("extattrs")
        if isinstance(eas, Mapping):
            body["extattrs"] = {
                k: v if isinstance(v, Mapping) and "value" in v else {"value": v}
                for k, v in eas.items()
            }
        return body

    def dump(self) -> dict[str, Any]:
        """Return the whole state as JSON-ready data (for ``GET /_mock/state``).

        Returns
        -------
        dict
            ``{"wapi_version", "session_timeout", "users": [names], "sessions": count,
            "objects": {type: [full objects]}, "used": [...]}``. Passwords and cookies are
            never included.
        """
        with self.lock:
            objects: dict[str, list[dict[str, Any]]] = {}
            for key, data in self._objects.items():
                objects.setdefault(key.partition("/")[0], []).append(self._full(data))
            return {
                "wapi_version": self.wapi_version,
                "session_timeout": self.session_timeout,
                "users": sorted(self.users),
                "sessions": len(self._sessions),
                "objects": objects,
                "used": [
                    {
                        "ip": str(u.ip),
                        "network_view": u.network_view,
                        "names": list(u.names),
                        "types": list(u.types),
                        "usage": list(u.usage),
                    }
                    for u in self._used
                ],
            }

    # --------------------------------------------------------------- sessions
    def login(self, user: str, password: str, client_ip: str = "127.0.0.1") -> str | None:
        """Check Basic-auth credentials and open a session.

        Parameters
        ----------
        user, password:
            The credentials of the request.
        client_ip:
            The peer address, written into the cookie like NIOS does.

        Returns
        -------
        str or None
            The ``ibapauth`` cookie value
            (``ip=…,client=API,group=…,ctime=…,timeout=…,mtime=…,su=1,auth=LOCAL,user=…,<sig>``,
            as NIOS sets it), or None when the credentials are wrong or
            the user is locked out (`is_locked`).

        Account lockout as NIOS's default when enabled: `LOCKOUT_FAILURES` refused logins
        of one user within `LOCKOUT_SECONDS` lock it for `LOCKOUT_SECONDS`; a locked user
        is refused even with the right password.
        """
        with self.lock:
            now = self.clock()
            if self.is_locked(user):
                return None
            expected = self.users.get(user)
            if expected is None or not secrets.compare_digest(expected, password):
                recent = [t for t in self._refused.get(user, []) if now - t < LOCKOUT_SECONDS]
                recent.append(now)
                self._refused[user] = recent
                if len(recent) >= LOCKOUT_FAILURES:
                    self._locked_until[user] = now + LOCKOUT_SECONDS
                    self._refused[user] = []
                return None
            sig = secrets.token_urlsafe(24)
            self._sessions[sig] = _Session(user=user, ctime=now, timeout=self.session_timeout)
            ctime = int(now)
            return (
                f"ip={client_ip},client=API,group=admin-group,ctime={ctime},"
                f"timeout={self.session_timeout},mtime={ctime},su=1,auth=LOCAL,"
                f"user={user},{sig}"
            )

    def is_locked(self, user: str) -> bool:
        """Return True while ``user`` is locked out after too many refused logins."""
        with self.lock:
            return self.clock() < self._locked_until.get(user, 0.0)

    def session_user(self, cookie: str) -> str | None:
        """Return the user of a live session cookie.

        Parameters
        ----------
        cookie:
            The ``ibapauth`` cookie value the client sent back.

        Returns
        -------
        str or None
            The username, or None when the cookie is unknown, logged out or older than
            its timeout (NIOS then answers 401).
        """
        sig = cookie.rsplit(",", 1)[-1]
        with self.lock:
            session = self._sessions.get(sig)
            if session is None:
                return None
            if self.clock() >= session.ctime + session.timeout:
                del self._sessions[sig]
                return None
            return session.user

    def logout(self, cookie: str) -> None:
        """Close the session of a cookie (``POST /wapi/v…/logout``); unknown is ignored.

        Parameters
        ----------
        cookie:
            The ``ibapauth`` cookie value.
        """
        with self.lock:
            self._sessions.pop(cookie.rsplit(",", 1)[-1], None)

    def expire_sessions(self) -> int:
        """Invalidate every session cookie now (fault injection: "cookie expired").

        Returns
        -------
        int
            How many sessions were open.
        """
        with self.lock:
            count = len(self._sessions)
            self._sessions.clear()
            return count

    # ------------------------------------------------------------------ pages
    def open_pages(self, items: list[dict[str, Any]], size: int) -> tuple[list[Any], str | None]:
        """Start a paged answer (``_paging=1``).

        Parameters
        ----------
        items:
            Every result of the search, in order.
        size:
            Page size (``abs(_max_results)``, at least 1).

        Returns
        -------
        tuple
            The first page and the ``next_page_id`` (None when this is the last page).
        """
        with self.lock:
            return self._take_page(_Pager(items=items, size=max(1, size)))

    def next_page(self, page_id: str) -> tuple[list[Any], str | None]:
        """Return the page a ``next_page_id`` points at.

        Parameters
        ----------
        page_id:
            The ``_page_id`` argument.

        Returns
        -------
        tuple
            The page and the following ``next_page_id`` (None after the last page).

        Raises
        ------
        WAPIError
            400 ``Client.Ibap.Proto`` for an unknown or used-up page id.
        """
        with self.lock:
            pager = self._pagers.pop(page_id, None)
            if pager is None:
                raise proto_error(f"Page id {page_id} is invalid or has expired.")
            return self._take_page(pager)

    def _take_page(self, pager: _Pager) -> tuple[list[Any], str | None]:
        page, pager.items = pager.items[: pager.size], pager.items[pager.size :]
        if not pager.items:
            return page, None
        page_id = "789c" + secrets.token_hex(16)
        self._pagers[page_id] = pager
        return page, page_id

    # ------------------------------------------------------------------ reads
    def object_type(self, name: str) -> ObjectType:
        """Return the schema of a WAPI object type.

        Parameters
        ----------
        name:
            The object type from the URL, e.g. ``"record:host"``.

        Returns
        -------
        ObjectType
            Its fields.

        Raises
        ------
        WAPIError
            400 ``Client.Ibap.Proto`` "Unknown object type (<name>)".
        """
        try:
            return OBJECT_TYPES[name]
        except KeyError:
            raise proto_error(f"Unknown object type ({name})") from None

    def get(self, ref: str) -> dict[str, Any]:
        """Return the full object a ``_ref`` names.

        Parameters
        ----------
        ref:
            The ``_ref`` (its name part after ``:`` is not checked, like NIOS).

        Returns
        -------
        dict
            A copy of the object with every field the mock knows.

        Raises
        ------
        WAPIError
            404 ``AdmConDataNotFoundError`` "Reference <ref> not found"; 400 for a ref of an
            unknown type.
        """
        with self.lock:
            type_name = ref.partition("/")[0]
            if type_name in ("ipv4address", "ipv6address"):
                for entry in self._address_entries(type_name, {}):
                    if _ref_key(entry["_ref"]) == _ref_key(ref):
                        return entry
                raise not_found(f"Reference {ref} not found")
            self.object_type(type_name)
            data = self._objects.get(_ref_key(ref))
            if data is None:
                raise not_found(f"Reference {ref} not found")
            return self._full(data)

    def search(self, type_name: str, filters: Iterable[SearchFilter]) -> Iterator[dict[str, Any]]:
        """Yield the full objects of a type that match every filter.

        Parameters
        ----------
        type_name:
            The WAPI object type.
        filters:
            Search arguments; all must match (WAPI ANDs its arguments).

        Yields
        ------
        dict
            Copies of matching objects, in creation order (networks by address; address
            views by address).

        Raises
        ------
        WAPIError
            400 ``Client.Ibap.Proto`` for an unknown type, a field that is unknown or not
            searchable, an undefined extensible attribute ("Unknown extensible attribute:
            <name>", terraform-provider-infoblox#48) or a bad regular expression.
        """
        with self.lock:
            otype = self.object_type(type_name)
            checked = [self._check_filter(otype, f) for f in filters]
            if otype.read_only:
                narrowing = {f.field: f for f in checked if not f.regex and not f.case_insensitive}
                items: Iterable[dict[str, Any]] = list(self._address_entries(type_name, narrowing))
            else:
                items = [self._full(d) for k, d in self._sorted_objects(type_name)]
        for item in items:
            if all(self._matches(otype, item, f) for f in checked):
                yield item

    def _sorted_objects(self, type_name: str) -> list[tuple[str, dict[str, Any]]]:
        rows = [(k, d) for k, d in self._objects.items() if k.partition("/")[0] == type_name]
        if type_name in ("network", "ipv6network"):
            rows.sort(key=lambda kd: (kd[1]["network_view"], self._net(kd[1])))
        return rows

    def _check_filter(self, otype: ObjectType, flt: SearchFilter) -> SearchFilter:
        if flt.field.startswith("*"):
            self._check_ea_name(flt.field[1:])
        elif flt.field not in otype.searchable:
            if flt.field in otype.fields:
                raise proto_error(f"Field is not searchable: {flt.field}")
            raise proto_error(f"Unknown argument/field: '{flt.field}'")
        if flt.regex:
            for value in flt.values:
                try:
                    re.compile(value)
                except re.error:
                    raise proto_error(f"Invalid regular expression: {value}") from None
        return flt

    def _matches(self, otype: ObjectType, item: dict[str, Any], flt: SearchFilter) -> bool:
        if flt.field.startswith("*"):
            ea = (item.get("extattrs") or {}).get(flt.field[1:])
            have = _text_values(ea.get("value") if isinstance(ea, Mapping) else None)
        elif flt.field == "contains_address":
            # Search-only (schema.SEARCH_ONLY): the network that holds the address.
            return any(_holds(item.get("network"), want) for want in flt.values)
        elif otype.name == "record:host" and flt.field in ("ipv4addr", "ipv6addr", "mac"):
            addrs = (item.get("ipv4addrs") or []) + (item.get("ipv6addrs") or [])
            have = [str(a[flt.field]) for a in addrs if a.get(flt.field) is not None]
        else:
            have = _text_values(item.get(flt.field))
        for want in flt.values:
            for value in have:
                if flt.regex:
                    flags = re.IGNORECASE if flt.case_insensitive else 0
                    if re.search(want, value, flags):
                        return True
                elif flt.case_insensitive:
                    if value.casefold() == want.casefold():
                        return True
                elif _normalise(flt.field, value) == _normalise(flt.field, want):
                    return True
        return False

    # ----------------------------------------------------------------- writes
    def create(self, type_name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object, evaluating ``func:nextavailableip`` atomically.

        Parameters
        ----------
        type_name:
            The WAPI object type (not ``ipv4address``/``ipv6address``).
        body:
            The POST body.

        Returns
        -------
        dict
            The full new object (``_ref`` included).

        Raises
        ------
        WAPIError
            400 ``Client.Ibap.Proto`` for unknown or read-only fields, missing required
            fields, undefined extensible attributes, bad values; 400
            ``Client.Ibap.Data.Conflict`` for a duplicate host name in the DNS view, a
            duplicate fixed address, network or definition, or a DNS name outside every
            zone; 400 ``Client.Ibap.Data`` when no address is free or the network of
            ``func:nextavailableip`` does not exist; 404 for an unknown DNS or network view.
        """
        with self.lock:
            otype = self.object_type(type_name)
            if otype.read_only:
                raise proto_error(f"Operation create not allowed for {type_name}")
            self._check_body(otype, body)
            for name in otype.required:
                if body.get(name) in (None, ""):
                    raise proto_error(f"Required field missing: {name}")
            key, data = self._build(otype, dict(body), replacing=None)
            self._objects[key] = data
            return self._full(data)

    def update(self, ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Update an object (PUT): the body's fields replace the stored ones.

        Parameters
        ----------
        ref:
            The object's ``_ref``.
        body:
            The PUT body (the same fields as a create; ``func:nextavailableip`` allowed).

        Returns
        -------
        dict
            The full updated object (its ``_ref`` changes when its name does).

        Raises
        ------
        WAPIError
            404 for an unknown ref, and the errors of `create`.
        """
        with self.lock:
            old_key = _ref_key(ref)
            old = self._objects.get(old_key)
            type_name = ref.partition("/")[0]
            otype = self.object_type(type_name)
            if old is None or otype.read_only:
                raise not_found(f"Reference {ref} not found")
            self._check_body(otype, body, update=True)
            merged = self._input_form(otype, old)
            merged.update(body)
            key, data = self._build(otype, merged, replacing=old_key)
            del self._objects[old_key]
            self._objects[key] = data
            return self._full(data)

    def delete(self, ref: str) -> str:
        """Delete the object a ``_ref`` names.

        Parameters
        ----------
        ref:
            The ``_ref``.

        Returns
        -------
        str
            The deleted object's ``_ref`` (what NIOS answers with).

        Raises
        ------
        WAPIError
            404 ``AdmConDataNotFoundError`` "Reference <ref> not found".
        """
        with self.lock:
            data = self._objects.pop(_ref_key(ref), None)
            if data is None:
                raise not_found(f"Reference {ref} not found")
            return str(data["_ref"])

    def next_available_ips(self, ref: str, num: int = 1, exclude: Iterable[str] = ()) -> list[str]:
        """Answer ``POST <network ref>?_function=next_available_ip`` (reserves nothing).

        Parameters
        ----------
        ref:
            A ``network`` or ``ipv6network`` ref.
        num:
            How many addresses to return (1-1000).
        exclude:
            Addresses not to return.

        Returns
        -------
        list of str
            The first ``num`` addresses that are free now.

        Raises
        ------
        WAPIError
            404 for an unknown ref; 400 ``Client.Ibap.Data`` when fewer than ``num`` are
            free ("Cannot find <num> available IP address(es) in this network.").
        """
        with self.lock:
            data = self._objects.get(_ref_key(ref))
            if data is None or ref.partition("/")[0] not in ("network", "ipv6network"):
                raise not_found(f"Reference {ref} not found")
            net = self._net(data)
            taken = set(self._used_ints(data["network_view"], net.version, None))
            taken |= {int(_parse_ip(x, net.version, "exclude")) for x in exclude}
            out: list[str] = []
            for _ in range(num):
                found = self._first_free(net, data["network_view"], taken)
                if found is None:
                    raise data_error(f"Cannot find {num} available IP address(es) in this network.")
                taken.add(found)
                out.append(str(ipaddress.ip_address(found)))
            return out

    # ------------------------------------------------------------ admin edits
    def records(
        self,
        *,
        type_name: str | None = None,
        name: str | None = None,
        address: str | None = None,
        ref: str | None = None,
    ) -> list[dict[str, Any]]:
        """Return the records (hosts and fixed addresses) matching every criterion given.

        For the admin API (``/_mock/records``): edits "behind the operator's back".

        Parameters
        ----------
        type_name:
            ``record:host``, ``fixedaddress`` or ``ipv6fixedaddress``; None for all three.
        name:
            The record's ``name`` (compared case-insensitively, like NIOS host names).
        address:
            An address the record holds (any of a host's addresses).
        ref:
            The record's ``_ref`` (its name part after ``:`` is not compared).

        Returns
        -------
        list of dict
            Copies of the full objects, in creation order.

        Raises
        ------
        ValueError
            When ``type_name`` is not a record type or ``address`` is not an IP address.
        """
        types = RECORD_TYPES if type_name is None else (type_name,)
        if any(t not in RECORD_TYPES for t in types):
            raise ValueError(f"type must be one of {', '.join(RECORD_TYPES)}, not {type_name!r}")
        wanted_ip = ipaddress.ip_address(address.strip()) if address else None
        with self.lock:
            out = []
            for key, data in self._objects.items():
                if key.partition("/")[0] not in types:
                    continue
                if ref is not None and key != _ref_key(ref):
                    continue
                if name is not None and str(data.get("name", "")).casefold() != name.casefold():
                    continue
                if wanted_ip is not None and wanted_ip not in self._record_ips(data):
                    continue
                out.append(self._full(data))
            return out

    def add_record(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a record as a person would in the grid's UI (admin API, no session).

        Parameters
        ----------
        spec:
            ``type`` (``record:host`` default, ``fixedaddress``, ``ipv6fixedaddress``) and
            either ``body`` (a WAPI create body, extensible attribute values may be plain)
            or the short form ``name``, ``address`` (or ``network`` for the next available
            address of that CIDR), optional ``comment``, ``network_view`` (default
            ``default``) and ``extattrs``. A short-form host is created outside DNS
            (``configure_for_dns: false``); a fixed address gets MAC ``00:00:00:00:00:00``
            (IPv6: a DUID derived from the name).

        Returns
        -------
        dict
            The full new object.

        Raises
        ------
        ValueError
            For a malformed spec.
        WAPIError
            What WAPI answers to that create (duplicate host name, duplicate fixed address,
            no free address, unknown extensible attribute ...).
        """
        type_name = str(spec.get("type") or "record:host")
        if type_name not in RECORD_TYPES:
            raise ValueError(f"type must be one of {', '.join(RECORD_TYPES)}, not {type_name!r}")
        if "body" in spec:
            if not isinstance(spec["body"], Mapping):
                raise ValueError("body must be an object (a WAPI create body)")
            return self.create(type_name, self._plain_extattrs(dict(spec["body"])))
        name = spec.get("name")
        if not name:
            raise ValueError("a record needs a name (or give a WAPI body)")
        nv = str(spec.get("network_view") or "default")
        if spec.get("address"):
            value = str(spec["address"]).strip()
            version = ipaddress.ip_address(value).version
        elif spec.get("network"):
            net = ipaddress.ip_network(str(spec["network"]), strict=False)
            value, version = f"{_FUNC_PREFIX}{net},{nv}", net.version
        else:
            raise ValueError("a record needs an address or a network")
        body: dict[str, Any] = {"name": str(name), "network_view": nv}
        if spec.get("comment") is not None:
            body["comment"] = str(spec["comment"])
        if spec.get("extattrs"):
            body["extattrs"] = dict(spec["extattrs"])
        if type_name == "record:host":
            body["configure_for_dns"] = False
            body[_HOST_LISTS[version]] = [{_ADDR_KEYS[version]: value}]
        elif type_name == "fixedaddress":
            body.update(ipv4addr=value, mac="00:00:00:00:00:00")
        else:
            digest = hashlib.sha256(str(name).encode()).hexdigest()
            duid = ":".join(["00", "04", *(digest[i : i + 2] for i in range(0, 28, 2))])
            body.update(ipv6addr=value, duid=duid)
        return self.create(type_name, self._plain_extattrs(body))

    def edit_record(self, match: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change the one record ``match`` selects (rename it, change its comment ...).

        Parameters
        ----------
        match:
            Criteria of `records` (``type``, ``name``, ``address``, ``ref``); exactly one
            record must match.
        changes:
            A WAPI PUT body, e.g. ``{"name": "printer-7"}`` or ``{"comment": "..."}``.

        Returns
        -------
        dict
            The full updated object (a rename changes its ``_ref``).

        Raises
        ------
        LookupError
            When no record or several records match.
        ValueError
            For malformed criteria.
        WAPIError
            What WAPI answers to that PUT (e.g. a duplicate host name).
        """
        with self.lock:
            found = self._matching(match)
            if len(found) != 1:
                raise LookupError(f"{len(found)} records match {dict(match)}; exactly one must")
            return self.update(str(found[0]["_ref"]), changes)

    def remove_records(self, match: Mapping[str, Any]) -> list[str]:
        """Delete every record ``match`` selects (criteria of `records`; at least one).

        Returns
        -------
        list of str
            The deleted records' ``_ref``.

        Raises
        ------
        ValueError
            When no criterion is given or one is malformed.
        """
        if not any(match.get(k) for k in ("name", "address", "ref")):
            raise ValueError("give name, address or ref to select the records to delete")
        with self.lock:
            return [self.delete(str(item["_ref"])) for item in self._matching(match)]

    def _matching(self, match: Mapping[str, Any]) -> list[dict[str, Any]]:
        unknown = set(match) - {"type", "name", "address", "ref"}
        if unknown:
            raise ValueError(f"unknown criteria: {sorted(unknown)}")

        def opt(key: str) -> str | None:
            value = match.get(key)
            return None if value in (None, "") else str(value)

        return self.records(
            type_name=opt("type"), name=opt("name"), address=opt("address"), ref=opt("ref")
        )

    @staticmethod
    def _record_ips(data: Mapping[str, Any]) -> set[IPAddress]:
        ips: set[IPAddress] = set()
        for version in (4, 6):
            for addr in data.get(_HOST_LISTS[version]) or []:
                ips.add(ipaddress.ip_address(str(addr[_ADDR_KEYS[version]])))
            if data.get(_ADDR_KEYS[version]):
                ips.add(ipaddress.ip_address(str(data[_ADDR_KEYS[version]])))
        return ips

    # --------------------------------------------------------------- builders
    def _check_body(
        self, otype: ObjectType, body: Mapping[str, Any], *, update: bool = False
    ) -> None:
        if not isinstance(body, Mapping):
            raise proto_error("Invalid request body: a JSON object is required")
        allowed = otype.updatable if update and otype.updatable is not None else otype.writable
        for name in body:
            if name not in allowed:
                if name in otype.fields or name == "_ref":
                    raise proto_error(f"Field is not writable: {name}")
                raise proto_error(f"Unknown argument/field: '{name}'")
        if "extattrs" in body:
            eas = body["extattrs"]
            if not isinstance(eas, Mapping):
                raise proto_error("Invalid value for extattrs: an object is required")
            for name, value in eas.items():
                self._check_ea_name(str(name))
                if not isinstance(value, Mapping) or "value" not in value:
                    raise proto_error(f"Invalid value for extensible attribute {name}")
                self._check_ea_allowed(otype.name, str(name))

    def _check_ea_allowed(self, type_name: str, name: str) -> None:
        # NIOS answers Client.Ibap.Data.Conflict (not a race) for an EA whose definition
        # restricts the object types it may be set on.
        for definition in self._find("extensibleattributedef", name=name):
            allowed = definition.get("allowed_object_types") or []
            if allowed and _EA_OBJECT_TYPES.get(type_name) not in allowed:
                raise conflict(f"Extensible attribute '{name}' is not allowed for this operation")

    def _check_ea_name(self, name: str) -> None:
        if not self._find("extensibleattributedef", name=name):
            raise proto_error(f"Unknown extensible attribute: {name}")

    def _find(self, type_name: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            d
            for k, d in self._objects.items()
            if k.partition("/")[0] == type_name and all(d.get(f) == v for f, v in fields.items())
        ]

    def _network_view_index(self, name: str) -> int:
        for index, data in enumerate(self._find("networkview")):
            if data["name"] == name:
                return index
        raise not_found(f"Network view {name} not found")

    def _dns_view(self, name: str) -> dict[str, Any]:
        found = self._find("view", name=name)
        if not found:
            raise not_found(f"View {name} not found")
        return found[0]

    @staticmethod
    def _net(data: Mapping[str, Any]) -> IPNetwork:
        return ipaddress.ip_network(str(data["network"]))

    def _input_form(self, otype: ObjectType, data: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in otype.writable:
            if name not in data or data[name] is None:
                continue
            value = copy.deepcopy(data[name])
            if name in ("ipv4addrs", "ipv6addrs"):
                value = [
                    {k: v for k, v in item.items() if k not in ("_ref", "host")} for item in value
                ]
            out[name] = value
        return out

    def _build(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        builder = {
            "network": self._build_network,
            "ipv6network": self._build_network,
            "record:host": self._build_host,
            "fixedaddress": self._build_fixed,
            "ipv6fixedaddress": self._build_fixed,
            "range": self._build_range,
            "ipv6range": self._build_range,
            "extensibleattributedef": self._build_simple,
            "networkview": self._build_simple,
            "view": self._build_simple,
            "zone_auth": self._build_simple,
        }[otype.name]
        key, data = builder(otype, body, replacing)
        if key in self._objects and key != replacing:
            raise conflict(self._duplicate_text(otype.name, data))
        return key, data

    @staticmethod
    def _duplicate_text(type_name: str, data: Mapping[str, Any]) -> str:
        label = (
            data.get("name")
            or data.get("network")
            or data.get("fqdn")
            or data.get("ipv4addr")
            or data.get("ipv6addr")
            or data.get("start_addr")
        )
        return f"The {type_name} object '{label}' already exists."

    def _insert_view(self, type_name: str, data: dict[str, Any]) -> None:
        key, built = self._build_simple(OBJECT_TYPES[type_name], data, None)
        self._objects[key] = built

    def _build_simple(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        data = dict(body)
        if otype.name == "networkview":
            data.setdefault("is_default", False)
            existing = [k for k in self._objects if k.startswith("networkview/")]
            index = len(existing) if replacing is None else existing.index(replacing)
            internal = f"dns.network_view${index}"
            name_part = f"{data['name']}/{str(data['is_default']).lower()}"
        elif otype.name == "view":
            data.setdefault("is_default", False)
            data.setdefault("network_view", "default")
            self._network_view_index(str(data["network_view"]))
            internal = f"dns.view$._{data['name']}"
            name_part = f"{data['name']}/{str(data['is_default']).lower()}"
        elif otype.name == "zone_auth":
            data["fqdn"] = str(data["fqdn"]).rstrip(".")
            data.setdefault("view", "default")
            self._dns_view(str(data["view"]))
            internal = f"dns.zone$._{data['view']}.{_reverse_labels(data['fqdn'])}"
            name_part = f"{data['fqdn']}/{data['view']}"
        else:  # extensibleattributedef
            internal = f"ea.def${data['name']}"
            name_part = str(data["name"])
        key = f"{otype.name}/{_b64(internal)}"
        data["_ref"] = f"{key}:{name_part}"
        return key, data

    def _build_options(self, options: Any, version: int) -> list[dict[str, Any]]:
        if not isinstance(options, list):
            raise proto_error("Invalid value for options: a list is required")
        out = []
        for option in options:
            if not isinstance(option, Mapping) or ("name" not in option and "num" not in option):
                raise proto_error("Invalid value for options: each needs a name or num")
            item = dict(option)
            if "name" in item:
                item.setdefault("num", _OPTION_NUMBERS.get(str(item["name"]), 0))
            item.setdefault("vendor_class", "DHCP" if version == 4 else "DHCPv6")
            item.setdefault("use_option", True)
            item.setdefault("value", "")
            out.append(item)
        return out

    def _build_network(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        version = 4 if otype.name == "network" else 6
        try:
            net = ipaddress.ip_network(str(body["network"]), strict=False)
        except ValueError:
            raise proto_error(f"Invalid value for network: '{body['network']}'") from None
        if net.version != version:
            raise proto_error(f"Invalid value for network: '{body['network']}'")
        nv = str(body.get("network_view") or "default")
        index = self._network_view_index(nv)
        data = dict(body)
        data["network"] = str(net)
        data["network_view"] = nv
        data["options"] = self._build_options(body.get("options") or [], version)
        data.setdefault("extattrs", {})
        address = str(net.network_address)
        name_address = address if version == 4 else quote(address, safe="")
        internal = f"dns.{'network' if version == 4 else 'ipv6_network'}${net}/{index}"
        key = f"{otype.name}/{_b64(internal)}"
        data["_ref"] = f"{key}:{name_address}/{net.prefixlen}/{nv}"
        return key, data

    def _build_range(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        start = _parse_ip(body["start_addr"], None, "start_addr")
        end = _parse_ip(body["end_addr"], start.version, "end_addr")
        if int(end) < int(start):
            raise proto_error("Invalid range: end_addr is lower than start_addr")
        nv = str(body.get("network_view") or "default")
        index = self._network_view_index(nv)
        data = dict(body)
        data.update(start_addr=str(start), end_addr=str(end), network_view=nv)
        data.setdefault("server_association_type", "NONE")
        data.setdefault("extattrs", {})
        if not data.get("network"):
            net = self._containing_network(start, nv)
            if net is not None:
                data["network"] = str(net)
        internal = f"dns.dhcp_range${start}/{end}//{index}//0/"
        key = f"{otype.name}/{_b64(internal)}"
        data["_ref"] = f"{key}:{start}/{end}/{nv}"
        return key, data

    def _build_fixed(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        version = 4 if otype.name == "fixedaddress" else 6
        addr_key = _ADDR_KEYS[version]
        nv = body.get("network_view")
        allocator = _Allocator(self, replacing)
        ip, func_nv = self._resolve_address(body[addr_key], version, addr_key, allocator)
        nv = self._object_network_view(nv, func_nv)
        index = self._network_view_index(nv)
        if func_nv is None:
            for other_key, other in self._objects.items():
                if (
                    other_key != replacing
                    and other_key.startswith(otype.name + "/")
                    and other.get("network_view") == nv
                    and other.get(addr_key) == str(ip)
                ):
                    raise conflict(f"Fixed address {ip} already exists in network view {nv}.")
        data = dict(body)
        data[addr_key] = str(ip)
        data["network_view"] = nv
        data.setdefault("extattrs", {})
        if version == 4:
            data.setdefault("match_client", "MAC_ADDRESS")
        net = self._containing_network(ip, nv)
        if net is not None:
            data["network"] = str(net)
        name_ip = str(ip) if version == 4 else quote(str(ip), safe="")
        prefix = "dns.fixed_address" if version == 4 else "dns.ipv6_fixed_address"
        key = f"{otype.name}/{_b64(f'{prefix}${ip}.{index}..')}"
        data["_ref"] = f"{key}:{name_ip}/{nv}"
        return key, data

    def _build_host(
        self, otype: ObjectType, body: dict[str, Any], replacing: str | None
    ) -> tuple[str, dict[str, Any]]:
        dns = bool(body.get("configure_for_dns", True))
        # NIOS stores DNS names in lower case (an exact name= search in upper case misses).
        name = str(body["name"]).rstrip(".").lower() if dns else str(body["name"]).rstrip(".")
        # A host outside DNS belongs to no DNS view: NIOS reports its view as " ".
        view_name = str(body.get("view") or "default") if dns else NON_DNS_VIEW
        view = self._dns_view(view_name) if dns else {}
        zone = self._zone_of(name, view_name) if dns else None
        if dns and zone is None:
            raise conflict("The action is not allowed. A parent was not found.")
        data: dict[str, Any] = {
            k: v for k, v in body.items() if k not in ("ipv4addrs", "ipv6addrs", "view")
        }
        data.update(name=name, view=view_name, configure_for_dns=dns)
        data.setdefault("extattrs", {})
        if zone is not None:
            data["zone"] = zone
        # The record's own network_view (else its DNS view's): the view named in
        # func:nextavailableip only picks the address, it does not place the record.
        nv = str(body.get("network_view") or view.get("network_view") or "default")
        allocator = _Allocator(self, replacing)
        resolved: dict[int, list[tuple[IPAddress, Mapping[str, Any]]]] = {4: [], 6: []}
        for version in (4, 6):
            list_key, addr_key = _HOST_LISTS[version], _ADDR_KEYS[version]
            items = body.get(list_key) or []
            if not isinstance(items, list):
                raise proto_error(f"Invalid value for {list_key}: a list is required")
            for item in items:
                self._check_host_address(item, version)
            allocator.reserve_literals(version, (item[addr_key] for item in items))
            for item in items:
                ip, func_nv = self._resolve_address(item[addr_key], version, addr_key, allocator)
                nv = self._object_network_view(nv, func_nv)
                resolved[version].append((ip, item))
        index = self._network_view_index(nv)
        for other_key, other in self._objects.items():
            if (
                other_key != replacing
                and other_key.startswith("record:host/")
                and other["view"] == view_name
                and (dns or other.get("network_view") == nv)
                and str(other["name"]).casefold() == name.casefold()
            ):
                raise conflict(f"The record '{name}' already exists.")
        data["network_view"] = nv
        if dns:
            internal_host = f"dns.host$._{view_name}.{_reverse_labels(name)}"
        else:
            internal_host = f"dns.host$.non_DNS_host_root.{index}.{_reverse_labels(name)}"
        view_part = quote(view_name, safe="")
        for version in (4, 6):
            addr_key = _ADDR_KEYS[version]
            kind = "host_address" if version == 4 else "host_ipv6_address"
            built = []
            for ip, item in resolved[version]:
                name_ip = str(ip) if version == 4 else quote(str(ip), safe="")
                internal = f"dns.{kind}${internal_host[9:]}.{ip}."
                out: dict[str, Any] = {
                    "_ref": f"record:host_ipv{version}addr/{_b64(internal)}"
                    f":{name_ip}/{name}/{view_part}",
                    "configure_for_dhcp": bool(item.get("configure_for_dhcp", False)),
                    "host": name,
                    addr_key: str(ip),
                }
                for extra in ("mac", "duid"):
                    if item.get(extra) is not None:
                        out[extra] = item[extra]
                built.append(out)
            data[_HOST_LISTS[version]] = built
        key = f"record:host/{_b64(internal_host)}"
        data["_ref"] = f"{key}:{name}/{view_part}"
        return key, data

    @staticmethod
    def _check_host_address(item: Any, version: int) -> None:
        addr_key = _ADDR_KEYS[version]
        allowed = {addr_key, "configure_for_dhcp", "_ref"} | ({"mac"} if version == 4 else {"duid"})
        if not isinstance(item, Mapping) or addr_key not in item:
            raise proto_error(f"Invalid value for {_HOST_LISTS[version]}: {addr_key} missing")
        for field_name in item:
            if field_name not in allowed:
                raise proto_error(f"Unknown argument/field: '{field_name}'")

    @staticmethod
    def _object_network_view(given: str | None, func_nv: str | None) -> str:
        given = given or "default"
        if func_nv is not None and func_nv != given:
            raise data_error(
                f"The network view {func_nv} of the next available IP differs from the "
                f"object's network view {given}."
            )
        return given

    def _zone_of(self, name: str, view: str) -> str | None:
        best: str | None = None
        lowered = name.casefold()
        for zone in self._find("zone_auth", view=view):
            fqdn = str(zone["fqdn"]).casefold()
            if (lowered == fqdn or lowered.endswith("." + fqdn)) and (
                best is None or len(fqdn) > len(best)
            ):
                best = str(zone["fqdn"])
        return best

    # ------------------------------------------------------------- allocation
    def _resolve_address(
        self, value: Any, version: int, field_name: str, allocator: _Allocator
    ) -> tuple[IPAddress, str | None]:
        """Turn a literal, a ``func:nextavailableip`` string or a function struct into an IP.

        Returns the address and, for allocations, the network view it came from.
        """
        if isinstance(value, Mapping):
            return self._resolve_function(value, version, allocator)
        if isinstance(value, str) and value.startswith(_FUNC_PREFIX):
            target, _, nv = value[len(_FUNC_PREFIX) :].partition(",")
            nv = nv.strip() or "default"
            target = target.strip()
            taken = allocator.taken(nv, version)
            if "-" in target:
                first_text, _, last_text = target.partition("-")
                first = _parse_ip(first_text, version, field_name)
                last = _parse_ip(last_text, version, field_name)
                found = self._first_free_in_span(int(first), int(last), nv, version, taken)
                if found is None:
                    raise no_free_address("range")
            else:
                try:
                    wanted = ipaddress.ip_network(target, strict=False)
                except ValueError:
                    raise proto_error(f"Invalid value for {field_name}: '{value}'") from None
                data = self._network_data(wanted, nv)
                if data is None or wanted.version != version:
                    raise network_not_found(target, nv)
                found = self._first_free(wanted, nv, taken)
                if found is None:
                    raise no_free_address()
            taken.add(found)
            return ipaddress.ip_address(found), nv
        if isinstance(value, str):
            return _parse_ip(value, version, field_name), None
        raise proto_error(f"Invalid value for {field_name}: '{value}'")

    def _resolve_function(
        self, spec: Mapping[str, Any], version: int, allocator: _Allocator
    ) -> tuple[IPAddress, str]:
        if spec.get("_object_function") != "next_available_ip":
            raise proto_error(f"Unknown function: {spec.get('_object_function')}")
        if spec.get("_result_field", "ips") != "ips":
            raise proto_error(f"Unknown result field: {spec.get('_result_field')}")
        type_name = str(spec.get("_object", _NETWORK_TYPES[version]))
        if type_name != _NETWORK_TYPES[version]:
            raise proto_error(f"Function next_available_ip is not supported on {type_name}")
        params = dict(spec.get("_parameters") or {})
        if int(params.get("num", 1)) != 1:
            raise proto_error("Only one address can be assigned to the field")
        if "_object_ref" in spec:
            found = self.get(str(spec["_object_ref"]))
            matches = [found]
        else:
            obj_params = spec.get("_object_parameters") or {}
            filters = [SearchFilter(field=str(k), values=(str(v),)) for k, v in obj_params.items()]
            matches = list(self.search(type_name, filters))
        if not matches:
            raise data_error(f"No {type_name} matches the _object_parameters.")
        if len(matches) > 1:
            raise data_error(f"More than one {type_name} matches the _object_parameters.")
        net = ipaddress.ip_network(str(matches[0]["network"]))
        nv = str(matches[0]["network_view"])
        taken = allocator.taken(nv, version)
        exclude = {int(_parse_ip(x, version, "exclude")) for x in params.get("exclude") or []}
        found_int = self._first_free(net, nv, taken | exclude)
        if found_int is None:
            raise no_free_address()
        taken.add(found_int)
        return ipaddress.ip_address(found_int), nv

    def _network_data(self, net: IPNetwork, nv: str) -> dict[str, Any] | None:
        for data in self._find(_NETWORK_TYPES[net.version], network_view=nv):
            if self._net(data) == net:
                return data
        return None

    def _containing_network(self, ip: IPAddress, nv: str) -> IPNetwork | None:
        best: IPNetwork | None = None
        for data in self._find(_NETWORK_TYPES[ip.version], network_view=nv):
            net = self._net(data)
            if ip in net and (best is None or net.prefixlen > best.prefixlen):
                best = net
        return best

    def _used_ints(self, nv: str, version: int, skip_key: str | None) -> set[int]:
        used: set[int] = set()
        list_key, addr_key = _HOST_LISTS[version], _ADDR_KEYS[version]
        for key, data in self._objects.items():
            if key == skip_key or data.get("network_view") != nv:
                continue
            type_name = key.partition("/")[0]
            if type_name == "record:host":
                used.update(int(ipaddress.ip_address(a[addr_key])) for a in data[list_key])
            elif type_name == _FIXED_TYPES[version]:
                used.add(int(ipaddress.ip_address(data[addr_key])))
        used.update(
            int(u.ip) for u in self._used if u.network_view == nv and u.ip.version == version
        )
        return used

    def _ranges(self, nv: str) -> list[dict[str, Any]]:
        """Return the IPv4 ``range`` and IPv6 ``ipv6range`` objects of a network view."""
        return self._find("range", network_view=nv) + self._find("ipv6range", network_view=nv)

    def _range_spans(self, nv: str, version: int) -> list[tuple[int, int]]:
        spans = []
        for data in self._ranges(nv):
            start = ipaddress.ip_address(data["start_addr"])
            if start.version == version:
                spans.append((int(start), int(ipaddress.ip_address(data["end_addr"]))))
        return sorted(spans)

    def _first_free(self, net: IPNetwork, nv: str, taken: set[int]) -> int | None:
        first, last = _usable_bounds(net)
        spans = self._range_spans(nv, net.version)
        candidate = first
        while candidate <= last:
            span = next((s for s in spans if s[0] <= candidate <= s[1]), None)
            if span is not None:
                candidate = span[1] + 1
            elif candidate in taken:
                candidate += 1
            else:
                return candidate
        return None

    def _first_free_in_span(
        self, first: int, last: int, nv: str, version: int, taken: set[int]
    ) -> int | None:
        for candidate in range(first, last + 1):
            ip = ipaddress.ip_address(candidate)
            net = self._containing_network(ip, nv)
            if net is not None:
                low, high = _usable_bounds(net)
                if not low <= candidate <= high:
                    continue
            if candidate not in taken and ip.version == version:
                return candidate
        return None

    # ---------------------------------------------------------- address views
    def _full(self, data: Mapping[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(dict(data))
        type_name = str(out["_ref"]).partition("/")[0]
        if type_name == "record:host":
            for list_key in ("ipv4addrs", "ipv6addrs"):
                if not out.get(list_key):
                    out.pop(list_key, None)
        if type_name in ("network", "ipv6network"):
            net = self._net(out)
            first, last = _usable_bounds(net)
            total = last - first + 1
            used = sum(
                1
                for x in self._used_ints(out["network_view"], net.version, None)
                if first <= x <= last
            )
            out["netmask"] = net.prefixlen
            out["total_hosts"] = used
            out["utilization"] = (used * 100) // total if total > 0 else 0
        return out

    def _address_entries(
        self, type_name: str, narrowing: Mapping[str, SearchFilter]
    ) -> Iterator[dict[str, Any]]:
        version = 4 if type_name == "ipv4address" else 6
        nets = [(self._net(d), str(d["network_view"])) for d in self._find(_NETWORK_TYPES[version])]
        if "network_view" in narrowing:
            views = set(narrowing["network_view"].values)
            nets = [(n, nv) for n, nv in nets if nv in views]
        if "network" in narrowing:
            wanted = {_normalise("network", v) for v in narrowing["network"].values}
            nets = [(n, nv) for n, nv in nets if str(n) in wanted]
        nets.sort(key=lambda n: (n[1], n[0]))
        only_used = version == 6 or (
            "status" in narrowing and set(narrowing["status"].values) == {"USED"}
        )
        only_ips: set[int] | None = None
        if "ip_address" in narrowing:
            only_ips = set()
            for value in narrowing["ip_address"].values:
                try:
                    only_ips.add(int(ipaddress.ip_address(value)))
                except ValueError:
                    continue
        for net, nv in nets:
            index = self._network_view_index(nv)
            objects = self._objects_by_ip(nv, version)
            used_extra = {int(u.ip): u for u in self._used if u.network_view == nv}
            spans = self._range_types(nv, version)
            low, high = int(net.network_address), int(net.broadcast_address)
            if only_ips is not None:
                candidates: Iterable[int] = sorted(x for x in only_ips if low <= x <= high)
            elif only_used:
                special = {low, high} if version == 4 and net.prefixlen < 31 else set()
                candidates = sorted(
                    x for x in set(objects) | set(used_extra) | special if low <= x <= high
                )
            else:
                candidates = range(low, high + 1)
            for ip_int in candidates:
                yield self._address_entry(
                    type_name,
                    net,
                    nv,
                    index,
                    ip_int,
                    objects.get(ip_int, []),
                    used_extra.get(ip_int),
                    spans,
                )

    def _objects_by_ip(self, nv: str, version: int) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        list_key, addr_key = _HOST_LISTS[version], _ADDR_KEYS[version]
        for key, data in self._objects.items():
            if data.get("network_view") != nv:
                continue
            type_name = key.partition("/")[0]
            if type_name == "record:host":
                for addr in data[list_key]:
                    out.setdefault(int(ipaddress.ip_address(addr[addr_key])), []).append(
                        {"kind": "HOST", "data": data, "addr": addr}
                    )
            elif type_name == _FIXED_TYPES[version]:
                out.setdefault(int(ipaddress.ip_address(data[addr_key])), []).append(
                    {"kind": "FA", "data": data, "addr": data}
                )
        return out

    def _range_types(self, nv: str, version: int) -> list[tuple[int, int, str]]:
        spans = []
        for data in self._ranges(nv):
            start = ipaddress.ip_address(data["start_addr"])
            if start.version != version:
                continue
            kind = (
                "RESERVED_RANGE"
                if data.get("server_association_type", "NONE") == "NONE"
                else "DHCP_RANGE"
            )
            spans.append((int(start), int(ipaddress.ip_address(data["end_addr"])), kind))
        return spans

    def _address_entry(
        self,
        type_name: str,
        net: IPNetwork,
        nv: str,
        index: int,
        ip_int: int,
        objects: list[dict[str, Any]],
        extra: UsedAddress | None,
        spans: list[tuple[int, int, str]],
    ) -> dict[str, Any]:
        ip = ipaddress.ip_address(ip_int)
        types: list[str] = []
        names: list[str] = []
        refs: list[str] = []
        usage: list[str] = []
        mac: str | None = None
        duid: str | None = None
        for obj in objects:
            data, addr = obj["data"], obj["addr"]
            types.append(obj["kind"])
            refs.append(str(data["_ref"]))
            if data.get("name"):
                names.append(str(data["name"]))
            if obj["kind"] == "HOST" and data.get("configure_for_dns"):
                usage.append("DNS")
            if obj["kind"] == "FA" or addr.get("configure_for_dhcp"):
                usage.append("DHCP")
            mac = mac or addr.get("mac")
            duid = duid or addr.get("duid")
        if extra is not None:
            types.extend(extra.types)
            names.extend(extra.names)
            usage.extend(extra.usage)
        if net.version == 4 and net.prefixlen < 31:
            if ip_int == int(net.network_address):
                types.append("NETWORK")
            elif ip_int == int(net.broadcast_address):
                types.append("BROADCAST")
        used = bool(types)
        types.extend(kind for start, end, kind in spans if start <= ip_int <= end)
        name_ip = str(ip) if net.version == 4 else quote(str(ip), safe="")
        internal = f"..ipv{net.version}_address${ip}/{index}"
        entry: dict[str, Any] = {
            "_ref": f"{type_name}/{_b64(internal)}:{name_ip}",
            "ip_address": str(ip),
            "is_conflict": False,
            "lease_state": "FREE",
            "names": names,
            "network": str(net),
            "network_view": nv,
            "objects": refs,
            "status": "USED" if used else "UNUSED",
            "types": types,
            "usage": sorted(set(usage), key=usage.index),
        }
        if net.version == 4:
            entry.update(dhcp_client_identifier="", username="")
            if mac:
                entry["mac_address"] = mac
        elif duid:
            entry["duid"] = duid
        return entry
