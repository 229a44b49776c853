r"""The phpIPAM-compatible REST API (aiohttp): ``/api/<app_id>/<controller>/...`` plus ``/_mock``.

Answers follow a real phpIPAM 1.8.2 (https://phpipam.net/api/api_documentation/ and its source,
https://github.com/phpipam/phpipam) byte for byte where it matters to a client: status equals
the envelope's ``code``, key order ``code, success, message, id, data, time``, ``\\/``-escaped
JSON, ``Location`` on 401 and 201, ``Connection: close`` on 400/500/503, native number types
unless ``Api-Stringify-Results`` asks for strings. The routing mirrors ``api/index.php`` and the
``User``, ``Subnets``, ``Addresses`` and ``Sections`` controllers.
"""

from __future__ import annotations

import ipaddress
import json
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote

from aiohttp import BasicAuth, web
from pydantic import ValidationError

from mock_phpipam.faults import FaultConfig, FaultInjector, RaceHooks
from mock_phpipam.store import (
    Address,
    App,
    PhpFatalError,
    PhpipamError,
    Seed,
    Store,
    Subnet,
    parse_ip,
)

__all__ = [
    "STORE_KEY",
    "create_app",
    "error_response",
    "faults_of",
    "phpipam_faults",
    "phpipam_race_hooks",
    "render_envelope",
]

STORE_KEY: web.AppKey[Store] = web.AppKey("mock_phpipam_store", Store)
_FAULTS_KEY: web.AppKey[FaultInjector] = web.AppKey("mock_phpipam_faults", FaultInjector)
_CONTROLLERS = ("user", "subnets", "addresses", "sections")
_WRITE_METHODS = ("POST", "PATCH", "PUT", "DELETE")
_JSON_TYPE = "application/json; charset=utf-8"
_MISSING: Any = object()


# ----------------------------------------------------------------------------- rendering


