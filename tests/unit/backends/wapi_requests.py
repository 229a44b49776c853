"""Check WAPI requests against the WAPI 2.12 schema, and `responses` helpers for the searches.

`refusals` tells why a grid would refuse one request (the search fields of ``GET <object>``,
the fields of ``_return_fields``, the body fields of ``POST <object>`` / ``PUT <ref>``, the
``_function`` of ``POST <ref>``, and the next-available-IP forms inside a body), from the
schema data the mock serves (``sandbox/mock_infoblox/wapi/wapi-2.12.json``, extracted from the WAPI
2.12 OpenAPI description Infoblox generated).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import responses
from responses import matchers

from mock_infoblox.schema import WAPI_SCHEMA

OBJECTS: dict[str, dict[str, list[str]]] = WAPI_SCHEMA["objects"]
CONTROL = {"_return_fields", "_return_fields+", "_max_results", "_return_as_object", "_paging"}
#: Fields of the address structs inside ``record:host`` (``record:host_ipv4addr`` and
#: ``record:host_ipv6addr`` in the WAPI reference); the client sends these only.
HOST_ADDRESS_FIELDS = {"ipv4addr", "ipv6addr", "configure_for_dhcp", "mac", "duid"}
NEXT_AVAILABLE_KEYS = {
    "_object_function",
    "_object",
    "_object_parameters",
    "_result_field",
    "_parameters",
}


def refusals(method: str, url: str, body: bytes | str | None) -> list[str]:
    """Return why a WAPI 2.12 grid would refuse this request (empty: it accepts it)."""
    parts = urlsplit(url)
    path = unquote(parts.path).split("/wapi/v", 1)[1].split("/", 1)[1]
    if path == "logout":
        return []
    obj, _, ref_rest = path.partition("/")
    if obj not in OBJECTS:
        return [f"{method} {obj}: not an object the schema data describes"]
    schema = OBJECTS[obj]
    query = parse_qsl(parts.query, keep_blank_values=True)
    problems = [f"{obj}: {p}" for p in _query_refusals(method, bool(ref_rest), schema, query)]
    data = json.loads(body) if body else None
    if method == "POST" and not ref_rest:
        problems += [f"POST {obj}: {p}" for p in _body_refusals(obj, schema["create"], data)]
    elif method == "PUT":
        problems += [f"PUT {obj}: {p}" for p in _body_refusals(obj, schema["update"], data)]
    return problems


def _query_refusals(
    method: str, on_ref: bool, schema: dict[str, list[str]], query: list[tuple[str, str]]
) -> list[str]:
    problems = []
    for key, value in query:
        if key in ("_return_fields", "_return_fields+"):
            problems += [
                f"unknown return field {f!r}"
                for f in value.split(",")
                if f and f not in schema["fields"]
            ]
        elif key == "_function":
            if method != "POST" or not on_ref or value not in schema["functions"]:
                problems.append(f"function {value!r} not offered")
        elif key == "_page_id" or key in CONTROL:
            continue
        elif method != "GET" or on_ref:
            problems.append(f"search argument {key!r} outside a search")
        elif key.rstrip("~:<>!") not in schema["search"]:
            problems.append(f"Field is not searchable: {key}")
    return problems


def _body_refusals(obj: str, allowed: list[str], data: Any) -> list[str]:
    if not isinstance(data, dict):
        return ["body is not a JSON object"]
    problems = [f"field {k!r} not accepted" for k in data if k not in allowed]
    values: list[Any] = []
    for family in ("ipv4", "ipv6"):
        for item in data.get(f"{family}addrs") or []:
            problems += [f"address field {k!r}" for k in item if k not in HOST_ADDRESS_FIELDS]
            values.append(item.get(f"{family}addr"))
    values += [data.get("ipv4addr"), data.get("ipv6addr")]
    for value in values:
        problems += _next_available_refusals(value)
    return problems


def _next_available_refusals(value: Any) -> list[str]:
    if isinstance(value, str) and value.startswith("func:"):
        return [] if value.startswith("func:nextavailableip:") else [f"function {value!r}"]
    if not isinstance(value, dict):
        return []
    problems = [f"next-available key {k!r}" for k in value if k not in NEXT_AVAILABLE_KEYS]
    target = OBJECTS.get(str(value.get("_object")), {})
    if value.get("_object_function") not in target.get("functions", []):
        problems.append(f"{value.get('_object')} offers no {value.get('_object_function')}")
    problems += [
        f"object parameter {k!r} is not searchable"
        for k in value.get("_object_parameters") or {}
        if k not in target.get("search", [])
    ]
    problems += [
        f"parameter {k!r}" for k in value.get("_parameters") or {} if k not in ("num", "exclude")
    ]
    return problems


def assert_grid_accepts(calls: Any) -> None:
    """Fail when any recorded `responses` call is a request a WAPI 2.12 grid refuses."""
    problems = [
        f"{call.request.method} {call.request.url}: {problem}"
        for call in calls
        for problem in refusals(str(call.request.method), str(call.request.url), call.request.body)
    ]
    assert not problems, "requests a grid refuses:\n" + "\n".join(problems)


def add_fixed_search(
    rsps: responses.RequestsMock,
    hostname: str,
    records: list[dict[str, Any]],
    *,
    view: str = "default",
    v6: bool = False,
) -> None:
    """Answer the client's fixed-address lookup of ``hostname`` with ``records``.

    ``GET ipv4address|ipv6address?names=<hostname>&network_view=<view>`` lists each
    record's address with its ``_ref`` in ``objects``; ``GET <_ref>`` reads each record.
    """
    address_field = "ipv6addr" if v6 else "ipv4addr"
    rsps.get(
        f"{WAPI_BASE}/{'ipv6address' if v6 else 'ipv4address'}",
        match=[
            matchers.query_param_matcher(
                {
                    "names": hostname,
                    "network_view": view,
                    "_return_fields": "ip_address,names,objects",
                }
            )
        ],
        json=[
            {
                "_ref": f"ipv4address/x:{r[address_field]}",
                "ip_address": r[address_field],
                "names": [hostname],
                "objects": [r["_ref"]],
            }
            for r in records
        ],
    )
    for record in records:
        rsps.get(f"{WAPI_BASE}/{record['_ref']}", json=record)


WAPI_BASE = "https://gm.example.com/wapi/v2.12"
