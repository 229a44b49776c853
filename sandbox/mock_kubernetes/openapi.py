"""OpenAPI v3 validation and defaulting of custom resources, worded as the API server words them.

Sources (Kubernetes, ``staging/src/k8s.io/``):

- ``apiextensions-apiserver/pkg/apiserver/validation/validation.go``
  (``kubeOpenAPIResultToFieldErrors``): how a schema failure becomes a ``field.Error``;
- ``kube-openapi/pkg/validation/validate`` and ``.../errors``: the checks and their messages
  (``spec.x in body should match '^a$'``, ``... must be of type integer: "string"``);
- ``apimachinery/pkg/util/validation/field/errors.go``: ``field.Error`` and its text
  (``<field>: Required value``, ``<field>: Invalid value: <value>: <detail>``,
  ``Unsupported value``, ``Too long``, ``Too many``) and ``Status.details.causes[].reason``
  (``FieldValueRequired``, ``FieldValueInvalid``, ...);
- ``apiextensions-apiserver/pkg/registry/customresource/strategy.go``: a wrong type, a missing
  required field, an unsupported enum value, a too long string or too many items block the
  CEL rules (`BLOCKED_CEL` is reported instead);
- ``apiextensions-apiserver/pkg/apiserver/schema/defaulting``: ``default`` values are filled
  in where a field is absent (or ``null`` and not ``nullable``), top down.

Public documentation: https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation
and #defaulting.

Not modelled: ``uniqueItems``, ``x-kubernetes-list-type`` uniqueness (``Duplicate value``),
``multipleOf``, ``oneOf``/``not`` messages beyond one error, formats other than ``ipv4``,
``ipv6``, ``cidr``, ``date-time``, ``date``, ``uuid`` and ``byte`` (others pass), Go's
``RE2`` regular expressions (Python's ``re`` reads the patterns), ratcheting of lists other
than ``x-kubernetes-list-type: map`` (items are compared by position).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import json
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any

__all__ = ["BLOCKED_CEL", "FieldError", "blocks_cel", "default", "validate"]

Schema = Mapping[str, Any]

#: "No value here": a create, or a place the old object has no (correlated) value at.
_ABSENT: Any = object()

#: ``field.ErrorType`` -> its text (``ErrorType.String()``).
_TYPE_TEXT = {
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
}
#: Error types that stop the CEL rules (strategy.go, ``hasBlockingErr``).
_BLOCKING = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)
_NO_VALUE: Any = object()


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One failure, as the API server's ``field.Error``.

    Attributes
    ----------
    field : str
        The path of the value (``spec.credentialsRef``, ``spec.items[0].name``), ``""`` for
        none (shown as ``<nil>``).
    reason : str
        ``Status.details.causes[].reason``: ``FieldValueRequired``, ``FieldValueInvalid``,
        ``FieldValueTypeInvalid``, ``FieldValueNotSupported``, ``FieldValueTooLong`` or
        ``FieldValueTooMany``.
    body : str
        ``ErrorBody()``: the text without the field (``Required value``, ``Invalid value:
        "x": spec.x in body should match '^a$'``); ``Status.details.causes[].message``.

    """

    field: str
    reason: str
    body: str

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body}"


def _error(path: str, reason: str, value: Any = _NO_VALUE, detail: str = "") -> FieldError:
    """Build a `FieldError` as ``field.Error.ErrorBody`` renders it."""
    text = _TYPE_TEXT[reason]
    if value is not _NO_VALUE and reason not in ("FieldValueRequired", "FieldValueTooLong"):
        text = f"{text}: {_go_value(value)}"
    if detail:
        text = f"{text}: {detail}"
    return FieldError(path, reason, text)


#: The note the API server adds when a blocking error kept the CEL rules from running.
BLOCKED_CEL = FieldError(
    "",
    "FieldValueInvalid",
    "Invalid value: null: some validation rules were not checked because the object was"
    " invalid; correct the existing errors to complete validation",
)


