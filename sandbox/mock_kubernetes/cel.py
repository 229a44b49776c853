"""CRD validation rules (``x-kubernetes-validations``, CEL), evaluated as the API server does.

Sources: https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go
and https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules.
The emulator's store
(:mod:`mock_kubernetes.store`) and ``tests/unit/test_crds.py`` use this one implementation.

What is evaluated, per schema node holding rules, for every non-null value of the object:

- each rule, with ``self`` bound to the value (at the root: ``apiVersion``, ``kind`` and
  ``metadata`` with only ``name`` and ``generateName``, as the API server exposes them);
- a *transition rule* (one that names ``oldSelf``) only on an update and only where the old
  object has a value at the same place: an object property present in both, a map value of the
  same key, an item of a ``x-kubernetes-list-type: map`` list with the same keys (items of other
  lists are never correlated, so a transition rule below them never runs);
- *ratcheting* (``CRDValidationRatcheting``, on by default since Kubernetes 1.30): a failing
  rule without ``oldSelf`` whose value is unchanged from the old object is a warning, not an
  error;
- a failure gives the rule's ``messageExpression`` (when it evaluates to a string), else its
  ``message``, else ``failed rule: <rule>``, at the rule's place (plus its ``fieldPath``), with
  its ``reason`` (``FieldValueInvalid`` by default); a runtime error gives
  ``<error> evaluating rule: <rule>``.

Values reach CEL typed by their schema: ``number`` as double, strings of format ``date-time``
or ``date`` as timestamps, ``duration`` as durations, ``byte`` as bytes. Not modelled: CEL type
checking and cost budgets (a real server rejects such CRDs when they are created), rules with
``optionalOldSelf`` (cel-python has no optional types: they are skipped), the Kubernetes CEL
libraries (``isURL``, ``ip()``, ``quantity()``... only standard CEL evaluates).

The evaluator is cel-python (``celpy``), a test dependency (the ``test`` extra), not a runtime
one: :data:`AVAILABLE` is ``False`` when it does not import, and callers skip CEL validation.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

try:
    import celpy
    from celpy import celtypes
    from celpy.adapter import json_to_cel
except ImportError:  # pragma: no cover - cel-python is a test dependency only
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = [
    "AVAILABLE",
    "FieldError",
    "Validator",
    "compile_rule",
    "is_transition_rule",
    "rules_of",
]

Schema = Mapping[str, Any]

#: "No value here": a create, or a place where the old object has no (correlated) value.
_ABSENT: Any = object()

_OLD_SELF = re.compile(r"\boldSelf\b")
#: ``reason`` of a rule -> the ``field.Error`` body prefix (``k8s.io/apimachinery`` field errors).
_REASONS = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
}

# celpy's parser and evaluator are not documented as thread-safe; several emulators (threads)
# may validate at once. Compiled programs are shared by rule text.
_LOCK = threading.Lock()
_ENVIRONMENT: Any = None
_PROGRAMS: dict[str, Any] = {}


def is_transition_rule(rule: Mapping[str, Any]) -> bool:
    """Whether ``rule`` (an ``x-kubernetes-validations`` entry) names ``oldSelf``."""
    return _OLD_SELF.search(str(rule.get("rule", ""))) is not None


def _environment() -> Any:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = celpy.Environment()
    return _ENVIRONMENT


def compile_rule(expression: str) -> Any:
    """Compile a CEL expression into a celpy program (cached by text).

    Raises
    ------
    celpy.CELParseError
        On a syntax error.
    RuntimeError
        When cel-python is not installed.

    """
    if not AVAILABLE:
        raise RuntimeError("cel-python (celpy) is not installed")
    with _LOCK:
        program = _PROGRAMS.get(expression)
        if program is None:
            environment = _environment()
            program = environment.program(environment.compile(expression))
            _PROGRAMS[expression] = program
        return program


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One failed rule, as the API server's ``field.Error``.

    Attributes
    ----------
    field : str
        The path of the value (``spec``, ``spec.endpoint``, ``spec.items[0].name``; ``""`` at
        the root).
    reason : str
        ``FieldValueInvalid``, ``FieldValueForbidden``, ``FieldValueRequired`` or
        ``FieldValueDuplicate`` (``Status.details.causes[].reason``).
    value : str
        The schema type at the rule's place (``object``, ``string``...): what the API server
        shows as the invalid value.
    detail : str
        The rule's message (or the evaluation error).

    """

    field: str
    reason: str
    value: str
    detail: str

    @property
    def body(self) -> str:
        """``Invalid value: "object": <detail>`` (the error without its field)."""
        kind = _REASONS.get(self.reason, "Invalid value")
        if self.reason in ("FieldValueForbidden", "FieldValueRequired"):
            return f"{kind}: {self.detail}"
        if self.reason == "FieldValueDuplicate":
            return f'{kind}: "{self.value}"'
        return f'{kind}: "{self.value}": {self.detail}'

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body}"