def _php_json(value: Any) -> bytes:
    """Encode like PHP's ``json_encode`` defaults: compact, ASCII-only, ``/`` escaped."""

    def fix(obj: Any) -> Any:
        if isinstance(obj, float):
            if math.isfinite(obj) and obj.is_integer():
                return int(obj)
            return obj
        if isinstance(obj, Mapping):
            return {k: fix(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [fix(v) for v in obj]
        return obj

    text = json.dumps(fix(value), separators=(",", ":"), ensure_ascii=True)
    return text.replace("/", "\\/").encode("ascii")


def _stringify(value: Any) -> Any:
    """``Api-Stringify-Results``: every scalar value becomes a string (None stays null)."""
    if isinstance(value, Mapping):
        return {k: _stringify(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stringify(v) for v in value]
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(_php_json(value).decode())
    return value


def render_envelope(
    code: int,
    *,
    message: str | None = None,
    id_: str | None = None,
    data: Any = _MISSING,
    elapsed: float = 0.0,
    success: bool | None = None,
) -> bytes:
    """Return the JSON body of a phpIPAM answer (``Responses::reorder_result`` order).

    Parameters
    ----------
    code:
        The status; ``success`` is true for 2xx.
    message, id_, data:
        Optional members, emitted in the order ``message, id, data`` when given.
    elapsed:
        The ``time`` member in seconds (rounded to ms like phpIPAM).
    success:
        Overrides ``success`` (the <= 1.4 "not found" answers are code 200, success false).
    """
    ok = 200 <= code < 300 if success is None else success
    body: dict[str, Any] = {"code": code, "success": ok}
    if message is not None:
        body["message"] = message
    if id_ is not None:
        body["id"] = id_
    if data is not _MISSING:
        body["data"] = data
    body["time"] = round(elapsed, 3)
    return _php_json(body)


def _headers(code: int) -> dict[str, str]:
    headers = {
        "Expires": "Thu, 19 Nov 1981 08:52:00 GMT",
        "Cache-Control": "no-cache",
        "Pragma": "no-cache",
        "Set-Cookie": f"phpipam={secrets.token_hex(13)}; path=/; SameSite=Lax; HttpOnly;",
        "Content-Type": _JSON_TYPE,
    }
    if code in (400, 500, 503):
        headers["Connection"] = "close"
    if code == 401:
        headers["Location"] = "/api//user/"
    return headers


def error_response(code: int, message: str, *, elapsed: float = 0.0) -> web.Response:
    """Return a phpIPAM error answer (envelope, ``Location`` on 401, close on 400/500/503).

    Parameters
    ----------
    code:
        HTTP status and envelope ``code``; ``success`` is false even for 200 (legacy mode).
    message:
        The envelope's ``message``.
    elapsed:
        The ``time`` member in seconds.
    """
    body = render_envelope(code, message=message, elapsed=elapsed, success=False)
    response = web.Response(status=code, body=body, headers=_headers(code))
    if code in (400, 500, 503):
        response.force_close()
    return response


def _fatal_response() -> web.Response:
    # PHP fatal error: empty body, text/html (transcripts 6e/7p). The real status line says
    # HTTP/1.0; aiohttp answers in the request's HTTP version.
    response = web.Response(
        status=500,
        body=b"",
        headers={"Content-Type": "text/html; charset=UTF-8", "Connection": "close"},
    )
    response.force_close()
    return response


# ----------------------------------------------------------------------------- request model


@dataclass
class _Result:
    code: int = 200
    data: Any = _MISSING
    message: str | None = None
    id: str | None = None
    location: str | None = None


@dataclass
class _Call:
    """One API request, parsed like ``api/index.php`` does."""

    request: web.Request
    store: Store
    app: App
    controller: str
    ids: list[str]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.request.method.upper()

    def id(self, n: int) -> str | None:
        """Path identifier ``n`` (0 = ``id``, 1 = ``id2``, ...), or None."""
        return self.ids[n] if len(self.ids) > n else None

    @property
    def token(self) -> str | None:
        # ``HTTP_TOKEN`` is copied to ``HTTP_PHPIPAM_TOKEN`` only when the latter is unset.
        headers = self.request.headers
        return headers.get("phpipam-token", headers.get("token"))

    @property
    def remote(self) -> str:
        return self.request.remote or "unknown"


def _segments(request: web.Request) -> list[str]:
    """Split the raw path on ``/`` before URL-decoding; drop empty and ``"0"`` segments.

    Like ``class.Rewrite.php``, whose ``array_filter`` also drops ``"0"``.
    """
    parts = [unquote(p) for p in request.rel_url.raw_path.split("/")]
    return [p for p in parts if p not in ("", "0")]


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Decode the body: JSON, form-urlencoded, or nothing.

    Raises
    ------
    PhpipamError
        400 ``Invalid JSON: Syntax error`` for a JSON body that does not decode.
    """
    raw = await request.read()
    if not raw.strip():
        return {}
    ctype = request.content_type
    if ctype == "application/json":
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise PhpipamError(400, "Invalid JSON: Syntax error") from None
        return dict(parsed) if isinstance(parsed, dict) else {}
    if ctype in ("application/x-www-form-urlencoded", "application/octet-stream", ""):
        return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    raise PhpipamError(415, "Invalid Content-Type")


# ----------------------------------------------------------------------------- representations


def _subnet_row(subnet: Subnet) -> dict[str, Any]:
    """Return the raw ``subnets`` row as the API shows it (transcript 2d)."""
    return {
        "id": subnet.id,
        "subnet": str(subnet.network.network_address),
        "mask": str(subnet.network.prefixlen),
        "sectionId": subnet.section_id,
        "description": subnet.description,
        "linked_subnet": None,
        "firewallAddressObject": None,
        "vrfId": subnet.vrf_id,
        "masterSubnetId": subnet.master_subnet_id,
        "allowRequests": 0,
        "vlanId": subnet.vlan_id,
        "showName": 0,
        "device": 0,
        "permissions": None,
        "pingSubnet": 0,
        "discoverSubnet": 0,
        "resolveDNS": 0,
        "DNSrecursive": 0,
        "DNSrecords": 0,
        "nameserverId": 0,
        "scanAgent": None,
        "customer_id": None,
        "isFolder": int(subnet.is_folder),
        "isFull": int(subnet.is_full),
        "isPool": int(subnet.is_pool),
        "tag": 2,
        "threshold": 0,
        "location": None,
        "editDate": None,
        "lastScan": None,
        "lastDiscovery": None,
    }


def _ipv4_class(net: ipaddress.IPv4Network) -> str:
    # Approximation of phpIPAM's "Subnet Class" (exact for the RFC 1918 ranges).
    for private, name in (
        ("10.0.0.0/8", "private A"),
        ("172.16.0.0/12", "private B"),
        ("192.168.0.0/16", "private C"),
    ):
        if net.subnet_of(ipaddress.IPv4Network(private)):
            return name
    first = int(net.network_address) >> 24
    for limit, name in (
        (128, "public A"),
        (192, "public B"),
        (224, "public C"),
        (240, "multicast D"),
    ):
        if first < limit:
            return name
    return "reserved E"


def _calculation(subnet: Subnet) -> dict[str, str]:
    """Return the ``calculation`` member of ``GET /subnets/{id}/`` (transcripts 1h, 2k, 3h)."""
    net = subnet.network
    low, high = subnet.bounds()
    if isinstance(net, ipaddress.IPv4Network):
        return {
            "Type": "IPv4",
            "IP address": "/",
            "Network": str(net.network_address),
            "Broadcast": str(net.broadcast_address),
            "Subnet bitmask": str(net.prefixlen),
            "Subnet netmask": str(net.netmask),
            "Subnet wildcard": str(net.hostmask),
            "Min host IP": str(ipaddress.IPv4Address(low)),
            "Max host IP": str(ipaddress.IPv4Address(high)),
            "Number of hosts": str(subnet.max_hosts()),
            "Subnet Class": _ipv4_class(net),
        }
    nibbles = net.network_address.reverse_pointer.split(".")[:32]
    keep = math.ceil(net.prefixlen / 4)
    reverse = ".".join([*nibbles[32 - keep :], "ip6", "arpa"])
    return {
        "Type": "IPv6",
        "Host address": "/",
        "Host address (uncompressed)": "/",
        "Subnet prefix": net.with_prefixlen,
        "Prefix length": str(net.prefixlen),
        "Subnet Reverse DNS": reverse,
        "Min host IP": str(ipaddress.IPv6Address(low)),
        "Max host IP": str(ipaddress.IPv6Address(high)),
        "Number of hosts": str(subnet.max_hosts()),
        "Address type": "NET_IPV6",
    }


def _hostname_rows(rows: list[Address]) -> list[dict[str, Any]]:
    """Return ``search_hostname``/``search_hostbase`` rows with phpIPAM 1.8.2's quirk.

    A row whose hostname repeats an earlier row's shows ``ip`` as a decimal string
    (transcripts 4b, 4m).
    """
    seen: set[str] = set()
    out = []
    for row in rows:
        key = (row.hostname or "").casefold()
        out.append(row.to_api(decimal_ip=key in seen))
        seen.add(key)
    return out


# ----------------------------------------------------------------------------- controllers


def _user_controller(call: _Call) -> _Result:
    store = call.store
    if call.app.security == "ssl_code":
        raise PhpipamError(409, "Authentication not needed")
    store.check_blocked(call.remote)
    if call.method == "POST":
        header = call.request.headers.get("Authorization", "")
        try:
            auth = BasicAuth.decode(header) if header else None
        except ValueError:
            auth = None
        if auth is None:
            raise PhpipamError(400, "Please provide username and password")
        user = store.login(auth.login, auth.password, call.remote)
        return _Result(data={"token": user.token, "expires": store.format_expiry(user)})
    if call.method == "GET":
        if call.id(0) not in (None, "token_expires", "expires"):
            raise PhpipamError(400, "Invalid identifier")
        user = store.authenticate_user_controller(call.token)
        return _Result(data={"expires": store.format_expiry(user)})
    if call.method == "PATCH":
        user = store.authenticate_user_controller(call.token)
        store.refresh(user)
        return _Result(data={"expires": store.format_expiry(user)})
    if call.method == "DELETE":
        user = store.authenticate_user_controller(call.token)
        store.logout(user)
        return _Result(data=["Token removed"])
    raise PhpipamError(501, "Method not implemented")


def _subnets_controller(call: _Call) -> _Result:
    store = call.store
    if call.method != "GET":
        raise PhpipamError(501, "Method not implemented")
    sid, sub = call.id(0), call.id(1)
    if sid is None or sid == "all":
        rows = [_subnet_row(s) for s in store.list_subnets()]
        if not rows:
            raise PhpipamError(404, "No subnets found")
        return _Result(data=rows)
    if sid in ("cidr", "search"):
        found = store.subnets_by_cidr(sub or "", call.id(2) or "")
        if not found:
            raise PhpipamError(404, "No subnets found")
        return _Result(data=[_subnet_row(s) for s in found])
    if not sid.isdigit():
        raise PhpipamError(404, "Invalid Id")
    subnet = store.get_subnet(sid)
    if sub is None:
        if subnet is None:
            raise PhpipamError(400, f"Invalid subnet Id ({sid})")
        data = _subnet_row(subnet)
        gateway = store.gateway_of(subnet.id)
        if gateway is not None:
            data["gatewayId"] = gateway.id
            data["gateway"] = {"ip_addr": str(gateway.ip), "id": gateway.id}
        data["calculation"] = _calculation(subnet)
        return _Result(data=data)
    if subnet is None:
        raise PhpipamError(404, f"Invalid subnet Id ({sid})")
    if sub == "usage":
        return _Result(data=store.usage(subnet.id))
    if sub == "first_free":
        if store.has_children(subnet.id):
            raise PhpipamError(409, "Subnet contains subnets")
        free = store.first_free(subnet.id)
        if free is None:
            raise PhpipamError(404, "No free addresses found")
        return _Result(data=str(free))
    if sub == "addresses":
        members = store.subnet_addresses(subnet.id)
        if not members:
            raise PhpipamError(404, "No addresses found")
        return _Result(data=[a.to_api() for a in members])
    raise PhpipamError(400, "Invalid Id")


def _addresses_get(call: _Call) -> _Result:
    store = call.store
    first, second = call.id(0), call.id(1)
    if first is None or first == "all":
        return _Result(data=[a.to_api() for a in store.all_addresses()])
    if first == "first_free":
        ref = call.params.get("subnetId", second)
        subnet = store.get_subnet(ref)
        free = store.first_free(subnet.id) if subnet is not None else None
        if free is None:
            raise PhpipamError(404, "No free addresses found")
        return _Result(data=str(free))
    if parse_ip(first) is not None and second is not None:
        # phpIPAM 1.8.2 compares the row's missing ``ip`` with !==: never found (4j, 7q).
        raise PhpipamError(404, "No addresses found")
    if first.isdigit():
        addr = store.get_address(first)
        if addr is None:
            raise PhpipamError(404, "Invalid Id")
        return _Result(data=addr.to_api())
    if first == "search":
        ip = parse_ip(second)
        if ip is None:
            raise PhpipamError(400, "Invalid address")
        rows = store.search_ip(ip)
        if not rows:
            raise PhpipamError(404, "Address not found")
        return _Result(data=[a.to_api() for a in rows])
    if first == "search_hostname":
        named = store.search_hostname(second or "")
        if not named:
            raise PhpipamError(404, "Hostname not found")
        return _Result(data=_hostname_rows(named))
    if first == "search_hostbase":
        based = store.search_hostbase(second or "")
        if not based:
            raise PhpipamError(404, "Host name not found")
        return _Result(data=_hostname_rows(based))
    raise PhpipamError(400, "Invalid Id")


def _created(call: _Call, addr: Address, *, with_data: bool) -> _Result:
    return _Result(
        code=201,
        message="Address created",
        id=str(addr.id),
        data=str(addr.ip) if with_data else _MISSING,
        location=f"/api/{call.app.app_id}/addresses/{addr.id}/",
    )


def _addresses_controller(call: _Call) -> _Result:
    store = call.store
    first, second = call.id(0), call.id(1)
    if call.method == "GET":
        return _addresses_get(call)
    if call.method == "POST":
        if first == "first_free":
            return _created(call, store.claim_first_free(second, call.params), with_data=True)
        return _created(call, store.create_address(call.params), with_data=False)
    if call.method in ("PATCH", "PUT"):
        store.update_address(first, call.params)
        return _Result(message="Address updated")
    if call.method == "DELETE":
        if first is not None and parse_ip(first) is not None and second is not None:
            store.delete_address_by_ip(first, second)
        else:
            store.delete_address(first)
        return _Result(message="Address deleted")
    raise PhpipamError(501, "Method not implemented")


def _section_row(section_id: int, name: str, description: str | None) -> dict[str, Any]:
    return {
        "id": section_id,
        "name": name,
        "description": description,
        "masterSection": 0,
        "permissions": None,
        "strictMode": 1,
        "subnetOrdering": "default",
        "order": None,
        "editDate": None,
        "showSubnet": 1,
        "showVLAN": 0,
        "showVRF": 0,
        "showSupernetOnly": 0,
        "DNS": None,
    }


def _sections_controller(call: _Call) -> _Result:
    store = call.store
    if call.method != "GET":
        raise PhpipamError(501, "Method not implemented")
    sections = store.list_sections()
    ref, sub = call.id(0), call.id(1)
    if ref is None:
        if not sections:
            raise PhpipamError(404, "No sections available")
        return _Result(data=[_section_row(s.id, s.name, s.description) for s in sections])
    section = next((s for s in sections if str(s.id) == ref or s.name == ref), None)
    if section is None:
        raise PhpipamError(404, "Section does not exist")
    if sub == "subnets":
        rows = [_subnet_row(s) for s in store.list_subnets() if s.section_id == section.id]
        if not rows:
            raise PhpipamError(404, "No subnets found")
        return _Result(data=rows)
    return _Result(data=_section_row(section.id, section.name, section.description))


_DISPATCH = {
    "user": _user_controller,
    "subnets": _subnets_controller,
    "addresses": _addresses_controller,
    "sections": _sections_controller,
}


# ----------------------------------------------------------------------------- entry point


def _stringify_wanted(request: web.Request, store: Store) -> bool:
    header = request.headers.get("Api-Stringify-Results")
    if header is None:
        return store.settings.stringify_results
    return header.strip().lower() in ("1", "true", "yes")


async def _dispatch(request: web.Request, store: Store) -> _Result:
    """Route one API request like ``api/index.php``; raises `PhpipamError`/`PhpFatalError`."""
    segments = _segments(request)[1:]  # drop "api"
    if not store.settings.api_enabled:
        raise PhpipamError(503, "API server disabled")
    app = store.apps.get(segments[0]) if segments else None
    if app is None:
        raise PhpipamError(400, "Invalid application id")
    if app.permissions == 0:
        raise PhpipamError(503, "Application disabled")
    if store.settings.enforce_ssl and app.security != "none" and not request.secure:
        raise PhpipamError(503, "SSL connection is required for API")
    params: dict[str, Any] = {}
    if request.method.upper() in _WRITE_METHODS:
        params = await _read_params(request)
    else:
        params = dict(request.query)
    controller = segments[1].lower() if len(segments) > 1 else ""
    if controller not in _CONTROLLERS:
        raise PhpipamError(400, "Invalid controller")
    call = _Call(request, store, app, controller, segments[2:], params)
    if controller != "user":
        store.check_blocked(call.remote)
        if app.security == "ssl_code":
            if (
                not call.token
                or app.code is None
                or not secrets.compare_digest(call.token, app.code)
            ):
                raise PhpipamError(401, "Unauthorized")
        else:
            store.authenticate(call.token)
        if call.method in _WRITE_METHODS and app.permissions < 2:
            raise PhpipamError(401, "invalid permissions")
    return _DISPATCH[controller](call)


async def _api_handler(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    store = request.app[STORE_KEY]
    try:
        result = await _dispatch(request, store)
    except PhpFatalError:
        return _fatal_response()
    except PhpipamError as exc:
        code = exc.code
        if code == 404 and store.settings.legacy_not_found:
            code = 200  # phpIPAM <= 1.4: "not found" is 200 with success false
        return error_response(code, exc.message, elapsed=time.perf_counter() - started)
    data = result.data
    if data is not _MISSING and _stringify_wanted(request, store):
        data = _stringify(data)
    body = render_envelope(
        result.code,
        message=result.message,
        id_=result.id,
        data=data,
        elapsed=time.perf_counter() - started,
    )
    headers = _headers(result.code)
    if result.location is not None:
        headers["Location"] = result.location
    return web.Response(status=result.code, body=body, headers=headers)


# ----------------------------------------------------------------------------- admin + factory


async def _state_get(request: web.Request) -> web.Response:
    return web.json_response(request.app[STORE_KEY].dump())


async def _state_post(request: web.Request) -> web.Response:
    """``POST /_mock/state`` with ``{"action": "reset"|"clear"|"seed", "seed": {...}}``."""
    store = request.app[STORE_KEY]
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("action") not in ("reset", "clear", "seed"):
        return web.json_response(
            {"error": 'body must be {"action": "reset"|"clear"|"seed", "seed": {...}}'},
            status=400,
        )
    try:
        if body["action"] == "reset":
            store.reset()
        elif body["action"] == "clear":
            store.clear()
        else:
            store.apply_seed(Seed.model_validate(body.get("seed") or {}))
    except ValidationError as exc:
        return web.json_response(
            {
                "error": "invalid seed",
                "details": exc.errors(include_url=False, include_input=False),
            },
            status=400,
        )
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return web.json_response(store.dump())


def _admin_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _admin_subnet_id(store: Store, value: Any, cidr: Any) -> int | None:
    """Resolve ``subnetId`` or a ``subnet`` CIDR of an admin request (None: neither given).

    Raises
    ------
    ValueError
        When the subnet does not exist, the CIDR is ambiguous, or both are given.
    """
    if value not in (None, "") and cidr not in (None, ""):
        raise ValueError("give subnetId or subnet, not both")
    if value not in (None, ""):
        subnet = store.get_subnet(value)
        if subnet is None:
            raise ValueError(f"subnet id {value} does not exist")
        return subnet.id
    if cidr not in (None, ""):
        try:
            network = ipaddress.ip_network(str(cidr), strict=True)
        except ValueError:
            raise ValueError(f"subnet {cidr!r} is not a CIDR network") from None
        found = store.subnets_by_cidr(str(network.network_address), str(network.prefixlen))
        if len(found) != 1:
            raise ValueError(f"{len(found)} subnets are {network}: use subnetId")
        return found[0].id
    return None


async def _admin_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


async def _addresses_list(request: web.Request) -> web.Response:
    """``GET /_mock/addresses[?subnetId=N|subnet=CIDR]``: every row (by id), as the API shows it."""
    store = request.app[STORE_KEY]
    try:
        subnet_id = _admin_subnet_id(
            store, request.query.get("subnetId"), request.query.get("subnet")
        )
    except ValueError as exc:
        return _admin_error(400, str(exc))
    rows = [
        a.to_api() for a in store.all_addresses() if subnet_id is None or a.subnet_id == subnet_id
    ]
    return web.json_response({"addresses": rows})


async def _addresses_add(request: web.Request) -> web.Response:
    """``POST /_mock/addresses``: register an address behind the operator's back.

    Body: ``subnetId`` (or ``subnet`` CIDR), ``ip``, and optionally ``hostname``,
    ``description``, ``tag``, ``mac``, ``note``, ``is_gateway``. 201 with the row; 400 for a
    bad request, 409 when the subnet holds the address already.
    """
    store = request.app[STORE_KEY]
    try:
        body = await _admin_body(request)
        unknown = sorted(set(body) - set(_ADMIN_ADD_KEYS))
        if unknown:
            raise ValueError(f"unknown keys {', '.join(unknown)}")
        subnet_id = _admin_subnet_id(store, body.get("subnetId"), body.get("subnet"))
        if subnet_id is None:
            raise ValueError("give subnetId or subnet")
        ip = parse_ip(body.get("ip"))
        if ip is None:
            raise ValueError("ip must be an IP address")
        if any(a.subnet_id == subnet_id for a in store.search_ip(ip)):
            return _admin_error(409, f"{ip} already exists in subnet {subnet_id}")
        addr = store.add_address(
            subnet_id,
            str(ip),
            hostname=body.get("hostname"),
            description=body.get("description"),
            is_gateway=bool(body.get("is_gateway", False)),
            tag=int(body.get("tag", 2)),
            mac=body.get("mac"),
            note=body.get("note"),
        )
    except (ValueError, TypeError) as exc:
        return _admin_error(400, str(exc))
    return web.json_response(addr.to_api(), status=201)


_ADMIN_ADD_KEYS = (
    "subnetId",
    "subnet",
    "ip",
    "hostname",
    "description",
    "tag",
    "mac",
    "note",
    "is_gateway",
)


def _admin_target(request: web.Request) -> tuple[str, int | None]:
    store = request.app[STORE_KEY]
    subnet_id = _admin_subnet_id(store, request.query.get("subnetId"), request.query.get("subnet"))
    return request.match_info["ip"], subnet_id


async def _addresses_edit(request: web.Request) -> web.Response:
    """``PATCH /_mock/addresses/{ip}[?subnetId=N]``: change a row's columns (e.g. rename it).

    Body: columns by API name (``hostname``, ``description``, ...). 200 with the row; 404
    when no row holds the address; 400 for a bad request (or an address held in several
    subnets without ``subnetId``).
    """
    store = request.app[STORE_KEY]
    try:
        ip, subnet_id = _admin_target(request)
        body = await _admin_body(request)
        addr = store.edit_address(ip, body, subnet_id=subnet_id)
    except LookupError as exc:
        return _admin_error(404, str(exc))
    except ValueError as exc:
        return _admin_error(400, str(exc))
    return web.json_response(addr.to_api())


async def _addresses_remove(request: web.Request) -> web.Response:
    """``DELETE /_mock/addresses/{ip}[?subnetId=N]``: delete a row; 200 with it, 404 if none."""
    store = request.app[STORE_KEY]
    try:
        ip, subnet_id = _admin_target(request)
        addr = store.remove_address(ip, subnet_id=subnet_id)
    except LookupError as exc:
        return _admin_error(404, str(exc))
    except ValueError as exc:
        return _admin_error(400, str(exc))
    return web.json_response(addr.to_api())


async def _health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _race_matches(request: web.Request) -> bool:
    segments = _segments(request)
    return (
        request.method.upper() == "POST"
        and len(segments) >= 4
        and segments[0] == "api"
        and segments[2].lower() == "addresses"
        and segments[3] == "first_free"
    )


def _race_respond(
    request: web.Request, response: web.StreamResponse | None, kind: str
) -> web.StreamResponse:
    """Return a lost-race answer: 409 ``IP address already exists`` or 500 duplicate key."""
    store = request.app[STORE_KEY]
    if kind not in ("conflict", "duplicate"):
        kind = secrets.choice(("conflict", "duplicate"))
    if kind == "conflict":
        return error_response(409, "IP address already exists")
    segments = _segments(request)
    subnet = store.get_subnet(segments[4]) if len(segments) > 4 else None
    ip: Any = None
    if isinstance(response, web.Response) and response.body is not None:
        raw = response.body
        if isinstance(raw, bytes):
            ip = parse_ip(json.loads(raw.decode()).get("data"))
    if ip is None and subnet is not None:
        ip = store.first_free(subnet.id)
    decimal = int(ip) if ip is not None else 0
    sid = subnet.id if subnet is not None else 0
    return error_response(
        500,
        "Error: SQLSTATE[23000]: Integrity constraint violation: 1062 Duplicate entry "
        f"'{decimal}-{sid}' for key 'sid_ip_unique'",
    )


def phpipam_race_hooks() -> RaceHooks:
    """Return the `RaceHooks` of this mock: ``POST /addresses/first_free/...`` requests.

    ``race_error`` values: ``conflict`` (409 ``IP address already exists``), ``duplicate``
    (500 ``... Duplicate entry '<decimal ip>-<subnetId>' for key 'sid_ip_unique'``), anything
    else picks one at random.
    """
    return RaceHooks(matches=_race_matches, respond=_race_respond)


def phpipam_faults(**config: Any) -> FaultInjector:
    """Return a `FaultInjector` wired for phpIPAM (envelope errors, first_free races).

    Keyword arguments are `FaultConfig` fields.
    """
    return FaultInjector(
        FaultConfig(**config),
        error_response=lambda code, message: error_response(code, message),
        race=phpipam_race_hooks(),
    )


def create_app(store: Store, faults: FaultInjector | None = None) -> web.Application:
    """Build the mock's aiohttp application.

    Parameters
    ----------
    store:
        The state the API serves (shared with the caller, who may inspect or change it).
    faults:
        Fault injection; None creates an inactive `phpipam_faults` injector so the admin
        API can still turn faults on at runtime.

    Returns
    -------
    aiohttp.web.Application
        Routes: ``/api/<app_id>/...`` (the phpIPAM API, any method), ``GET/POST
        /_mock/state``, ``GET/PUT/DELETE /_mock/faults``, ``GET /_mock/health``,
        ``GET/POST /_mock/addresses`` and ``PATCH/DELETE /_mock/addresses/{ip}`` (edits
        behind the operator's back, for drift).
    """
    injector = faults if faults is not None else phpipam_faults()
    app = web.Application(middlewares=[_journal_middleware(store), injector.middleware])
    app[STORE_KEY] = store
    app[_FAULTS_KEY] = injector
    app.router.add_route("*", "/api", _api_handler)
    app.router.add_route("*", "/api/{tail:.*}", _api_handler)
    app.router.add_get("/_mock/state", _state_get)
    app.router.add_post("/_mock/state", _state_post)
    app.router.add_get("/_mock/health", _health)
    app.router.add_get("/_mock/addresses", _addresses_list)
    app.router.add_post("/_mock/addresses", _addresses_add)
    app.router.add_patch("/_mock/addresses/{ip}", _addresses_edit)
    app.router.add_delete("/_mock/addresses/{ip}", _addresses_remove)
    injector.add_routes(app)
    return app


def _journal_middleware(store: Store) -> Any:
    """Record every API request (method, path, final status, User-Agent, arrival time).

    The entries go to ``store.journal`` (`mock_phpipam.store.JournalEntry`).

    Outermost, so injected faults are recorded too; the ``/_mock`` admin API is not.
    """

    @web.middleware
    async def journal(request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/api"):
            return cast(web.StreamResponse, await handler(request))
        status = 599  # the connection was dropped (an injected "down" or a hang)
        arrived = time.time()
        try:
            response = cast(web.StreamResponse, await handler(request))
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            store.record(
                request.method,
                request.path,
                status,
                client=request.headers.get("User-Agent", ""),
                at=arrived,
            )

    return journal


def faults_of(app: web.Application) -> FaultInjector:
    """Return the `FaultInjector` an app created by `create_app` uses."""
    return app[_FAULTS_KEY]
