"""Label and field selectors of list/watch requests, as the Kubernetes API parses them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["FieldSelector", "LabelSelector", "SelectorError"]


class SelectorError(ValueError):
    """A selector string that the API server would reject (it answers 400 Bad Request)."""


_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*({_NAME})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*({_NAME})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_NAME})\s*$")


@dataclasses.dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # "notin" and "!=" match objects without the label too (as in the API server).
        return labels.get(self.key) not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """A parsed ``labelSelector`` (all requirements must hold).

    Supports ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists) and
    ``!k`` (does not exist), comma-separated, as in ``k8s.io/apimachinery/pkg/labels``.
    """

    requirements: tuple[_Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Parse a selector string; an empty or missing one selects everything.

        Parameters
        ----------
        text : str or None
            The ``labelSelector`` query parameter.

        Returns
        -------
        LabelSelector

        Raises
        ------
        SelectorError
            If a requirement cannot be parsed.

        """
        reqs: list[_Requirement] = []
        for part in _split_top_level(text or ""):
            if m := _SET_RE.match(part):
                values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
                reqs.append(_Requirement(m.group(1), m.group(2), values))
            elif m := _CMP_RE.match(part):
                op = "notin" if m.group(2) == "!=" else "in"
                reqs.append(_Requirement(m.group(1), op, frozenset([m.group(3)])))
            elif m := _EXISTS_RE.match(part):
                reqs.append(_Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
            else:
                raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Return whether ``obj`` (a Kubernetes object dict) has matching labels."""
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(req.matches(labels) for req in self.requirements)


_FIELD_RE = re.compile(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$")
_FIELDS = {"metadata.name": "name", "metadata.namespace": "namespace"}


@dataclasses.dataclass(frozen=True)
class FieldSelector:
    """A parsed ``fieldSelector`` on ``metadata.name`` and ``metadata.namespace``.

    The API server supports these two fields on every resource (other fields only on some
    built-in resources); the emulator rejects other fields with 400, as the server does for
    custom resources.
    """

    requirements: tuple[tuple[str, bool, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        """Parse a selector string such as ``metadata.name=a,metadata.namespace!=b``.

        Raises
        ------
        SelectorError
            On a syntax error or an unsupported field.

        """
        reqs: list[tuple[str, bool, str]] = []
        for part in _split_top_level(text or ""):
            m = _FIELD_RE.match(part)
            if not m:
                raise SelectorError(f"invalid field selector: {part.strip()!r}")
            if m.group(1) not in _FIELDS:
                raise SelectorError(f"field label not supported: {m.group(1)}")
            reqs.append((_FIELDS[m.group(1)], m.group(2) != "!=", m.group(3)))
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Return whether ``obj`` matches every requirement."""
        meta = obj.get("metadata", {})
        return all(
            (meta.get(field) or "") == value if equal else (meta.get(field) or "") != value
            for field, equal, value in self.requirements
        )
