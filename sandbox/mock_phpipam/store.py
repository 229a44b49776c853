"""In-memory, thread-safe state of the phpIPAM mock: sections, subnets, addresses, users, apps.

Behaviour follows a real phpIPAM 1.8.2 (https://phpipam.net/api/api_documentation/) and its
source (https://github.com/phpipam/phpipam: ``api/controllers/{Addresses,Subnets,User}.php``,
``functions/classes/class.Addresses.php``, ``class.Subnets.php``). Every public method holds one
re-entrant lock, so a first-free lookup and the insert that follows it are atomic, like phpIPAM
1.8's default ``File`` API lock which serialises every write.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ADDRESS_KEYS",
    "Address",
    "App",
    "AppSecurity",
    "Clock",
    "IPAddress",
    "IPNetwork",
    "ManualClock",
    "PhpFatalError",
    "PhpipamError",
    "Section",
    "Seed",
    "Store",
    "StoreSettings",
    "Subnet",
    "User",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
AppSecurity = Literal["none", "ssl_token", "ssl_code"]
Clock = Callable[[], float]
"""A function returning the current time as POSIX seconds (``time.time`` by default)."""

#: Keys of an address object as the API returns it, in phpIPAM's order (transcript 4f).
ADDRESS_KEYS: tuple[str, ...] = (
    "id",
    "subnetId",
    "ip",
    "is_gateway",
    "description",
    "hostname",
    "mac",
    "owner",
    "tag",
    "deviceId",
    "location",
    "port",
    "note",
    "lastSeen",
    "excludePing",
    "PTRignore",
    "PTR",
    "firewallAddressObject",
    "editDate",
    "customer_id",
)

# Writable ``ipaddresses`` columns: API name -> (DB column, type, max length).
# Source: phpIPAM ``db/SCHEMA.sql`` and ``Common_api_functions::remap_keys`` (ip, tag, deviceId).
_COLUMNS: dict[str, tuple[str, type, int | None]] = {
    "is_gateway": ("is_gateway", int, None),
    "description": ("description", str, 64),
    "hostname": ("hostname", str, 255),
    "mac": ("mac", str, 20),
    "owner": ("owner", str, 128),
    "tag": ("state", int, None),
    "deviceId": ("switch", int, None),
    "location": ("location", int, None),
    "port": ("port", str, 32),
    "note": ("note", str, None),
    "lastSeen": ("lastSeen", str, None),
    "excludePing": ("excludePing", int, None),
    "PTRignore": ("PTRignore", int, None),
    "PTR": ("PTR", int, None),
    "firewallAddressObject": ("firewallAddressObject", str, None),
    "editDate": ("editDate", str, None),
    "customer_id": ("customer_id", int, None),
}
_ALIASES = {"ip": "ip_addr", "tag": "state", "deviceId": "switch"}
_DB_TO_API = {db: api for api, (db, _, _) in _COLUMNS.items()}
_ADDRESS_DEFAULTS: dict[str, Any] = {
    "is_gateway": 0,
    "description": None,
    "hostname": None,
    "mac": None,
    "owner": None,
    "tag": 2,
    "deviceId": None,
    "location": None,
    "port": None,
    "note": None,
    "lastSeen": "1970-01-01 00:00:01",
    "excludePing": 0,
    "PTRignore": 0,
    "PTR": 0,
    "firewallAddressObject": None,
    "editDate": None,
    "customer_id": None,
}
#: phpIPAM's default IP tags (table ``ipTags``): id -> name.
TAGS: dict[int, str] = {1: "Offline", 2: "Used", 3: "Reserved", 4: "DHCP"}
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([-:.]?[0-9a-fA-F]{2}){5}$")
_TOKEN_TTL = 21600

#: Counters of `Store.lockout_stats`.
_LOCKOUT_STATS = ("failed_logins", "lockouts", "blocked_requests")

_TIME_FMT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class JournalEntry:
    """One API request the mock answered: method, path and final HTTP status.

    Status 599 means the connection was dropped without an answer. ``client`` is the
    request's ``User-Agent`` (ipam-bridge sends ``ipam-bridge/<version> (<pod name>)``, so
    replicas can be told apart; empty when absent) and ``at`` the POSIX time in seconds the
    request arrived (0.0 when not given).
    """

    method: str
    path: str
    status: int
    client: str = ""
    at: float = 0.0


class PhpipamError(Exception):
    """An error phpIPAM answers with its JSON envelope.

    Parameters
    ----------
    code:
        The HTTP status and the envelope's ``code`` (400, 401, 403, 404, 409, 500, 503).
    message:
        The envelope's ``message``, verbatim as phpIPAM words it.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message


class PhpFatalError(Exception):
    """A PHP fatal error: phpIPAM answers HTTP 500 with an empty ``text/html`` body.

    Seen for ``DELETE /addresses/{ip}/{subnetId}/`` when the IP exists in no subnet
    (transcripts 6e and 7p: ``sizeof(false)`` TypeError in ``Addresses.php``).
    """


class ManualClock:
    """A clock for tests: time stands still until `advance` moves it.

    Parameters
    ----------
    start:
        The initial time in POSIX seconds (default: the real current time).
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        """Return the current (frozen) time in POSIX seconds."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` and return the new time."""
        with self._lock:
            self._now += seconds
            return self._now


