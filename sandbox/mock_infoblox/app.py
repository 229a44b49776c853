"""The aiohttp application that answers like the Infoblox NIOS WAPI, plus a test admin API."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from mock_infoblox.errors import (
    LOCKED_HTML,
    UNAUTHORIZED_HTML,
    WAPIError,
    conflict,
    proto_error,
    read_only_member,
)
from mock_infoblox.schema import ObjectType
from mock_infoblox.store import InfobloxStore, SearchFilter
from mock_phpipam.faults import FaultConfig, FaultInjector, RaceHooks

__all__ = [
    "COOKIE_NAME",
    "STORE_KEY",
    "create_app",
    "faults_of",
    "infoblox_faults",
    "infoblox_race_hooks",
    "select_fields",
    "server_error_response",
]

#: The session cookie NIOS sets after a Basic-auth request (WAPI documentation, "Authentication":
#: https://ipam.illinois.edu/wapidoc/).
COOKIE_NAME = "ibapauth"
#: Where the store lives in the application, for handlers and tests.
STORE_KEY: web.AppKey[InfobloxStore] = web.AppKey("mock_infoblox.store", InfobloxStore)
_FAULTS_KEY: web.AppKey[FaultInjector] = web.AppKey("mock_infoblox.faults", FaultInjector)
_ALLOCATING_TYPES = ("record:host", "fixedaddress", "ipv6fixedaddress")

_VERSION_RE = re.compile(r"^v(\d+)\.(\d+)(?:\.(\d+))?$")
_DEFAULT_MAX_RESULTS = -1000
_CONTROL_ARGS = frozenset(
    {
        "_return_fields",
        "_return_fields+",
        "_max_results",
        "_paging",
        "_return_as_object",
        "_page_id",
        "_function",
        "_proxy_search",
        "_inheritance",
    }
)
_REALM = 'Basic realm="InfoBlox ONE Platform"'


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = _VERSION_RE.match(text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def _supported(version: str, grid_version: str) -> bool:
    wanted = _version_tuple(version)
    grid = _version_tuple("v" + grid_version)
    if wanted is None or grid is None or wanted[0] not in (1, 2):
        return False
    return wanted <= grid


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(data, indent=4), content_type="application/json"
    )


def _error(exc: WAPIError) -> web.Response:
    return _json(exc.body(), status=exc.status)


def _unauthorized(*, locked: bool = False) -> web.Response:
    return web.Response(
        status=401,
        text=LOCKED_HTML if locked else UNAUTHORIZED_HTML,
        content_type="text/html",
        headers={"WWW-Authenticate": _REALM},
    )


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "0").strip().lower() in ("1", "true", "yes")


def _split_fields(text: str | None) -> list[str]:
    return [f.strip() for f in (text or "").split(",") if f.strip()]


def select_fields(
    otype: ObjectType,
    item: Mapping[str, Any],
    return_fields: str | None,
    return_fields_plus: str | None,
) -> dict[str, Any]:
    """Apply ``_return_fields`` / ``_return_fields+`` to one full object.

    Parameters
    ----------
    otype:
        The object's type.
    item:
        The full object from the store.
    return_fields:
        The ``_return_fields`` argument (replaces the basic fields), or None.
    return_fields_plus:
        The ``_return_fields+`` argument (added to the basic fields), or None.

    Returns
    -------
    dict
        ``_ref`` plus the requested fields that have a value (WAPI omits unset fields).

    Raises
    ------
    WAPIError
        400 ``Client.Ibap.Proto`` "Unknown argument/field: '<f>'" for a field the type lacks.
    """
    if return_fields is not None:
        fields = _split_fields(return_fields) + _split_fields(return_fields_plus)
    else:
        fields = list(otype.basic) + _split_fields(return_fields_plus)
    out: dict[str, Any] = {"_ref": item["_ref"]}
    for name in fields:
        if name not in otype.fields:
            raise proto_error(f"Unknown argument/field: '{name}'")
        if item.get(name) is not None:
            out[name] = item[name]
    return out


class _Request:
    """The parts of one WAPI request the handlers need."""

    def __init__(self, request: web.Request, store: InfobloxStore, path: str) -> None:
        self.request = request
        self.store = store
        self.path = path
        self.control: dict[str, str] = {}
        self.filters: list[SearchFilter] = []
        grouped: dict[tuple[str, bool, bool], list[str]] = {}
        for raw_key, value in request.query.items():
            key = (
                "_return_fields+" if raw_key in ("_return_fields ", "_return_fields+") else raw_key
            )
            if key.startswith("_"):
                if key not in _CONTROL_ARGS:
                    raise proto_error(f"Unknown argument/field: '{key}'")
                self.control[key] = value
                continue
            regex = case_insensitive = False
            while key and key[-1] in "~:":
                regex = regex or key[-1] == "~"
                case_insensitive = case_insensitive or key[-1] == ":"
                key = key[:-1]
            grouped.setdefault((key, case_insensitive, regex), []).append(value)
        self.filters = [
            SearchFilter(field=k, values=tuple(v), case_insensitive=ci, regex=rx)
            for (k, ci, rx), v in grouped.items()
        ]

    def shape(self, otype: ObjectType, item: Mapping[str, Any]) -> dict[str, Any]:
        return select_fields(
            otype, item, self.control.get("_return_fields"), self.control.get("_return_fields+")
        )

    def wrap(self, data: Any, status: int = 200) -> web.Response:
        if _flag(self.control, "_return_as_object"):
            data = {"result": data}
        return _json(data, status=status)

    async def body(self) -> Any:
        text = await self.request.text()
        if not text.strip():
            return {}
        try:
            return json.loads(text)
        except ValueError as exc:
            raise proto_error(f"JSON Decoding: {exc}") from None


async def _search(req: _Request, type_name: str) -> web.Response:
    store = req.store
    otype = store.object_type(type_name)
    paging = _flag(req.control, "_paging") or "_page_id" in req.control
    if paging:
        if not _flag(req.control, "_return_as_object"):
            raise proto_error("_return_as_object needs to be enabled for paging requests.")
        if "_page_id" in req.control:
            page, next_id = store.next_page(req.control["_page_id"])
        else:
            size = abs(int(req.control.get("_max_results", "1000")))
            items = [req.shape(otype, item) for item in store.search(type_name, req.filters)]
            page, next_id = store.open_pages(items, size)
        body: dict[str, Any] = {"result": page}
        if next_id is not None:
            body["next_page_id"] = next_id
        return _json(body)
    try:
        max_results = int(req.control.get("_max_results", str(_DEFAULT_MAX_RESULTS)))
    except ValueError:
        raise proto_error(
            f"Invalid value for _max_results: '{req.control['_max_results']}'"
        ) from None
    limit = abs(max_results) if max_results else abs(_DEFAULT_MAX_RESULTS)
    results: list[dict[str, Any]] = []
    for item in store.search(type_name, req.filters):
        if len(results) == limit:
            if max_results < 0:
                raise proto_error(f"Result set too large (> {limit})")
            break
        results.append(req.shape(otype, item))
    return req.wrap(results)


async def _function(req: _Request, ref: str) -> web.Response:
    name = req.control["_function"]
    if req.request.method != "POST":
        raise proto_error(f"Function {name} illegal with this method")
    if name != "next_available_ip":
        raise proto_error(f"Unknown function: {name}")
    body = await req.body()
    if not isinstance(body, Mapping):
        raise proto_error("Invalid request body: a JSON object is required")
    args = {**{k: v for k, v in req.request.query.items() if not k.startswith("_")}, **body}
    try:
        num = int(args.get("num", 1))
    except (TypeError, ValueError):
        raise proto_error(f"Invalid value for num: '{args.get('num')}'") from None
    if not 1 <= num <= 1000:
        raise proto_error(f"Invalid value for num: '{num}'")
    exclude = args.get("exclude") or []
    if isinstance(exclude, str):
        exclude = [exclude]
    ips = req.store.next_available_ips(ref, num, [str(x) for x in exclude])
    return req.wrap({"ips": ips})


async def _dispatch(req: _Request) -> web.Response:
    method = req.request.method
    store = req.store
    path = req.path
    if path == "logout":
        if method != "POST":
            raise proto_error("Function logout illegal with this method")
        cookie = req.request.cookies.get(COOKIE_NAME)
        if cookie:
            store.logout(cookie)
        response = web.Response(status=200)
        response.del_cookie(COOKIE_NAME)
        return response
    if "/" not in path:
        if method == "GET":
            return await _search(req, path)
        if method == "POST":
            if store.read_only:
                raise read_only_member()
            body = await req.body()
            created = store.create(path, body)
            otype = store.object_type(path)
            wants_object = "_return_fields" in req.control or "_return_fields+" in req.control
            result: Any = req.shape(otype, created) if wants_object else created["_ref"]
            return req.wrap(result, status=201)
        store.object_type(path)
        raise proto_error(f"Operation {method} requires a reference")
    type_name = path.partition("/")[0]
    otype = store.object_type(type_name)
    if "_function" in req.control:
        return await _function(req, path)
    if method in ("PUT", "DELETE") and store.read_only:
        raise read_only_member()
    if method == "GET":
        return req.wrap(req.shape(otype, store.get(path)))
    if method == "PUT":
        body = await req.body()
        updated = store.update(path, body)
        wants_object = "_return_fields" in req.control or "_return_fields+" in req.control
        return req.wrap(req.shape(otype, updated) if wants_object else updated["_ref"])
    if method == "DELETE":
        return req.wrap(store.delete(path))
    raise proto_error(f"Operation {method} not allowed on a reference")


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


async def _wapi(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE_KEY]
    new_cookie: str | None = None
    header = request.headers.get("Authorization")
    if header is not None:
        creds = _basic_credentials(header)
        peer = request.remote or "127.0.0.1"
        new_cookie = store.login(*creds, client_ip=peer) if creds else None
        if new_cookie is None:
            return _unauthorized(locked=creds is not None and store.is_locked(creds[0]))
    else:
        cookie = request.cookies.get(COOKIE_NAME)
        if not cookie or store.session_user(cookie) is None:
            return _unauthorized()
    version = request.match_info["version"]
    if not _supported(version, store.wapi_version):
        return web.Response(
            status=400,
            text=f"Version {version.removeprefix('v')} not supported",
            content_type="text/plain",
        )
    raw = request.rel_url.raw_path
    prefix = f"/wapi/{version}/"
    path = unquote(raw[len(prefix) :]) if raw.startswith(prefix) else ""
    try:
        response = await _dispatch(_Request(request, store, path.rstrip("/")))
    except WAPIError as exc:
        response = _error(exc)
    if new_cookie is not None:
        response.headers.add("Set-Cookie", f'{COOKIE_NAME}="{new_cookie}"; httponly; Path=/')
    return response


async def _state_get(request: web.Request) -> web.Response:
    return _json(request.app[STORE_KEY].dump())


async def _state_post(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    text = await request.text()
    try:
        body = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        return _json({"error": f"invalid JSON: {exc}"}, status=400)
    if not isinstance(body, Mapping):
        return _json({"error": "the body must be a JSON object"}, status=400)
    with store.lock:
        if body.get("reset", True):
            store.reset()
        if body.get("seed"):
            try:
                store.seed(body["seed"])
            except (ValueError, KeyError, TypeError) as exc:
                return _json({"error": str(exc)}, status=400)
        return _json(store.dump())


async def _admin_body(request: web.Request) -> Mapping[str, Any]:
    text = await request.text()
    try:
        body = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    return body


def _admin_error(exc: Exception) -> web.Response:
    if isinstance(exc, WAPIError):
        return _error(exc)
    status = 404 if isinstance(exc, LookupError) else 400
    return _json({"error": str(exc).strip("'\"")}, status=status)


def _criteria(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.query.items() if k in ("type", "name", "address", "ref")}


async def _records_get(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    criteria = _criteria(request)
    try:
        found = store.records(
            type_name=criteria.get("type"),
            name=criteria.get("name"),
            address=criteria.get("address"),
            ref=criteria.get("ref"),
        )
    except ValueError as exc:
        return _admin_error(exc)
    return _json({"records": found})


async def _records_post(request: web.Request) -> web.Response:
    try:
        created = request.app[STORE_KEY].add_record(await _admin_body(request))
    except (ValueError, WAPIError) as exc:
        return _admin_error(exc)
    return _json(created, status=201)


async def _records_patch(request: web.Request) -> web.Response:
    try:
        body = await _admin_body(request)
        match, changes = body.get("match"), body.get("set")
        if not isinstance(match, Mapping) or not isinstance(changes, Mapping):
            raise ValueError('the body must be {"match": {...}, "set": {...}}')
        updated = request.app[STORE_KEY].edit_record(match, changes)
    except (ValueError, LookupError, WAPIError) as exc:
        return _admin_error(exc)
    return _json(updated)


async def _records_delete(request: web.Request) -> web.Response:
    try:
        deleted = request.app[STORE_KEY].remove_records(_criteria(request))
    except (ValueError, WAPIError) as exc:
        return _admin_error(exc)
    if not deleted:
        return _json({"error": "no record matches"}, status=404)
    return _json({"deleted": deleted})


async def _expire_sessions(request: web.Request) -> web.Response:
    return _json({"expired": request.app[STORE_KEY].expire_sessions()})


def server_error_response(status: int, message: str) -> web.StreamResponse:
    """Return an injected 5xx answer the way the appliance's Apache front end sends it.

    Parameters
    ----------
    status:
        The HTTP status (5xx).
    message:
        The reason shown in the page.

    Returns
    -------
    aiohttp.web.Response
        An HTML page: 5xx answers of a grid (e.g. 503 while the grid restarts) are not
        WAPI JSON, so clients must not assume JSON (WAPI documentation, "Error handling").
    """
    page = (
        '<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">\n'
        f"<html><head>\n<title>{status} {message}</title>\n</head><body>\n"
        f"<h1>{message}</h1>\n</body></html>\n"
    )
    return web.Response(status=status, text=page, content_type="text/html")


def _race_matches(request: web.Request) -> bool:
    if request.method != "POST" or "_function" in request.query:
        return False
    path = request.match_info.get("path", "").rstrip("/")
    return path in _ALLOCATING_TYPES


def _race_respond(
    request: web.Request, response: web.StreamResponse | None, mode: str
) -> web.StreamResponse:
    path = request.match_info.get("path", "").rstrip("/")
    name = ""
    if isinstance(response, web.Response) and response.text:
        try:
            result = json.loads(response.text)
        except ValueError:
            result = None
        ref = result.get("result") if isinstance(result, dict) else result
        if isinstance(ref, dict):
            ref = ref.get("_ref")
        if isinstance(ref, str):
            name = ref.partition("/")[2].partition(":")[2].rsplit("/", 1)[0]
    if path == "record:host":
        text = f"The record '{name}' already exists." if name else "The record already exists."
    else:
        text = f"Fixed address {name} already exists." if name else "Fixed address already exists."
    return _error(conflict(text))


def infoblox_race_hooks() -> RaceHooks:
    """Return the `RaceHooks` of this mock: creates of hosts and fixed addresses.

    A lost race answers 400 ``Client.Ibap.Data.Conflict`` (NIOS never answers 409): for a
    host "The record '<name>' already exists.", for a fixed address "Fixed address <ip>
    already exists.". In ``after`` mode the object was created (a lost answer: the client
    must find it by name); in ``instead`` mode nothing was. ``race_error`` is ignored.
    """
    return RaceHooks(matches=_race_matches, respond=_race_respond)


def infoblox_faults(**config: Any) -> FaultInjector:
    """Return a `mock_phpipam.faults.FaultInjector` wired for WAPI (HTML 5xx, conflicts).

    Parameters
    ----------
    **config:
        `mock_phpipam.faults.FaultConfig` fields, e.g. ``error_rate=0.5``.

    Returns
    -------
    FaultInjector
        An injector whose error answers are `server_error_response` pages and whose races
        are `infoblox_race_hooks`.

    Raises
    ------
    pydantic.ValidationError
        When a field is unknown or out of range.
    """
    return FaultInjector(
        FaultConfig(**config),
        error_response=server_error_response,
        race=infoblox_race_hooks(),
    )


async def _health(_: web.Request) -> web.Response:
    return _json({"status": "ok"})


def create_app(store: InfobloxStore, faults: FaultInjector | None = None) -> web.Application:
    """Build the mock WAPI application.

    Parameters
    ----------
    store:
        The grid state every request reads and changes (shared with the caller).
    faults:
        Fault injection (the generic `mock_phpipam.faults.FaultInjector`); None creates an
        inactive `infoblox_faults` injector so the admin API can turn faults on at runtime.

    Returns
    -------
    aiohttp.web.Application
        Routes: ``/wapi/v<version>/<type or _ref>`` (GET search or read, POST create or
        function call, PUT update, DELETE), ``POST /wapi/v<version>/logout``; admin routes
        ``GET|POST /_mock/state`` (dump; reset and/or seed with
        ``{"reset": true, "seed": {...}}``), ``GET|POST|PATCH|DELETE /_mock/records``
        (records edited behind the client's back, see the README), ``POST
        /_mock/sessions/expire``, ``GET|PUT|DELETE /_mock/faults`` and ``GET /_mock/health``.

    Notes
    -----
    Authentication follows the WAPI documentation (https://ipam.illinois.edu/wapidoc/): HTTP
    Basic on a request opens a session and answers ``Set-Cookie: ibapauth="…"; httponly;
    Path=/``; a request without Basic needs a live cookie; anything else gets the 401 HTML page.
    A version newer than the store's ``wapi_version`` answers 400 ``text/plain`` "Version X not
    supported".
    """
    injector = faults if faults is not None else infoblox_faults()
    app = web.Application(middlewares=[injector.middleware])
    app[STORE_KEY] = store
    app[_FAULTS_KEY] = injector
    app.router.add_get("/_mock/state", _state_get)
    app.router.add_post("/_mock/state", _state_post)
    app.router.add_post("/_mock/sessions/expire", _expire_sessions)
    app.router.add_get("/_mock/records", _records_get)
    app.router.add_post("/_mock/records", _records_post)
    app.router.add_patch("/_mock/records", _records_patch)
    app.router.add_delete("/_mock/records", _records_delete)
    app.router.add_get("/_mock/health", _health)
    app.router.add_route("*", "/wapi/{version}/{path:.*}", _wapi)
    injector.add_routes(app)
    return app


def faults_of(app: web.Application) -> FaultInjector:
    """Return the fault injector an app built by `create_app` uses.

    Parameters
    ----------
    app:
        An application from `create_app`.

    Returns
    -------
    FaultInjector
        Its injector.
    """
    return app[_FAULTS_KEY]