@dataclasses.dataclass
class _Node:
    """The rules of one schema node and the children with rules below them."""

    schema: Schema
    rules: list[Mapping[str, Any]]
    properties: dict[str, _Node]
    additional: _Node | None
    items: _Node | None

    @classmethod
    def build(cls, schema: Schema) -> _Node | None:
        rules = [
            r
            for r in schema.get("x-kubernetes-validations") or ()
            if isinstance(r, Mapping) and isinstance(r.get("rule"), str)
        ]
        properties = {}
        for name, sub in (schema.get("properties") or {}).items():
            child = cls.build(sub) if isinstance(sub, Mapping) else None
            if child is not None:
                properties[name] = child
        extra = schema.get("additionalProperties")
        additional = cls.build(extra) if isinstance(extra, Mapping) else None
        items_schema = schema.get("items")
        items = cls.build(items_schema) if isinstance(items_schema, Mapping) else None
        if not rules and not properties and additional is None and items is None:
            return None
        return cls(schema, rules, properties, additional, items)


def rules_of(schema: Schema) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every rule of ``schema`` with its place (``.spec.endpoint``, ``.spec.items[]``, ``.*``)."""

    def walk(node: Schema, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        for rule in node.get("x-kubernetes-validations") or ():
            if isinstance(rule, Mapping) and isinstance(rule.get("rule"), str):
                yield path, rule
        for name, sub in (node.get("properties") or {}).items():
            if isinstance(sub, Mapping):
                yield from walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), Mapping):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), Mapping):
            yield from walk(node["additionalProperties"], f"{path}.*")

    return walk(schema, "")


class Validator:
    """The ``x-kubernetes-validations`` rules of one ``openAPIV3Schema`` (a CRD version).

    Parameters
    ----------
    schema : mapping
        The structural schema of the whole object.

    Notes
    -----
    Rules are compiled on first use (and cached by text, so that loading a CRD costs nothing).
    :meth:`validate` needs cel-python (:data:`AVAILABLE`).

    """

    def __init__(self, schema: Schema) -> None:
        self._root = _Node.build(schema)

    @property
    def has_rules(self) -> bool:
        """Whether the schema holds any rule."""
        return self._root is not None

    def validate(
        self, obj: Any, old: Any = None, *, root: bool = True
    ) -> tuple[list[FieldError], list[FieldError]]:
        """Evaluate the rules on ``obj`` (an update of ``old`` when it is not ``None``).

        Parameters
        ----------
        obj : Any
            The object as it would be stored (pruned, defaulted).
        old : Any
            The stored object on an update; ``None`` on a create (transition rules do not run).
        root : bool
            ``obj`` is a whole resource (``self`` at the root sees ``apiVersion``, ``kind`` and
            ``metadata.name``/``generateName`` only, as on the API server).

        Returns
        -------
        tuple of (list of FieldError, list of FieldError)
            The errors, and the failures ratcheted into warnings (unchanged values).

        """
        errors: list[FieldError] = []
        ratcheted: list[FieldError] = []
        if self._root is None:
            return errors, ratcheted
        old_value = _ABSENT if old is None else old
        if root:
            obj, old_value = _root_view(obj), _root_view(old_value)
        self._validate(self._root, obj, old_value, "", errors, ratcheted)
        return errors, ratcheted

    def _validate(
        self,
        node: _Node,
        value: Any,
        old: Any,
        path: str,
        errors: list[FieldError],
        ratcheted: list[FieldError],
    ) -> None:
        if value is None:  # rules validate non-null values only
            return
        if old is None:
            old = _ABSENT
        if node.rules:
            self._expressions(node, value, old, path, errors, ratcheted)
        if isinstance(value, dict):
            old_map = old if isinstance(old, dict) else {}
            for name, child in node.properties.items():
                if name in value:
                    child_path = f"{path}.{name}" if path else name
                    old_child = old_map.get(name, _ABSENT)
                    self._validate(child, value[name], old_child, child_path, errors, ratcheted)
            if node.additional is not None:
                for key, item in value.items():
                    if key in node.schema.get("properties", {}):
                        continue
                    child_path = f"{path}.{key}" if path else key
                    old_item = old_map.get(key, _ABSENT)
                    self._validate(node.additional, item, old_item, child_path, errors, ratcheted)
        elif isinstance(value, list) and node.items is not None:
            correlate = _list_correlation(node.schema, old)
            for index, item in enumerate(value):
                self._validate(
                    node.items, item, correlate(item), f"{path}[{index}]", errors, ratcheted
                )

    def _expressions(
        self,
        node: _Node,
        value: Any,
        old: Any,
        path: str,
        errors: list[FieldError],
        ratcheted: list[FieldError],
    ) -> None:
        schema_type = str(node.schema.get("type") or "object")
        activation: dict[str, Any] = {"self": to_cel(value, node.schema)}
        unchanged = old is not _ABSENT and old == value
        for rule in node.rules:
            transition = is_transition_rule(rule)
            if transition:
                if old is _ABSENT or rule.get("optionalOldSelf"):
                    continue  # transition rules need a correlated old value
                activation["oldSelf"] = to_cel(old, node.schema)
            expression = rule["rule"]
            outcome = _evaluate(expression, activation)
            activation.pop("oldSelf", None)
            if isinstance(outcome, Exception):
                errors.append(
                    FieldError(
                        path,
                        "FieldValueInvalid",
                        schema_type,
                        f"{_describe(outcome)} evaluating rule: {expression.strip()}",
                    )
                )
                continue
            if isinstance(outcome, celtypes.BoolType) and bool(outcome):
                continue
            failed_path = path
            if rule.get("fieldPath"):
                extra = str(rule["fieldPath"]).lstrip(".")
                failed_path = f"{path}.{extra}" if path else extra
            error = FieldError(
                failed_path,
                str(rule.get("reason") or "FieldValueInvalid"),
                schema_type,
                self._message(rule, activation),
            )
            (ratcheted if unchanged and not transition else errors).append(error)

    @staticmethod
    def _message(rule: Mapping[str, Any], activation: dict[str, Any]) -> str:
        if rule.get("messageExpression"):
            text = _evaluate(str(rule["messageExpression"]), activation)
            if isinstance(text, str) and text.strip() and "\n" not in text:
                return str(text)
        message = rule.get("message")
        if message:
            return str(message)
        return f"failed rule: {str(rule['rule']).strip()}"


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """Evaluate ``expression``: its value, or the exception (``CELEvalError``) it gave."""
    program = compile_rule(expression)
    with _LOCK:
        try:
            return program.evaluate(dict(activation))
        except Exception as exc:  # celpy's own errors, and any other as one
            return exc


def _describe(error: Exception) -> str:
    args = [a for a in error.args if isinstance(a, str)]
    return args[0] if args else str(error)


def _root_view(obj: Any) -> Any:
    """Return the object as CEL sees it at the root: ``metadata`` with name/generateName only."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "generateName")}
    return {**obj, "metadata": meta}