@dataclass
class StoreSettings:
    """Server-wide switches (phpIPAM ``config.php`` and ``settings`` table equivalents).

    Attributes
    ----------
    stringify_results:
        Default of ``$api_stringify_results``: answer every value as a string. The request
        header ``Api-Stringify-Results`` overrides it per request.
    legacy_not_found:
        Behave like phpIPAM <= 1.4: "not found" answers are HTTP 200 with ``success: false``.
    enforce_ssl:
        Answer 503 ``SSL connection is required for API`` to apps with ``app_security``
        ``ssl_token``/``ssl_code`` over plain HTTP, as phpIPAM does. Off by default so the
        static app code token flow can be exercised over plain HTTP.
    api_enabled:
        False makes every API call answer 503 ``API server disabled``.
    token_ttl_seconds:
        User token lifetime (phpIPAM: 21600 s = 6 h, sliding).
    lockout:
        Block a source address after too many failed logins, as phpIPAM does (its
        ``loginAttempts`` table): more than ``max_login_failures`` failures, each within
        ``login_failure_window_seconds`` of the previous one, block every API call from
        that address (correct logins and valid tokens included) with 500 ``Your IP has
        been blocked for 5 minutes because of excessive login failures`` until
        ``block_seconds`` after the last failure. A successful login before that clears
        the count. On by default (phpIPAM has no switch); False turns it off.
    max_login_failures:
        Failed logins from one IP tolerated before it is blocked (phpIPAM: 10).
    login_failure_window_seconds:
        A failure counts with the previous ones when it comes within this many seconds of
        the last one (phpIPAM: 300 s); shorter in tests.
    block_seconds:
        How long a block lasts after the last failure (phpIPAM: 300 s).
    strict_sql_mode:
        MariaDB's ``STRICT_TRANS_TABLES``: True refuses a string longer than its column
        (``description varchar(64)``, ``owner varchar(128)``, ``hostname varchar(255)``...)
        with 500 ``Data too long``; False (default) cuts it to the column's length, as the
        measured phpIPAM 1.8.2 did (reference phpipam-api.md section 12).
    """

    stringify_results: bool = False
    legacy_not_found: bool = False
    enforce_ssl: bool = False
    api_enabled: bool = True
    token_ttl_seconds: int = _TOKEN_TTL
    lockout: bool = True
    max_login_failures: int = 10
    login_failure_window_seconds: float = 300.0
    block_seconds: float = 300.0
    strict_sql_mode: bool = False


@dataclass
class Section:
    """A phpIPAM section (table ``sections``)."""

    id: int
    name: str
    description: str | None = None


@dataclass
class Subnet:
    """A phpIPAM subnet (table ``subnets``).

    Attributes
    ----------
    network:
        The subnet, e.g. ``IPv4Network("10.20.0.0/24")``.
    is_full, is_pool, is_folder:
        phpIPAM flags: full subnets hand out nothing; pools hand out network and broadcast.
    master_subnet_id:
        Parent subnet id (0 = none). A subnet with children hands out no first free address.
    """

    id: int
    network: IPNetwork
    section_id: int
    description: str | None = None
    is_full: bool = False
    is_pool: bool = False
    is_folder: bool = False
    master_subnet_id: int = 0
    vlan_id: int | None = None
    vrf_id: int | None = None

    @property
    def cidr(self) -> str:
        """The subnet in CIDR notation (``10.20.0.0/24``)."""
        return self.network.with_prefixlen

    def bounds(self) -> tuple[int, int]:
        """Return the lowest and highest assignable address as integers.

        IPv4 below /31 that is not a pool skips network and broadcast; IPv6 never skips
        (``Subnets::subnet_boundaries``), so its first free address is the network itself.
        """
        low = int(self.network.network_address)
        high = int(self.network.broadcast_address)
        if self.network.version == 4 and self.network.prefixlen < 31 and not self.is_pool:
            return low + 1, high - 1
        return low, high

    def max_hosts(self) -> int:
        """Return how many addresses the subnet can hand out."""
        low, high = self.bounds()
        return max(high - low + 1, 0)


@dataclass
class Address:
    """A phpIPAM address row (table ``ipaddresses``).

    ``values`` holds the other columns by their API names (``tag``, ``deviceId``, ...).
    """

    id: int
    subnet_id: int
    ip: IPAddress
    values: dict[str, Any] = field(default_factory=lambda: dict(_ADDRESS_DEFAULTS))

    @property
    def is_gateway(self) -> bool:
        """The ``is_gateway`` column: True for the subnet's gateway row."""
        return bool(int(self.values.get("is_gateway") or 0))

    @property
    def hostname(self) -> str | None:
        """The hostname column."""
        value = self.values.get("hostname")
        return value if isinstance(value, str) else None

    def to_api(self, *, decimal_ip: bool = False) -> dict[str, Any]:
        """Return the address as the API shows it, keys in phpIPAM's order.

        ``decimal_ip`` reproduces the ``search_hostname`` quirk: the IP as a decimal string.
        """
        out: dict[str, Any] = {
            "id": self.id,
            "subnetId": self.subnet_id,
            "ip": str(int(self.ip)) if decimal_ip else str(self.ip),
        }
        for key in ADDRESS_KEYS[3:]:
            out[key] = self.values.get(key)
        return out


@dataclass
class User:
    """A phpIPAM user with its one API token (``users.token``, ``users.token_valid_until``)."""

    id: int
    username: str
    password: str = field(repr=False)
    token: str | None = field(default=None, repr=False)
    token_valid_until: int | None = None


@dataclass
class App:
    """A phpIPAM API app (table ``api``).

    Attributes
    ----------
    app_id:
        The name in the URL (``/api/<app_id>/...``).
    permissions:
        0 disabled, 1 read, 2 read/write, 3 read/write/admin.
    security:
        ``none`` or ``ssl_token`` (user token from ``POST /user/``) or ``ssl_code`` (the static
        app code is the token).
    code:
        The app code used as token by ``ssl_code`` apps.
    """

    app_id: str
    permissions: int = 2
    security: AppSecurity = "none"
    code: str | None = field(default=None, repr=False)


# ----------------------------------------------------------------------------- seed models


class _SeedModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SeedAddress(_SeedModel):
    """One address in a seed file."""

    id: int | None = None
    ip: str
    hostname: str | None = None
    description: str | None = None
    is_gateway: bool = False
    tag: int = 2
    mac: str | None = None
    note: str | None = None


class SeedSubnet(_SeedModel):
    """One subnet in a seed file; ``gateway`` adds an ``is_gateway`` address row."""

    id: int | None = None
    cidr: str
    description: str | None = None
    gateway: str | None = None
    is_full: bool = False
    is_pool: bool = False
    is_folder: bool = False
    master_subnet_id: int = 0
    addresses: list[SeedAddress] = Field(default_factory=list)


class SeedSection(_SeedModel):
    """One section in a seed file, with its subnets."""

    id: int | None = None
    name: str
    description: str | None = None
    subnets: list[SeedSubnet] = Field(default_factory=list)


class SeedUser(_SeedModel):
    """One user in a seed file."""

    username: str
    password: str