def blocks_cel(errors: list[FieldError]) -> bool:
    """Whether ``errors`` hold a type the API server does not run CEL rules after."""
    return any(e.reason in _BLOCKING for e in errors)


def _go_float(value: float) -> str:
    """Format a float64 as Go's ``%v`` does (``strconv.FormatFloat(f, 'g', -1, 64)``).

    The shortest digits that read back the same value; the exponent form (``3.1536e+07``,
    ``1e-05``) when the decimal exponent is below -4 or at least 6.
    """
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    sign = "-" if value < 0 else ""
    parts = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, parts.digits))
    point = len(digits) + int(parts.exponent)  # digits before the decimal point
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _go_value(value: Any) -> str:
    """Render a bad value as ``ErrorBody`` does: strings quoted, numbers plain, nil ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _go_limit(value: Any) -> str:
    """Print a schema limit as kube-openapi does (a float64): ``128``, ``3.1536e+07``."""
    return _go_float(float(value))


# -- types and formats -------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    """Name the JSON type of a decoded value as kube-openapi does."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _type_matches(schema: Schema, value: Any) -> bool:
    actual = _json_type(value)
    if schema.get("x-kubernetes-int-or-string"):
        return actual in ("integer", "string") or (actual == "number" and float(value).is_integer())
    wanted = schema.get("type")
    if not wanted or wanted == actual:
        return True
    if wanted == "number" and actual == "integer":
        return True
    return wanted == "integer" and actual == "number" and float(value).is_integer()


def _is_cidr(value: str) -> bool:
    if "/" not in value:
        return False
    ipaddress.ip_interface(value)
    return True


def _is_date_time(value: str) -> bool:
    datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    return "T" in value.upper()


_FORMATS: dict[str, Callable[[str], bool]] = {
    "ipv4": lambda v: bool(ipaddress.IPv4Address(v)),
    "ipv6": lambda v: bool(ipaddress.IPv6Address(v)),
    "cidr": _is_cidr,
    "date-time": _is_date_time,
    "datetime": _is_date_time,
    "date": lambda v: bool(date.fromisoformat(v)),
    "uuid": lambda v: bool(uuid.UUID(v)),
    "byte": lambda v: bool(base64.b64decode(v, validate=True) or True),
}


def _format_ok(name: str, value: str) -> bool:
    check = _FORMATS.get(name)
    if check is None:
        return True
    try:
        return bool(check(value))
    except (ValueError, binascii.Error):
        return False


# -- validation ---------------------------------------------------------------------------------


def validate(obj: Any, schema: Schema, old: Any = None) -> list[FieldError]:
    """Validate a custom resource against its version's ``openAPIV3Schema``.

    Parameters
    ----------
    obj : Any
        The object as it would be stored (pruned and defaulted).
    schema : mapping
        The ``openAPIV3Schema`` of the version the request names.
    old : Any
        The stored object on an update (``None`` on a create): a value unchanged from the
        old object at the same place is not checked again (validation ratcheting, on by
        default since Kubernetes 1.30).

    Returns
    -------
    list of FieldError
        The failures, as the API server lists them before its CEL rules' (empty: valid).

    """
    errors: list[FieldError] = []
    _check(obj, schema, "", _ABSENT if old is None else old, errors, root=True)
    return errors


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(
    value: Any,
    schema: Schema,
    path: str,
    old: Any,
    errors: list[FieldError],
    *,
    root: bool = False,
) -> None:
    """Check one value (and what is below it) against one schema node."""
    if old is not _ABSENT and old == value:
        return  # ratcheting: an unchanged value is not checked again
    where = path or "."
    if value is None:
        if schema.get("type") and not schema.get("nullable"):
            errors.append(
                _error(
                    path,
                    "FieldValueTypeInvalid",
                    "null",
                    f'{where} in body must be of type {schema["type"]}: "null"',
                )
            )
        return
    if not _type_matches(schema, value):
        actual = _json_type(value)
        wanted = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
        errors.append(
            _error(
                path,
                "FieldValueTypeInvalid",
                actual,
                f'{where} in body must be of type {wanted}: "{actual}"',
            )
        )
        return
    before = len(errors)
    if isinstance(value, str):
        _check_string(value, schema, path, errors)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(value, schema, path, errors)
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(
            json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"]
        )
        errors.append(_error(path, "FieldValueNotSupported", value, f"supported values: {allowed}"))
    if isinstance(value, list):
        _check_array(value, schema, path, old, errors)
    elif isinstance(value, dict):
        _check_object(value, schema, path, old, errors, root=root)
    if len(errors) == before:
        _check_junctors(value, schema, path, old, errors)


