"""Structural-schema pruning of custom resources, as the API server does on every write.

Sources: https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go
and https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#field-pruning:
fields of a custom
resource that the ``openAPIV3Schema`` of the version in the request does not specify are
dropped when the object is decoded (create, update, patch, of the main resource and of the
``/status`` subresource alike), and the API server answers with a ``Warning`` header per
dropped field (``unknown field "status.kopf"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["prune"]

#: Kept at the root of every custom resource whatever the schema says (the API server
#: handles them itself; ``metadata`` is pruned to ObjectMeta, not by the CRD schema).
_ROOT_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
#: Kept in an object marked ``x-kubernetes-embedded-resource`` (an embedded object).
_EMBEDDED_FIELDS = _ROOT_FIELDS


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Drop, in place, every field of ``obj`` that ``schema`` does not specify.

    Parameters
    ----------
    obj : dict
        A whole custom resource (``apiVersion``, ``kind``, ``metadata``, ``spec``...); it is
        modified in place.
    schema : mapping
        The ``openAPIV3Schema`` of the version the request names (a structural schema).

    Returns
    -------
    list of str
        The paths of the dropped fields, e.g. ``["status.v1beta2", "spec.items[0].x"]``, in
        the order met: what the API server lists in its ``Warning: unknown field`` headers.

    Notes
    -----
    Rules (apiextensions-apiserver's pruning algorithm): an object node keeps the keys in its
    ``properties`` (pruned recursively by their schema); with ``additionalProperties`` as a
    schema every other key is pruned by that schema, with ``additionalProperties: true`` or
    ``x-kubernetes-preserve-unknown-fields: true`` every other key is kept as it is; array
    items are pruned by ``items``; scalars are left alone. ``apiVersion``, ``kind`` and
    ``metadata`` are kept at the root and in ``x-kubernetes-embedded-resource`` objects.
    ``allOf``/``anyOf``/``oneOf``/``not`` add no fields (a structural schema may not), so they
    are ignored. A value whose type does not match its schema is left for validation.

    """
    dropped: list[str] = []
    _prune_object(obj, schema, "", dropped, keep=_ROOT_FIELDS)
    return dropped


def _prune(value: Any, schema: Mapping[str, Any], path: str, dropped: list[str]) -> None:
    if isinstance(value, dict):
        keep = _EMBEDDED_FIELDS if schema.get("x-kubernetes-embedded-resource") else frozenset()
        _prune_object(value, schema, path, dropped, keep=keep)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                _prune(item, items, f"{path}[{index}]", dropped)


def _prune_object(
    obj: dict[str, Any],
    schema: Mapping[str, Any],
    path: str,
    dropped: list[str],
    *,
    keep: frozenset[str],
) -> None:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    for key in list(obj):
        child = f"{path}.{key}" if path else key
        if key in keep:
            continue
        if key in properties:
            _prune(obj[key], properties[key], child, dropped)
        elif isinstance(additional, Mapping):
            _prune(obj[key], additional, child, dropped)
        elif additional is True or preserve:
            continue
        else:
            del obj[key]
            dropped.append(child)