class SeedApp(_SeedModel):
    """One API app in a seed file."""

    id: str
    permissions: int = Field(default=2, ge=0, le=3)
    security: AppSecurity = "none"
    code: str | None = None


class SeedSettings(_SeedModel):
    """Server switches in a seed file (see `StoreSettings`)."""

    stringify_results: bool = False
    legacy_not_found: bool = False
    enforce_ssl: bool = False
    api_enabled: bool = True
    token_ttl_seconds: int = Field(default=_TOKEN_TTL, gt=0)
    lockout: bool = True
    max_login_failures: int = Field(default=10, ge=0)
    login_failure_window_seconds: float = Field(default=300.0, gt=0)
    block_seconds: float = Field(default=300.0, gt=0)
    strict_sql_mode: bool = False


class Seed(_SeedModel):
    """A whole seed document (YAML or JSON); see ``mock_phpipam/seed.example.yaml``."""

    settings: SeedSettings | None = None
    users: list[SeedUser] = Field(default_factory=list)
    apps: list[SeedApp] = Field(default_factory=list)
    sections: list[SeedSection] = Field(default_factory=list)

    @classmethod
    def from_file(cls, path: str | Path) -> Seed:
        """Read and validate a seed from a ``.yaml``/``.yml`` or ``.json`` file.

        Raises
        ------
        OSError
            When the file cannot be read.
        pydantic.ValidationError, yaml.YAMLError, json.JSONDecodeError
            When its content is not a valid seed.
        """
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith(".json"):
            return cls.model_validate(json.loads(text))
        return cls.model_validate(yaml.safe_load(text) or {})


# ----------------------------------------------------------------------------- the store


def _format_time(ts: float) -> str:
    return time.strftime(_TIME_FMT, time.localtime(ts))