def _check_string(value: str, schema: Schema, path: str, errors: list[FieldError]) -> None:
    where = path or "."
    if "maxLength" in schema and len(value) > int(schema["maxLength"]):
        limit = int(schema["maxLength"])
        unit = "byte" if limit == 1 else "bytes"
        detail = f"may not be more than {limit} {unit}"
        errors.append(_error(path, "FieldValueTooLong", value, detail))
    if "minLength" in schema and len(value) < int(schema["minLength"]):
        detail = f"{where} in body should be at least {int(schema['minLength'])} chars long"
        errors.append(_error(path, "FieldValueInvalid", value, detail))
    pattern = schema.get("pattern")
    if pattern is not None and re.search(str(pattern), value) is None:
        detail = f"{where} in body should match '{pattern}'"
        errors.append(_error(path, "FieldValueInvalid", value, detail))
    fmt = schema.get("format")
    if fmt and not _format_ok(str(fmt), value):
        detail = f"{where} in body must be of type {fmt}: {_go_value(value)}"
        errors.append(_error(path, "FieldValueTypeInvalid", value, detail))


def _check_number(value: float, schema: Schema, path: str, errors: list[FieldError]) -> None:
    where = path or "."
    if "maximum" in schema:
        limit = schema["maximum"]
        exclusive = bool(schema.get("exclusiveMaximum"))
        if value > limit or (exclusive and value == limit):
            relation = "less than" if exclusive else "less than or equal to"
            detail = f"{where} in body should be {relation} {_go_limit(limit)}"
            errors.append(_error(path, "FieldValueInvalid", value, detail))
    if "minimum" in schema:
        limit = schema["minimum"]
        exclusive = bool(schema.get("exclusiveMinimum"))
        if value < limit or (exclusive and value == limit):
            relation = "greater than" if exclusive else "greater than or equal to"
            detail = f"{where} in body should be {relation} {_go_limit(limit)}"
            errors.append(_error(path, "FieldValueInvalid", value, detail))


def _check_array(
    value: list[Any], schema: Schema, path: str, old: Any, errors: list[FieldError]
) -> None:
    where = path or "."
    if "maxItems" in schema and len(value) > int(schema["maxItems"]):
        limit = int(schema["maxItems"])
        detail = f"must have at most {limit} {'item' if limit == 1 else 'items'}"
        errors.append(_error(path, "FieldValueTooMany", len(value), detail))
    if "minItems" in schema and len(value) < int(schema["minItems"]):
        detail = f"{where} in body should have at least {int(schema['minItems'])} items"
        errors.append(_error(path, "FieldValueInvalid", len(value), detail))
    items = schema.get("items")
    if not isinstance(items, Mapping):
        return
    olds = _correlate_items(schema, old, value)
    for index, item in enumerate(value):
        _check(item, items, f"{path}[{index}]", olds[index], errors)


def _correlate_items(schema: Schema, old: Any, new: list[Any]) -> list[Any]:
    """Pair each new item with its old one: by map keys (``list-type: map``), else by index."""
    if not isinstance(old, list):
        return [_ABSENT] * len(new)
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") == "map" and keys:

        def key(item: Any) -> Any:
            return tuple(item.get(k) for k in keys) if isinstance(item, dict) else None

        by_key = {key(item): item for item in old}
        return [by_key.get(key(item), _ABSENT) for item in new]
    return [old[i] if i < len(old) else _ABSENT for i in range(len(new))]