def _list_correlation(schema: Schema, old: Any) -> Any:
    """``item -> old item``: by the map keys of a ``list-type: map`` list, else never."""
    keys: Sequence[str] = schema.get("x-kubernetes-list-map-keys") or ()
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return lambda item: _ABSENT
    by_key = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}

    def correlate(item: Any) -> Any:
        if not isinstance(item, dict):
            return _ABSENT
        return by_key.get(tuple(item.get(k) for k in keys), _ABSENT)

    return correlate


def to_cel(value: Any, schema: Schema | None) -> Any:
    """Convert a JSON value into CEL, typed by its schema as Kubernetes does.

    ``number`` becomes a double; strings of format ``date-time``/``date`` a timestamp,
    ``duration`` a duration and ``byte`` bytes (left as strings when they do not parse); object
    properties, map values and list items follow their own schemas.
    """
    if schema is None:
        return json_to_cel(value)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return celtypes.MapType(
            {
                celtypes.StringType(key): to_cel(
                    item,
                    properties.get(key) if key in properties else _mapping_or_none(extra),
                )
                for key, item in value.items()
            }
        )
    if isinstance(value, list):
        items = _mapping_or_none(schema.get("items"))
        return celtypes.ListType([to_cel(item, items) for item in value])
    if isinstance(value, bool) or value is None:
        return json_to_cel(value)
    if isinstance(value, int) and schema.get("type") == "number":
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        try:
            match schema.get("format"):
                case "date-time" | "date":
                    return celtypes.TimestampType(value)
                case "duration":
                    return celtypes.DurationType(value)
                case "byte":
                    return celtypes.BytesType(base64.b64decode(value, validate=True))
        except (ValueError, TypeError):
            pass
    return json_to_cel(value)


def _mapping_or_none(value: Any) -> Schema | None:
    return value if isinstance(value, Mapping) else None