def parse_ip(text: Any) -> IPAddress | None:
    """Return ``text`` parsed as an IPv4/IPv6 address, or None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _is_numeric(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and value.strip().lstrip("+-").isdigit()


class Store:
    """The mock's whole state, safe to use from the server thread and from test code.

    Parameters
    ----------
    seed:
        Initial content; `reset` returns to it.
    clock:
        Returns POSIX seconds; token expiry and login blocks use it (tests pass a
        `ManualClock`).
    settings:
        Server switches; a seed's ``settings`` section overrides them.

    Notes
    -----
    Lookups return None or empty lists; writes raise `PhpipamError` carrying phpIPAM's own
    status and message (the HTTP layer in `mock_phpipam.app` picks per-endpoint messages for
    lookups).
    """

    def __init__(
        self,
        seed: Seed | Mapping[str, Any] | None = None,
        *,
        clock: Clock = time.time,
        settings: StoreSettings | None = None,
    ) -> None:
        self.clock = clock
        self._lock = threading.RLock()
        self._base_settings = settings or StoreSettings()
        self._initial_seed = self._coerce_seed(seed)
        #: Every API request answered (see `requests`); kept across `reset`.
        self.journal: list[JournalEntry] = []
        self._clear()
        if self._initial_seed is not None:
            self.apply_seed(self._initial_seed)

    # ------------------------------------------------------------------ construction, seeding

    @staticmethod
    def _coerce_seed(seed: Seed | Mapping[str, Any] | None) -> Seed | None:
        if seed is None or isinstance(seed, Seed):
            return seed
        return Seed.model_validate(dict(seed))

    @classmethod
    def from_file(cls, path: str | Path, *, clock: Clock = time.time) -> Store:
        """Build a store seeded from a YAML or JSON file (see `Seed.from_file`)."""
        return cls(Seed.from_file(path), clock=clock)

    def _clear(self) -> None:
        with self._lock:
            self.settings = StoreSettings(**vars(self._base_settings))
            self.sections: dict[int, Section] = {}
            self.subnets: dict[int, Subnet] = {}
            self.addresses: dict[int, Address] = {}
            # (subnet id, int(ip)) -> address id: finds a subnet's row at an IP in O(1).
            self._slots: dict[tuple[int, int], int] = {}
            self.users: dict[int, User] = {}
            self.apps: dict[str, App] = {}
            self._next_address_id = 1
            self._login_failures: dict[str, tuple[int, float]] = {}
            self._lockout_stats: dict[str, int] = dict.fromkeys(_LOCKOUT_STATS, 0)

    def clear(self) -> None:
        """Remove everything (objects, tokens, login failures) and restore default settings."""
        self._clear()

    def reset(self) -> None:
        """Return to the seed given at construction (tokens and login failures are dropped)."""
        with self._lock:
            self._clear()
            if self._initial_seed is not None:
                self.apply_seed(self._initial_seed)

    def apply_seed(self, seed: Seed | Mapping[str, Any]) -> None:
        """Add a seed's objects on top of the current state (and apply its settings).

        Raises
        ------
        pydantic.ValidationError
            When a mapping is not a valid `Seed`.
        ValueError
            When an object is invalid (bad CIDR or IP, duplicate id or address).
        """
        model = self._coerce_seed(seed)
        assert model is not None
        with self._lock:
            if model.settings is not None:
                for key, value in model.settings.model_dump().items():
                    setattr(self.settings, key, value)
            for user in model.users:
                self.add_user(user.username, user.password)
            for app in model.apps:
                self.add_app(
                    app.id, permissions=app.permissions, security=app.security, code=app.code
                )
            for section in model.sections:
                sec = self.add_section(
                    section.name, description=section.description, section_id=section.id
                )
                for sub in section.subnets:
                    subnet = self.add_subnet(
                        sub.cidr,
                        section_id=sec.id,
                        subnet_id=sub.id,
                        description=sub.description,
                        gateway=sub.gateway,
                        is_full=sub.is_full,
                        is_pool=sub.is_pool,
                        is_folder=sub.is_folder,
                        master_subnet_id=sub.master_subnet_id,
                    )
                    for addr in sub.addresses:
                        self.add_address(
                            subnet.id,
                            addr.ip,
                            address_id=addr.id,
                            hostname=addr.hostname,
                            description=addr.description,
                            is_gateway=addr.is_gateway,
                            tag=addr.tag,
                            mac=addr.mac,
                            note=addr.note,
                        )

    def add_user(self, username: str, password: str) -> User:
        """Add (or replace the password of) a user; returns it."""
        with self._lock:
            for user in self.users.values():
                if user.username == username:
                    user.password = password
                    return user
            user = User(id=max(self.users, default=0) + 1, username=username, password=password)
            self.users[user.id] = user
            return user

    def add_app(
        self,
        app_id: str,
        *,
        permissions: int = 2,
        security: AppSecurity = "none",
        code: str | None = None,
    ) -> App:
        """Add or replace an API app.

        Raises
        ------
        ValueError
            When an ``ssl_code`` app has no code.
        """
        if security == "ssl_code" and not code:
            raise ValueError(f"app {app_id!r}: app_security ssl_code needs an app code")
        with self._lock:
            app = App(app_id=app_id, permissions=permissions, security=security, code=code)
            self.apps[app_id] = app
            return app

    def add_section(
        self, name: str, *, description: str | None = None, section_id: int | None = None
    ) -> Section:
        """Add a section (or return the existing one with that id or name)."""
        with self._lock:
            for sec in self.sections.values():
                if sec.id == section_id or (section_id is None and sec.name == name):
                    return sec
            sid = section_id if section_id is not None else max(self.sections, default=0) + 1
            section = Section(id=sid, name=name, description=description)
            self.sections[sid] = section
            return section

    def add_subnet(
        self,
        cidr: str,
        *,
        section_id: int | None = None,
        subnet_id: int | None = None,
        description: str | None = None,
        gateway: str | None = None,
        is_full: bool = False,
        is_pool: bool = False,
        is_folder: bool = False,
        master_subnet_id: int = 0,
    ) -> Subnet:
        """Add a subnet, and its gateway as an ``is_gateway`` address when ``gateway`` is set.

        Without ``section_id`` the subnet goes into the first section (created as
        ``default`` when there is none).

        Raises
        ------
        ValueError
            When ``cidr`` is not a network address with prefix, the id is taken, or the
            gateway is not a valid address of the subnet.
        """
        network = ipaddress.ip_network(cidr, strict=True)
        with self._lock:
            if section_id is None:
                section_id = min(self.sections) if self.sections else self.add_section("default").id
            elif section_id not in self.sections:
                self.add_section(f"section-{section_id}", section_id=section_id)
            sid = subnet_id if subnet_id is not None else max(self.subnets, default=0) + 1
            if sid in self.subnets:
                raise ValueError(f"subnet id {sid} already exists")
            subnet = Subnet(
                id=sid,
                network=network,
                section_id=section_id,
                description=description,
                is_full=is_full,
                is_pool=is_pool,
                is_folder=is_folder,
                master_subnet_id=master_subnet_id,
            )
            self.subnets[sid] = subnet
            if gateway:
                self.add_address(sid, gateway, is_gateway=True, description="gateway")
            return subnet

    def add_address(
        self,
        subnet_id: int,
        ip: str,
        *,
        address_id: int | None = None,
        hostname: str | None = None,
        description: str | None = None,
        is_gateway: bool = False,
        tag: int = 2,
        mac: str | None = None,
        note: str | None = None,
    ) -> Address:
        """Register ``ip`` in a subnet directly (seeding; no API validation of keys).

        Raises
        ------
        ValueError
            When the subnet is unknown, the IP is not assignable in it or already exists
            there, or the id is taken.
        """
        with self._lock:
            subnet = self.subnets.get(subnet_id)
            if subnet is None:
                raise ValueError(f"subnet id {subnet_id} does not exist")
            addr = parse_ip(ip)
            if addr is None or not self._assignable(subnet, addr):
                raise ValueError(f"{ip} is not a valid address for subnet {subnet.cidr}")
            if self._find_in_subnet(subnet_id, addr) is not None:
                raise ValueError(f"{ip} already exists in subnet {subnet.cidr}")
            if address_id is not None and address_id in self.addresses:
                raise ValueError(f"address id {address_id} already exists")
            values = dict(_ADDRESS_DEFAULTS)
            values.update(
                hostname=hostname,
                description=description,
                tag=tag,
                mac=mac,
                note=note,
                is_gateway=int(is_gateway),
            )
            return self._insert(subnet, addr, values, address_id)

    # ------------------------------------------------------------------ internal helpers

    @staticmethod
    def _assignable(subnet: Subnet, ip: IPAddress) -> bool:
        if ip.version != subnet.network.version:
            return False
        low, high = subnet.bounds()
        return low <= int(ip) <= high

    def _find_in_subnet(self, subnet_id: int, ip: IPAddress) -> Address | None:
        aid = self._slots.get((subnet_id, int(ip)))
        addr = self.addresses.get(aid) if aid is not None else None
        return addr if addr is not None and addr.ip == ip else None

    def _forget(self, addr: Address) -> None:
        """Remove a row (the caller holds the lock)."""
        del self.addresses[addr.id]
        self._slots.pop((addr.subnet_id, int(addr.ip)), None)

    def _insert(
        self, subnet: Subnet, ip: IPAddress, values: dict[str, Any], address_id: int | None
    ) -> Address:
        aid = address_id if address_id is not None else self._next_address_id
        self._next_address_id = max(self._next_address_id, aid + 1)
        if values.get("is_gateway"):
            self._remove_gateway(subnet.id)
        addr = Address(id=aid, subnet_id=subnet.id, ip=ip, values=values)
        self.addresses[aid] = addr
        self._slots[(subnet.id, int(ip))] = aid
        return addr

    def _remove_gateway(self, subnet_id: int) -> None:
        # phpIPAM ``Addresses::remove_gateway``: one gateway per subnet.
        for addr in self.addresses.values():
            if addr.subnet_id == subnet_id and addr.values.get("is_gateway"):
                addr.values["is_gateway"] = 0

    def _has_children(self, subnet_id: int) -> bool:
        return any(s.master_subnet_id == subnet_id for s in self.subnets.values())

    def _first_free_int(self, subnet: Subnet) -> int | None:
        # ``Addresses::get_first_available_address``: any row counts as taken.
        if subnet.is_folder or self._has_children(subnet.id):
            return None
        used = {int(a.ip) for a in self.addresses.values() if a.subnet_id == subnet.id}
        if len(used) >= subnet.max_hosts():
            return None
        low, high = subnet.bounds()
        candidate = low
        while candidate <= high:
            if candidate not in used:
                return candidate
            candidate += 1
        return None

    def _prepare_values(
        self, fields: Mapping[str, Any], *, base: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Validate request keys and values; return column values by API name.

        Mirrors ``validate_create_update_common`` and ``validate_keys``.
        """
        values = dict(base if base is not None else _ADDRESS_DEFAULTS)
        # phpIPAM order: MAC, device, state (tag) checks, then unknown keys, then the DB.
        mac = fields.get("mac")
        if mac not in (None, ""):
            if not isinstance(mac, str) or not _MAC_RE.match(mac.strip()):
                raise PhpipamError(400, "Invalid MAC address")
            digits = re.sub(r"[^0-9a-fA-F]", "", mac).lower()
            fields = {**fields, "mac": ":".join(digits[i : i + 2] for i in range(0, 12, 2))}
        for key in ("deviceId", "switch"):
            device = fields.get(key)
            if device not in (None, "", 0, "0"):
                raise PhpipamError(400, "Device does not exist")  # the mock has no devices
        for key in ("tag", "state"):
            if key in fields and fields[key] is not None:
                state = fields[key]
                if state != "" and not _is_numeric(state):
                    raise PhpipamError(400, "Invalid state")
                if state == "" or int(state) not in TAGS:
                    raise PhpipamError(400, "Tag does not exist")
        for key, raw in fields.items():
            api_key = _DB_TO_API.get(key, key)
            if api_key not in _COLUMNS:
                raise PhpipamError(400, f"Invalid request key {key}")
            db_name, kind, max_len = _COLUMNS[api_key]
            values[api_key] = self._db_value(db_name, kind, max_len, raw)
        return values

    def _db_value(self, column: str, kind: type, max_len: int | None, raw: Any) -> Any:
        # Wrong types fail the INSERT/UPDATE (500); a long string fails under MariaDB's strict
        # mode and is cut to the column's length otherwise (`StoreSettings.strict_sql_mode`).
        if raw is None:
            return None
        if kind is int:
            if isinstance(raw, bool):
                return int(raw)
            if raw == "":
                return None
            if not _is_numeric(raw):
                raise PhpipamError(
                    500,
                    f"Error: SQLSTATE[22007]: Invalid datetime format: 1366 Incorrect integer "
                    f"value: '{raw}' for column `phpipam`.`ipaddresses`.`{column}` at row 1",
                )
            return int(raw)
        text = ("1" if raw else "") if isinstance(raw, bool) else str(raw)
        if max_len is not None and len(text) > max_len:
            if not self.settings.strict_sql_mode:
                return text[:max_len]
            raise PhpipamError(
                500,
                "Error: SQLSTATE[22001]: String data, right truncated: 1406 Data too long "
                f"for column '{column}' at row 1",
            )
        return text

    @staticmethod
    def _remap(fields: Mapping[str, Any]) -> dict[str, Any]:
        # ``remap_keys``: API names -> DB names for ip/tag/deviceId, everything else as sent.
        out: dict[str, Any] = {}
        for key, value in fields.items():
            out[_ALIASES.get(key, key)] = value
        return out

    # ------------------------------------------------------------------ auth

    def _now(self) -> float:
        return float(self.clock())

    def format_expiry(self, user: User) -> str | None:
        """Return the user's token expiry as phpIPAM prints it (server local time), or None."""
        if user.token_valid_until is None:
            return None
        return _format_time(user.token_valid_until)

    @property
    def lockout_stats(self) -> dict[str, int]:
        """Counters of the login lock-out (a copy).

        ``failed_logins``: refused logins (wrong user or password), counted also with the
        lock-out off; ``lockouts``: how often a source got blocked; ``blocked_requests``:
        API calls refused because their source was blocked.
        """
        with self._lock:
            return dict(self._lockout_stats)

    def login_failures(self, remote: str) -> int:
        """Return the failed logins counted now against ``remote`` (0 when none or expired)."""
        with self._lock:
            entry = self._login_failures.get(remote)
            if entry is None or self._expired(entry):
                return 0
            return entry[0]

    def is_blocked(self, remote: str) -> bool:
        """Return True while ``remote`` is blocked (see `StoreSettings.lockout`)."""
        with self._lock:
            entry = self._login_failures.get(remote)
            return (
                self.settings.lockout
                and entry is not None
                and entry[0] > self.settings.max_login_failures
                and not self._expired(entry)
            )

    def _expired(self, entry: tuple[int, float]) -> bool:
        count, last = entry
        if count > self.settings.max_login_failures:
            return self._now() - last > self.settings.block_seconds
        return self._now() - last > self.settings.login_failure_window_seconds

    def check_blocked(self, remote: str) -> None:
        """Raise when ``remote`` failed to log in too often recently (``validate_block``).

        Raises
        ------
        PhpipamError
            500 ``Your IP has been blocked for 5 minutes because of excessive login failures``.
        """
        with self._lock:
            if not self.settings.lockout:
                return
            entry = self._login_failures.get(remote)
            if entry is None:
                return
            if self._expired(entry):
                del self._login_failures[remote]
                return
            if entry[0] > self.settings.max_login_failures:
                self._lockout_stats["blocked_requests"] += 1
                raise PhpipamError(
                    500,
                    "Your IP has been blocked for 5 minutes because of excessive login failures",
                )

    def login(self, username: str, password: str, remote: str) -> User:
        """Authenticate a user and give it a token (``POST /user/``).

        A still-valid token is returned again with its expiry slid forward; otherwise a new
        24-character base64url token valid for ``token_ttl_seconds`` is made. A failure
        counts towards blocking ``remote``; a success clears its count.

        Raises
        ------
        PhpipamError
            500 ``Invalid username or password``, or the block error of `check_blocked`.
        """
        with self._lock:
            self.check_blocked(remote)
            user = next((u for u in self.users.values() if u.username == username), None)
            if user is None or not secrets.compare_digest(user.password, password):
                self._lockout_stats["failed_logins"] += 1
                if self.settings.lockout:
                    entry = self._login_failures.get(remote)
                    count = 0 if entry is None or self._expired(entry) else entry[0]
                    self._login_failures[remote] = (count + 1, self._now())
                    if count + 1 == self.settings.max_login_failures + 1:
                        self._lockout_stats["lockouts"] += 1
                raise PhpipamError(500, "Invalid username or password")
            self._login_failures.pop(remote, None)
            now = self._now()
            if user.token and user.token_valid_until is not None and user.token_valid_until >= now:
                self._slide(user)
            else:
                user.token = secrets.token_urlsafe(18)
                user.token_valid_until = int(now) + self.settings.token_ttl_seconds
            return user

    def _slide(self, user: User) -> None:
        # ``refresh_token_expiration``: write only when it moves expiry by >= 60 s.
        new = int(self._now()) + self.settings.token_ttl_seconds
        if user.token_valid_until is not None and new - user.token_valid_until < 60:
            return
        user.token_valid_until = new

    def user_for_token(self, token: str) -> tuple[User | None, bool]:
        """Return the user owning ``token`` and whether the token has expired."""
        with self._lock:
            for user in self.users.values():
                if user.token is not None and secrets.compare_digest(user.token, token):
                    expired = user.token_valid_until is None or user.token_valid_until < self._now()
                    return user, expired
            return None, False

    def authenticate(self, token: str | None, *, slide: bool = True) -> User:
        """Validate a user token on a resource controller and slide its expiry.

        Raises
        ------
        PhpipamError
            401 ``Unauthorized`` when the token is missing, unknown or expired.
        """
        with self._lock:
            if not token:
                raise PhpipamError(401, "Unauthorized")
            user, expired = self.user_for_token(token)
            if user is None or expired:
                raise PhpipamError(401, "Unauthorized")
            if slide:
                self._slide(user)
            return user

    def authenticate_user_controller(self, token: str | None) -> User:
        """Validate a user token on the ``user`` controller (no sliding).

        Raises
        ------
        PhpipamError
            403 ``Please provide token`` / ``Invalid token`` / ``Token expired``.
        """
        with self._lock:
            if token is None:
                raise PhpipamError(403, "Please provide token")
            user, expired = self.user_for_token(token)
            if user is None:
                raise PhpipamError(403, "Invalid token")
            if expired:
                raise PhpipamError(403, "Token expired")
            return user

    def refresh(self, user: User) -> None:
        """Slide a user's token expiry (``PATCH /user/``)."""
        with self._lock:
            self._slide(user)

    def logout(self, user: User) -> None:
        """Remove a user's token for every client of that user (``DELETE /user/``)."""
        with self._lock:
            user.token = None
            user.token_valid_until = None

    # ------------------------------------------------------------------ subnets

    def get_subnet(self, subnet_id: Any) -> Subnet | None:
        """Return the subnet with that id (int or numeric string), or None."""
        if not _is_numeric(subnet_id):
            return None
        with self._lock:
            return self.subnets.get(int(subnet_id))

    def subnets_by_cidr(self, net: str, mask: str) -> list[Subnet]:
        """Return the subnets whose network and mask are ``net``/``mask`` (any section)."""
        try:
            wanted = ipaddress.ip_network(f"{net}/{mask}", strict=False)
        except ValueError:
            return []
        with self._lock:
            return [
                s for s in sorted(self.subnets.values(), key=lambda s: s.id) if s.network == wanted
            ]

    def list_subnets(self) -> list[Subnet]:
        """Return every subnet ordered by id (a snapshot)."""
        with self._lock:
            return sorted(self.subnets.values(), key=lambda s: s.id)

    def list_sections(self) -> list[Section]:
        """Return every section ordered by id (a snapshot)."""
        with self._lock:
            return sorted(self.sections.values(), key=lambda s: s.id)

    def has_children(self, subnet_id: int) -> bool:
        """Return True when another subnet names this one as its master."""
        with self._lock:
            return self._has_children(subnet_id)

    def gateway_of(self, subnet_id: int) -> Address | None:
        """Return the subnet's ``is_gateway`` address row, or None."""
        with self._lock:
            for addr in sorted(self.addresses.values(), key=lambda a: a.id):
                if addr.subnet_id == subnet_id and addr.values.get("is_gateway"):
                    return addr
            return None

    def subnet_addresses(self, subnet_id: int) -> list[Address]:
        """Return the subnet's address rows ordered by IP."""
        with self._lock:
            rows = [a for a in self.addresses.values() if a.subnet_id == subnet_id]
            return sorted(rows, key=lambda a: int(a.ip))

    def first_free(self, subnet_id: int) -> IPAddress | None:
        """Return the lowest free address of the subnet without reserving it, or None."""
        with self._lock:
            subnet = self.subnets.get(subnet_id)
            if subnet is None or subnet.is_full:
                return None
            value = self._first_free_int(subnet)
            return None if value is None else ipaddress.ip_address(value)

    def usage(self, subnet_id: int) -> dict[str, Any] | None:
        """Return ``Subnets::calculate_subnet_usage`` for the subnet, or None when unknown.

        Key order and value types follow transcripts 2a, 2o and 3l: per-tag counts as
        numbers, ``used``/``freehosts``/``maxhosts`` as strings (``used`` is the number 0 on an
        empty subnet), percentages rounded to 2 decimals.
        """
        with self._lock:
            subnet = self.subnets.get(subnet_id)
            if subnet is None:
                return None
            rows = [a for a in self.addresses.values() if a.subnet_id == subnet_id]
        maxhosts = subnet.max_hosts()
        total = len(rows)
        counts: dict[str, int] = {"Used": 0, "Reserved": 0}
        for addr in rows:
            name = TAGS.get(int(addr.values.get("tag") or 2), "Used")
            counts[name] = counts.get(name, 0) + 1

        def percent(n: int) -> float | int:
            value = round(n / maxhosts * 100, 2) if maxhosts else 0
            return int(value) if float(value).is_integer() else value

        out: dict[str, Any] = dict(counts)
        if total == 0:
            out["used"] = 0
        for index, name in enumerate(counts):
            out[f"{name}_percent"] = percent(counts[name])
            if index == 0 and total:
                out["used"] = str(total)
        free = max(maxhosts - total, 0)
        out["freehosts"] = str(free)
        out["freehosts_percent"] = percent(free)
        out["maxhosts"] = str(maxhosts)
        return out

    # ------------------------------------------------------------------ addresses: reads

    def get_address(self, address_id: Any) -> Address | None:
        """Return the address with that id (int or numeric string), or None."""
        if not _is_numeric(address_id):
            return None
        with self._lock:
            return self.addresses.get(int(address_id))

    def all_addresses(self) -> list[Address]:
        """Return every address row ordered by id."""
        with self._lock:
            return sorted(self.addresses.values(), key=lambda a: a.id)

    def search_ip(self, ip: IPAddress) -> list[Address]:
        """Return the rows with this IP in any subnet, ordered by id."""
        with self._lock:
            return [a for a in self.all_addresses() if a.ip == ip]

    def search_hostname(self, hostname: str) -> list[Address]:
        """Return rows whose hostname equals ``hostname`` case-insensitively, by id."""
        wanted = hostname.casefold()
        with self._lock:
            return [
                a
                for a in self.all_addresses()
                if a.hostname is not None and a.hostname.casefold() == wanted
            ]

    def search_hostbase(self, prefix: str) -> list[Address]:
        """Return rows whose hostname starts with ``prefix`` (case-insensitive), by hostname."""
        wanted = prefix.casefold()
        with self._lock:
            rows = [
                a
                for a in self.all_addresses()
                if a.hostname is not None and a.hostname.casefold().startswith(wanted)
            ]
            return sorted(rows, key=lambda a: ((a.hostname or "").casefold(), a.id))

    # ------------------------------------------------------------------ addresses: writes

    def create_address(self, fields: Mapping[str, Any]) -> Address:
        """Create an address with an explicit IP (``POST /addresses/``).

        Parameters
        ----------
        fields:
            The request parameters: ``subnetId``, ``ip`` (or ``ip_addr``) and columns such as
            ``hostname``, ``description``, ``is_gateway``, ``tag``.

        Raises
        ------
        PhpipamError
            400 ``SubnetId must be numeric``; 404 ``Invalid subnet Id``; 409 ``IP address
            already exists``; 400 ``Invalid MAC address``/``Tag does not exist``/``Invalid
            request key <k>``; 500 ``<ip> is not a valid address for subnet <cidr>`` (with
            ``0.0.0.0`` for an unparsable or missing IP); 500 for DB type/length errors.
        """
        params = self._remap(fields)
        with self._lock:
            subnet_ref = params.pop("subnetId", None)
            if not _is_numeric(subnet_ref):
                raise PhpipamError(400, "SubnetId must be numeric")
            subnet = self.subnets.get(int(subnet_ref))
            if subnet is None:
                raise PhpipamError(404, "Invalid subnet Id")
            return self._create_in(subnet, params)

    def _create_in(self, subnet: Subnet, params: dict[str, Any]) -> Address:
        raw_ip = params.pop("ip_addr", None)
        ip = parse_ip(raw_ip)
        if ip is not None and self._find_in_subnet(subnet.id, ip) is not None:
            raise PhpipamError(409, "IP address already exists")
        params.pop("id", None)
        values = self._prepare_values(params)
        if ip is None or not self._assignable(subnet, ip):
            shown = "0.0.0.0" if ip is None else str(ip)
            raise PhpipamError(500, f"{shown} is not a valid address for subnet {subnet.cidr}")
        return self._insert(subnet, ip, values, None)

    def claim_first_free(self, subnet_ref: Any, fields: Mapping[str, Any]) -> Address:
        """Register the subnet's first free address atomically (``POST first_free``).

        Parameters
        ----------
        subnet_ref:
            The subnet id from the URL; a ``subnetId`` in ``fields`` wins over it.
        fields:
            Columns to store (``hostname``, ``description`` defaulting to ``API created``,
            ...); an ``ip`` is ignored.

        Raises
        ------
        PhpipamError
            400 ``Invalid subnet identifier``; 404 ``No free addresses found (subnet is
            full)`` for an ``isFull`` subnet; 404 ``No free addresses found``; the key and
            value errors of `create_address`.
        """
        params = self._remap(fields)
        with self._lock:
            if "subnetId" in params:
                subnet_ref = params.pop("subnetId")
            subnet = self.get_subnet(subnet_ref)
            if subnet is None:
                raise PhpipamError(400, "Invalid subnet identifier")
            if subnet.is_full:
                raise PhpipamError(404, "No free addresses found (subnet is full)")
            value = self._first_free_int(subnet)
            if value is None:
                raise PhpipamError(404, "No free addresses found")
            params["ip_addr"] = str(ipaddress.ip_address(value))
            params.setdefault("description", "API created")
            return self._create_in(subnet, params)

    def update_address(self, address_id: Any, fields: Mapping[str, Any]) -> Address:
        """Change columns of an address (``PATCH``/``PUT /addresses/{id}/``).

        Raises
        ------
        PhpipamError
            400 ``IP address cannot be changed`` / ``Subnet cannot be changed``; 404
            ``Address does not exist``; 400 ``No data provided``; the key and value errors
            of `create_address`.
        """
        params = self._remap(fields)
        if "ip_addr" in params:
            raise PhpipamError(400, "IP address cannot be changed")
        if "subnetId" in params:
            raise PhpipamError(400, "Subnet cannot be changed")
        with self._lock:
            addr = self.get_address(address_id)
            if addr is None:
                raise PhpipamError(404, "Address does not exist")
            if not params:
                raise PhpipamError(400, "No data provided")
            params.pop("id", None)
            values = self._prepare_values(params, base=addr.values)
            values["editDate"] = _format_time(self._now())  # ON UPDATE CURRENT_TIMESTAMP
            if values.get("is_gateway") and not addr.values.get("is_gateway"):
                self._remove_gateway(addr.subnet_id)
            addr.values = values
            return addr

    def delete_address(self, address_id: Any) -> Address:
        """Delete an address by id (``DELETE /addresses/{id}/``).

        Raises
        ------
        PhpipamError
            404 ``Address does not exist``.
        """
        with self._lock:
            addr = self.get_address(address_id)
            if addr is None:
                raise PhpipamError(404, "Address does not exist")
            self._forget(addr)
            return addr

    def delete_address_by_ip(self, ip_text: str, subnet_ref: Any) -> Address:
        """Delete an address by IP and subnet id (``DELETE /addresses/{ip}/{subnetId}/``).

        Raises
        ------
        PhpipamError
            404 ``No addresses found`` when the IP exists only in other subnets.
        PhpFatalError
            When the IP exists in no subnet at all (phpIPAM 1.8.2 crashes there).
        """
        ip = parse_ip(ip_text)
        with self._lock:
            rows = self.search_ip(ip) if ip is not None else []
            if not rows:
                raise PhpFatalError("sizeof(): Argument #1 must be of type Countable|array")
            match = [a for a in rows if str(a.subnet_id) == str(subnet_ref).strip()]
            if not match:
                raise PhpipamError(404, "No addresses found")
            self._forget(match[0])
            return match[0]

    # ------------------------------------------------------------------ admin edits

    def locate(self, ip: str, *, subnet_id: int | None = None) -> Address:
        """Return the one row at ``ip`` (in subnet ``subnet_id`` when given).

        Any notation of the address matches (``2001:0db8::5`` finds ``2001:db8::5``).

        Raises
        ------
        ValueError
            When ``ip`` is not an IP address, or several subnets hold it and ``subnet_id``
            does not say which.
        LookupError
            When no row (of that subnet) holds it.
        """
        address = parse_ip(ip)
        if address is None:
            raise ValueError(f"{ip!r} is not an IP address")
        with self._lock:
            rows = [
                a
                for a in self.search_ip(address)
                if subnet_id is None or a.subnet_id == int(subnet_id)
            ]
            if not rows:
                where = f" in subnet {subnet_id}" if subnet_id is not None else ""
                raise LookupError(f"no address {address}{where}")
            if len(rows) > 1:
                subnets = ", ".join(str(a.subnet_id) for a in rows)
                raise ValueError(f"{address} exists in subnets {subnets}: name the subnet")
            return rows[0]

    def edit_address(
        self, ip: str, values: Mapping[str, Any], *, subnet_id: int | None = None
    ) -> Address:
        """Change columns of the row at ``ip`` behind the API's back (a person in the web UI).

        Parameters
        ----------
        ip, subnet_id:
            Which row (see `locate`).
        values:
            Columns by their API names (``hostname``, ``description``, ``note``, ``tag``,
            ``mac``, ``owner``, ...); the address and subnet cannot be changed. ``editDate``
            is set to now, as the database does.

        Raises
        ------
        ValueError
            For an unknown or unchangeable column, or a value phpIPAM would reject; and as
            `locate`.
        LookupError
            As `locate`.
        """
        bad = sorted(k for k in values if k not in _COLUMNS or k == "is_gateway")
        if bad:
            raise ValueError(f"cannot set {', '.join(bad)} (known: hostname, description, ...)")
        with self._lock:
            addr = self.locate(ip, subnet_id=subnet_id)
            try:
                updated = self._prepare_values(dict(values), base=addr.values)
            except PhpipamError as exc:
                raise ValueError(exc.message) from None
            updated["editDate"] = _format_time(self._now())
            addr.values = updated
            return addr

    def remove_address(self, ip: str, *, subnet_id: int | None = None) -> Address:
        """Delete the row at ``ip`` behind the API's back; return it.

        Raises
        ------
        ValueError, LookupError
            As `locate`.
        """
        with self._lock:
            addr = self.locate(ip, subnet_id=subnet_id)
            self._forget(addr)
            return addr

    # ------------------------------------------------------------------ inspection

    def find_user(self, username: str) -> User | None:
        """Return the user with that name, or None."""
        with self._lock:
            return next((u for u in self.users.values() if u.username == username), None)

    def record(
        self, method: str, path: str, status: int, *, client: str = "", at: float = 0.0
    ) -> None:
        """Append one API request to `journal` (the HTTP layer calls this).

        ``client`` is its ``User-Agent``, ``at`` the POSIX time it arrived (see
        `JournalEntry`).
        """
        with self._lock:
            self.journal.append(JournalEntry(method, path, status, client, at))

    def requests(self, *, writes_only: bool = False) -> list[JournalEntry]:
        """Return the API requests seen since start or `clear_journal`, oldest first.

        ``writes_only`` keeps POST/PATCH/PUT/DELETE other than logins (``/user/``).
        """
        with self._lock:
            entries = list(self.journal)
        if writes_only:
            entries = [
                e
                for e in entries
                if e.method in ("POST", "PATCH", "PUT", "DELETE") and "/user" not in e.path
            ]
        return entries

    def clear_journal(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self.journal.clear()

    def dump(self) -> dict[str, Any]:
        """Return the whole state as JSON-ready data (the ``/_mock/state`` answer).

        Passwords, tokens and app codes are never included: users show ``has_token`` and
        ``token_expires``, apps show ``has_code``.
        """
        with self._lock:
            sections = []
            for sec in sorted(self.sections.values(), key=lambda s: s.id):
                subnets = []
                for sub in sorted(self.subnets.values(), key=lambda s: s.id):
                    if sub.section_id != sec.id:
                        continue
                    subnets.append(
                        {
                            "id": sub.id,
                            "cidr": sub.cidr,
                            "description": sub.description,
                            "is_full": sub.is_full,
                            "is_pool": sub.is_pool,
                            "is_folder": sub.is_folder,
                            "master_subnet_id": sub.master_subnet_id,
                            "addresses": [a.to_api() for a in self.subnet_addresses(sub.id)],
                        }
                    )
                sections.append(
                    {
                        "id": sec.id,
                        "name": sec.name,
                        "description": sec.description,
                        "subnets": subnets,
                    }
                )
            return {
                "settings": dict(vars(self.settings)),
                "lockout": {
                    **self._lockout_stats,
                    "blocked": sorted(
                        remote
                        for remote, entry in self._login_failures.items()
                        if self.settings.lockout
                        and entry[0] > self.settings.max_login_failures
                        and not self._expired(entry)
                    ),
                },
                "users": [
                    {
                        "id": u.id,
                        "username": u.username,
                        "has_token": u.token is not None,
                        "token_expires": self.format_expiry(u),
                    }
                    for u in self.users.values()
                ],
                "apps": [
                    {
                        "id": a.app_id,
                        "permissions": a.permissions,
                        "security": a.security,
                        "has_code": a.code is not None,
                    }
                    for a in self.apps.values()
                ],
                "sections": sections,
            }