def _check_object(
    value: dict[str, Any],
    schema: Schema,
    path: str,
    old: Any,
    errors: list[FieldError],
    *,
    root: bool,
) -> None:
    where = path or "."
    for name in schema.get("required") or ():
        if name not in value:
            errors.append(_error(_child(path, name), "FieldValueRequired"))
    if "maxProperties" in schema and len(value) > int(schema["maxProperties"]):
        limit = int(schema["maxProperties"])
        detail = f"must have at most {limit} {'item' if limit == 1 else 'items'}"
        errors.append(_error(path, "FieldValueTooMany", len(value), detail))
    if "minProperties" in schema and len(value) < int(schema["minProperties"]):
        detail = f"{where} in body should have at least {int(schema['minProperties'])} properties"
        errors.append(_error(path, "FieldValueInvalid", len(value), detail))
    properties: Schema = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    olds = old if isinstance(old, dict) else {}
    for key, item in value.items():
        if root and key in ("apiVersion", "kind", "metadata"):
            continue  # the API server validates these itself, not by the CRD schema
        sub = properties.get(key, additional if isinstance(additional, Mapping) else None)
        if sub is not None:
            _check(item, sub, _child(path, key), olds.get(key, _ABSENT), errors)


def _check_junctors(
    value: Any, schema: Schema, path: str, old: Any, errors: list[FieldError]
) -> None:
    """``allOf`` (every branch), ``anyOf`` (one branch), ``oneOf`` and ``not``."""
    for branch in schema.get("allOf") or ():
        _check(value, branch, path, old, errors)
    branches = schema.get("anyOf") or ()
    if branches:
        failures = []
        for branch in branches:
            found: list[FieldError] = []
            _check(value, branch, path, _ABSENT, found)
            if not found:
                break
            failures.append(found)
        else:
            errors.append(
                _error("", "FieldValueInvalid", "", "must validate at least one schema (anyOf)")
            )
            errors.extend(failures[0])
    one_of = schema.get("oneOf") or ()
    if one_of:
        passed = 0
        for branch in one_of:
            found = []
            _check(value, branch, path, _ABSENT, found)
            passed += not found
        if passed != 1:
            errors.append(
                _error("", "FieldValueInvalid", "", "must validate one and only one schema (oneOf)")
            )
    negated = schema.get("not")
    if isinstance(negated, Mapping):
        found = []
        _check(value, negated, path, _ABSENT, found)
        if not found:
            errors.append(
                _error(path, "FieldValueInvalid", value, "must not validate the schema (not)")
            )


# -- defaulting ---------------------------------------------------------------------------------


def default(obj: Any, schema: Schema) -> None:
    """Fill in, in place, the schema's ``default`` values where a field is absent.

    As the API server does when it decodes a request (structural defaulting): top down, a
    property absent from an object gets a copy of its ``default`` (and is then defaulted
    itself); a ``null`` property that is not ``nullable`` gets its default, or is dropped when
    it has none; ``items`` and ``additionalProperties`` default every element. Defaults in
    ``allOf``/``anyOf``/``oneOf``/``not`` are not allowed in a structural schema.

    Parameters
    ----------
    obj : Any
        A whole custom resource (or any value below it), modified in place.
    schema : mapping
        The schema node of ``obj``.

    """
    if isinstance(obj, dict):
        properties: Schema = schema.get("properties") or {}
        for key, sub in properties.items():
            if key in obj and obj[key] is None and not sub.get("nullable"):
                del obj[key]  # a null the schema does not allow: defaulted, or dropped
            if key not in obj and "default" in sub:
                obj[key] = json.loads(json.dumps(sub["default"]))
            if key in obj:
                default(obj[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key, item in obj.items():
                if key not in properties:
                    default(item, additional)
    elif isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for item in obj:
                default(item, items)
