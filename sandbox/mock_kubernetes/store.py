"""The object store behind the in-memory Kubernetes API: versions, patches, finalizers, watches."""

from __future__ import annotations

import asyncio
import base64
import builtins
import copy
import dataclasses
import datetime
import json
import random
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import jsonpatch
import jsonpointer

from mock_kubernetes import cel, openapi
from mock_kubernetes.resources import ResourceDef
from mock_kubernetes.schema import prune
from mock_kubernetes.selectors import FieldSelector, LabelSelector, SelectorError

__all__ = ["IMMORTAL_NAMESPACES", "Admit", "ApiError", "ObjectStore", "WatchEvent", "merge_patch"]

Obj = dict[str, Any]
_Key = tuple[str, str]  # (group, plural)
_ObjKey = tuple[str | None, str]  # (namespace, name)

#: An admission check run on every create and update before it is stored:
#: ``admit(defn, operation, new, old)`` with ``operation`` ``"CREATE"`` or ``"UPDATE"``, the
#: object as it would be stored and the stored one (``None`` on create); it refuses the write
#: by raising :class:`ApiError`.
Admit = Callable[[ResourceDef, str, "Obj", "Obj | None"], None]

_NAMESPACES: _Key = ("", "namespaces")
#: Namespaces the API server refuses to delete (NamespaceLifecycle admission plugin).
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
#: The finalizer the namespace strategy puts in ``spec.finalizers`` of every Namespace; the
#: namespace controller removes it once the namespace is empty.
_NAMESPACE_FINALIZER = "kubernetes"

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# As in k8s.io/apiserver/pkg/storage/names (SimpleNameGenerator).
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class ApiError(Exception):
    """A failure the API server reports as a ``Status`` object.

    Parameters
    ----------
    status : int
        HTTP status code (400, 401, 403, 404, 409, 410, 415, 422).
    reason : str
        ``Status.reason``: ``BadRequest``, ``Unauthorized``, ``Forbidden``, ``NotFound``,
        ``AlreadyExists``, ``Conflict``, ``Expired``, ``UnsupportedMediaType``, ``Invalid``.
    message : str
        Human-readable message, modelled on the API server's.
    details : dict or None
        ``Status.details`` (``name``, ``group``, ``kind``, ``causes``), when the API server
        sends them (``422 Invalid``).

    """

    def __init__(self, status: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details

    def to_status(self) -> Obj:
        """Return the ``v1 Status`` body the API server would send."""
        status: Obj = {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": self.status,
            "reason": self.reason,
            "message": self.message,
        }
        if self.details is not None:
            status["details"] = copy.deepcopy(self.details)
        return status


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a JSON merge patch (RFC 7386) and return the result (inputs are not modified).

    Parameters
    ----------
    target : Any
        The document to patch.
    patch : Any
        The merge patch: objects merge recursively, ``null`` removes a key, anything else
        (lists included) replaces.

    Returns
    -------
    Any
        A new document.

    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One change of one object, as kept in a resource's event history.

    Attributes
    ----------
    rv : int
        The resourceVersion the change produced.
    type : str
        ``ADDED``, ``MODIFIED`` or ``DELETED``.
    obj : dict
        The object after the change (the last state for ``DELETED``).
    old : dict or None
        The object before the change (for selector transitions), ``None`` for ``ADDED``.

    """

    rv: int
    type: str
    obj: Obj
    old: Obj | None


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _normalize(defn: ResourceDef, obj: Obj) -> None:
    """Apply what the API server's strategies do to every write of some built-in kinds.

    A Secret's ``stringData`` is merged into ``data`` (base64) and never stored
    (``pkg/apis/core/v1`` conversion of Secret).
    """
    if defn.key == ("", "secrets") and "stringData" in obj:
        string_data = obj.pop("stringData") or {}
        data = dict(obj.get("data") or {})
        data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
        obj["data"] = data


def _condition(type_: str, status: bool, reason: str, message: str) -> Obj:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def _merge_conditions(
    current: builtins.list[Obj], updates: builtins.list[Obj]
) -> builtins.list[Obj]:
    """Replace conditions by type; keep ``lastTransitionTime`` when the status is unchanged."""
    result = [dict(c) for c in current]
    for update in updates:
        for index, existing in enumerate(result):
            if existing.get("type") == update["type"]:
                same = existing.get("status") == update["status"]
                if same and all(existing.get(k) == update[k] for k in ("reason", "message")):
                    break
                when = existing.get("lastTransitionTime") if same else None
                result[index] = {
                    **update,
                    "lastTransitionTime": when or update["lastTransitionTime"],
                }
                break
        else:
            result.append(update)
    return result


def _held(defn: ResourceDef, obj: Obj) -> bool:
    """Whether finalizers keep an object being deleted (a Namespace's ``spec.finalizers`` too)."""
    if obj["metadata"].get("finalizers"):
        return True
    return defn.key == _NAMESPACES and bool((obj.get("spec") or {}).get("finalizers"))


def _check_preconditions(meta: Mapping[str, Any], options: Mapping[str, Any] | None) -> None:
    """Raise 409 when a DELETE's ``preconditions`` (uid, resourceVersion) do not hold."""
    pre = (options or {}).get("preconditions") or {}
    for field in ("resourceVersion", "uid"):
        if pre.get(field) and pre[field] != meta.get(field):
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: {field}"
                f" in precondition: {pre[field]}, in object meta: {meta.get(field)}",
            )


def _spec_part(obj: Mapping[str, Any], with_status: bool) -> Obj:
    """Everything that bumps ``metadata.generation`` when changed."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if not with_status else set())
    return {k: v for k, v in obj.items() if k not in skip}


@dataclasses.dataclass(eq=False)
class _Watcher:
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[WatchEvent | None]

    def selects(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

    def translate(self, event: WatchEvent) -> WatchEvent | None:
        """Adjust the event type to selector transitions (as the API server's watch cache)."""
        now, before = self.selects(event.obj), self.selects(event.old)
        if event.type == "MODIFIED":
            if now and not before:
                return dataclasses.replace(event, type="ADDED")
            if before and not now:
                return dataclasses.replace(event, type="DELETED")
        return event if now else None


class ObjectStore:
    """In-memory objects of all declared resources with the Kubernetes API's write semantics.

    All methods must be called on the event loop that serves the API (they are synchronous and
    never await, so every write is atomic with respect to watches).

    Parameters
    ----------
    history_limit : int
        How many watch events to keep per resource for watch resumption; a watch from an older
        resourceVersion receives ``410 Gone`` (``Expired``).
    garbage_collection : bool
        When true, an object whose every ``ownerReferences`` owner is finally deleted is deleted
        too (background propagation; finalizers of dependents are honoured), at once, as the
        garbage collector of kube-controller-manager does within about a second.
    namespace_lifecycle : bool
        When true (the default), namespaces behave as on a real cluster: creating an object in
        a namespace that does not exist is ``404 NotFound`` and in a terminating one
        ``403 Forbidden``; deleting a namespace marks it ``Terminating`` and the namespace
        controller deletes everything in it (see :meth:`delete`). When false, namespaces are
        plain objects that nothing checks.
    crd_validation : bool
        When true (the default), writes of custom resources are defaulted and checked against
        the ``openAPIV3Schema`` of the request's version (see :mod:`mock_kubernetes.openapi`)
        and then against its ``x-kubernetes-validations`` (CEL) rules, transition rules
        included, and refused with ``422 Invalid`` (see :mod:`mock_kubernetes.cel`); the CEL
        rules only when cel-python (``celpy``) is installed (a test dependency).

    Notes
    -----
    Semantics follow https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
    and ``apiextensions-apiserver`` (custom resource and status strategies, structural pruning:
    https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/strategy.go):
    a global resourceVersion counter, ``generation`` bumped on non-metadata changes,
    optimistic concurrency, finalizers with ``deletionTimestamp``, status subresource
    separation, pruning of fields unknown to the CRD schema of the request's version, the
    CRD's CEL validation rules, no-op writes that change nothing. Namespace lifecycle follows
    the NamespaceLifecycle admission plugin and kube-controller-manager's namespace controller
    (https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/namespace/deletion).

    """

    def __init__(
        self,
        *,
        history_limit: int = 2000,
        garbage_collection: bool = True,
        namespace_lifecycle: bool = True,
        crd_validation: bool = True,
    ) -> None:
        self._defs: dict[_Key, ResourceDef] = {}
        self._objects: dict[_Key, dict[_ObjKey, Obj]] = {}
        self._history: dict[_Key, deque[WatchEvent]] = {}
        self._expired_rv: dict[_Key, int] = {}
        self._watchers: dict[_Key, set[_Watcher]] = {}
        self._uids: dict[str, tuple[_Key, _ObjKey]] = {}
        # owner uid -> the objects naming it in ownerReferences (garbage collection).
        self._dependents: dict[str, set[tuple[_Key, _ObjKey]]] = {}
        self._rv = 0
        self._history_limit = history_limit
        self._gc = garbage_collection
        self._ns_lifecycle = namespace_lifecycle
        self._openapi = crd_validation
        self._crd_validation = crd_validation and cel.AVAILABLE
        self._validators: dict[tuple[_Key, str], cel.Validator] = {}
        self._bulk_deleting: set[str] = set()  # namespaces whose content is being deleted
        self._closed = False

    # -- resources ------------------------------------------------------------------------------

    def declare(self, defn: ResourceDef) -> None:
        """Serve ``defn`` (re-declaring replaces the description and keeps the objects)."""
        self._defs[defn.key] = defn
        for version in defn.versions:
            self._validators.pop((defn.key, version), None)
        self._objects.setdefault(defn.key, {})
        self._history.setdefault(defn.key, deque(maxlen=self._history_limit))
        self._watchers.setdefault(defn.key, set())

    @property
    def resources(self) -> builtins.list[ResourceDef]:
        """All declared resources."""
        return list(self._defs.values())

    @property
    def crd_validation(self) -> bool:
        """Whether CRD validation rules are enforced (asked for, and cel-python installed)."""
        return self._crd_validation

    @property
    def schema_validation(self) -> bool:
        """Whether custom resources are defaulted and checked against their OpenAPI schema."""
        return self._openapi

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion counter."""
        return self._rv

    def resolve(self, group: str, version: str | None, plural: str) -> ResourceDef:
        """Return the resource served at ``group/version/plural``.

        Raises
        ------
        ApiError
            404 if the resource or that version is not served.

        """
        defn = self._defs.get((group, plural))
        if defn is None or (version is not None and version not in defn.versions):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return defn

    def find_kind(self, api_version: str, kind: str) -> ResourceDef:
        """Return the resource of an object's ``apiVersion`` and ``kind``.

        Raises
        ------
        ApiError
            404 if no declared resource has that kind in that group/version.

        """
        group, _, version = api_version.rpartition("/")
        for defn in self._defs.values():
            if defn.group == group and defn.kind == kind and version in defn.versions:
                return defn
        raise ApiError(404, "NotFound", f"no resource for {api_version} {kind}")

    # -- reads ----------------------------------------------------------------------------------

    def _render(self, defn: ResourceDef, obj: Obj, version: str | None) -> Obj:
        out = copy.deepcopy(obj)
        out["apiVersion"] = defn.api_version(version or defn.preferred_version)
        out["kind"] = defn.kind
        return out

    def _check_ns(self, defn: ResourceDef, namespace: str | None) -> str | None:
        if defn.namespaced:
            return namespace
        if namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return None

    def _current(self, defn: ResourceDef, namespace: str | None, name: str) -> Obj:
        namespace = self._check_ns(defn, namespace)
        if defn.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        obj = self._objects[defn.key].get((namespace, name))
        if obj is None:
            group = f".{defn.group}" if defn.group else ""
            raise ApiError(404, "NotFound", f'{defn.plural}{group} "{name}" not found')
        return obj

    def get(
        self, defn: ResourceDef, namespace: str | None, name: str, version: str | None = None
    ) -> Obj:
        """Return a copy of one object.

        Raises
        ------
        ApiError
            404 if it does not exist.

        """
        return self._render(defn, self._current(defn, namespace, name), version)

    def list(
        self,
        defn: ResourceDef,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        version: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Obj:
        """Return a ``<Kind>List`` of matching objects with the current resourceVersion.

        Paged as the API server pages a list (``limit`` and ``continue``,
        https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks):
        with ``limit``, at most that many items, in the order of (name, namespace), and
        ``metadata.continue`` when more remain; a continued page carries the first page's
        resourceVersion. Unlike etcd, a continued page shows the objects as they are now
        (not a snapshot at that resourceVersion); a token whose resourceVersion is older
        than the oldest event kept (the history was compacted: `expire_history`, or more than
        ``history_limit`` events) answers 410 Expired, as the API server does.

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            ``None`` lists all namespaces (or a cluster-scoped resource).
        label_selector, field_selector : str or None
            Query parameters ``labelSelector`` and ``fieldSelector``.
        version : str or None
            The requested API version (``apiVersion`` of the answer); preferred when ``None``.
        limit : int or None
            Query parameter ``limit`` (0 or None: all).
        continue_token : str or None
            Query parameter ``continue``: the ``metadata.continue`` of the previous page.

        Raises
        ------
        ApiError
            400 on an unparseable selector or continue token, 410 on an expired token.

        """
        namespace = self._check_ns(defn, namespace)
        labels, fields = self._selectors(label_selector, field_selector)
        list_rv, after = self._rv, None
        if continue_token:
            list_rv, after = self._continued(defn, continue_token)
        ordered = sorted(self._objects[defn.key].items(), key=lambda kv: (kv[0][1], kv[0][0]))
        chosen = [
            ((name, ns), obj)
            for (ns, name), obj in ordered
            if namespace is None or ns == namespace
            if after is None or (name, ns) > after
            if labels.matches(obj) and fields.matches(obj)
        ]
        meta: Obj = {"resourceVersion": str(list_rv)}
        if limit and len(chosen) > limit:
            chosen = chosen[:limit]
            last = chosen[-1][0]
            token = {"rv": list_rv, "after": list(last)}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
        return {
            "apiVersion": defn.api_version(version or defn.preferred_version),
            "kind": f"{defn.kind}List",
            "metadata": meta,
            "items": [self._render(defn, obj, version) for _, obj in chosen],
        }

    def _continued(self, defn: ResourceDef, token: str) -> tuple[int, tuple[str, str]]:
        """Return the list resourceVersion and the last (name, namespace) of a continue token.

        Raises
        ------
        ApiError
            400 when the token is not one of ours; 410 Expired when its resourceVersion is
            older than the oldest event kept.
        """
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            list_rv, (name, ns) = int(decoded["rv"]), decoded["after"]
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "BadRequest", f"invalid continue token {token!r}") from None
        if list_rv < self._expired_rv.get(defn.key, 0):
            raise ApiError(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter.",
            )
        return list_rv, (str(name), str(ns))

    @staticmethod
    def _selectors(
        label_selector: str | None, field_selector: str | None
    ) -> tuple[LabelSelector, FieldSelector]:
        try:
            return LabelSelector.parse(label_selector), FieldSelector.parse(field_selector)
        except SelectorError as e:
            raise ApiError(400, "BadRequest", str(e)) from None

    # -- writes ---------------------------------------------------------------------------------

    def _emit(self, defn: ResourceDef, event: WatchEvent) -> None:
        history = self._history[defn.key]
        if history.maxlen is not None and len(history) == history.maxlen:
            self._expired_rv[defn.key] = history[0].rv
        history.append(event)
        for watcher in list(self._watchers[defn.key]):
            translated = watcher.translate(event)
            if translated is not None:
                watcher.queue.put_nowait(translated)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(
        self,
        defn: ResourceDef,
        namespace: str | None,
        body: Mapping[str, Any],
        version: str | None = None,
        *,
        admit: Admit | None = None,
        warnings: builtins.list[str] | None = None,
        dry_run: bool = False,
        field_validation: str | None = None,
    ) -> Obj:
        """Create an object (``POST`` to the collection).

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            The namespace of the URL (required for namespaced resources).
        body : mapping
            The object; ``metadata.generateName`` is honoured when ``name`` is empty.
        version : str or None
            The requested API version (``apiVersion`` of the answer; its CRD schema prunes the
            object); preferred when ``None``.
        admit : Admit or None
            Admission check of the request's identity (see :data:`Admit`).
        warnings : list of str or None
            Receives one ``unknown field "<path>"`` per pruned field (the API server's
            ``Warning`` headers).
        dry_run : bool
            ``?dryRun=All``: every check runs, nothing is stored, no watch event is sent; the
            answer has a uid and creationTimestamp but no resourceVersion.
        field_validation : str or None
            ``?fieldValidation=``: ``Strict`` refuses unknown fields (``400 BadRequest``,
            ``strict decoding error: unknown field "spec.x"``) instead of pruning them with a
            warning.

        Returns
        -------
        dict
            The stored object with uid, creationTimestamp, resourceVersion (and generation).

        Raises
        ------
        ApiError
            400 on a namespace mismatch or an unknown field under ``Strict``, 403
            ``Forbidden`` in a terminating namespace (or from ``admit``), 404 ``NotFound`` in a
            namespace that does not exist, 409 ``AlreadyExists``, 422 without a name or when
            the object breaks its schema (see :meth:`_validate`).

        """
        namespace = self._check_ns(defn, namespace)
        obj: Obj = copy.deepcopy(dict(body))
        self._prune(defn, obj, version, warnings, strict=field_validation == "Strict")
        self._default(defn, obj, version)
        meta: Obj = obj.setdefault("metadata", {})
        if defn.namespaced:
            body_ns = meta.get("namespace")
            if namespace is None:
                namespace = body_ns
            if namespace is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if body_ns not in (None, namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not"
                    " match the namespace sent on the request",
                )
            meta["namespace"] = namespace
            self._check_namespace_accepts(defn, namespace, str(meta.get("name") or ""))
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"{defn.kind} is invalid: metadata.name: Required"
                    " value: name or generateName is required",
                )
            for _ in range(100):
                suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
                if (namespace, meta["generateName"] + suffix) not in self._objects[defn.key]:
                    break
            meta["name"] = meta["generateName"] + suffix
        name = meta["name"]
        if (namespace, name) in self._objects[defn.key]:
            group = f".{defn.group}" if defn.group else ""
            raise ApiError(409, "AlreadyExists", f'{defn.plural}{group} "{name}" already exists')
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(field, None)
        if defn.status_subresource:
            obj.pop("status", None)
        if defn.key == _NAMESPACES:
            # The namespace strategy (PrepareForCreate) sets both, whatever the request says.
            obj["spec"] = {"finalizers": [_NAMESPACE_FINALIZER]}
            obj["status"] = {"phase": "Active"}
        obj["apiVersion"] = defn.api_version(version or defn.preferred_version)
        obj["kind"] = defn.kind
        _normalize(defn, obj)
        self._validate(defn, obj, None, version, warnings)
        if admit is not None:
            admit(defn, "CREATE", obj, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if defn.custom:
            meta["generation"] = 1
        if dry_run:
            return self._render(defn, obj, version)
        meta["resourceVersion"] = self._next_rv()
        self._objects[defn.key][(namespace, name)] = obj
        self._uids[meta["uid"]] = (defn.key, (namespace, name))
        self._index_owners(defn.key, (namespace, name), None, obj)
        rv = int(meta["resourceVersion"])
        self._emit(defn, WatchEvent(rv, "ADDED", copy.deepcopy(obj), None))
        return self._render(defn, obj, version)

    def replace(
        self,
        defn: ResourceDef,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        version: str | None = None,
        admit: Admit | None = None,
        warnings: builtins.list[str] | None = None,
    ) -> Obj:
        """Replace an object (``PUT``), on the main endpoint or ``/status``.

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            The namespace (``None`` for cluster-scoped resources).
        name : str
            ``metadata.name``.
        body : mapping
            The whole object.
        subresource : str or None
            ``"status"`` for the status subresource, ``None`` for the main resource.
        version : str or None
            The requested API version (its CRD schema prunes the object); preferred when
            ``None``.
        admit : Admit or None
            Admission check of the request's identity (see :data:`Admit`).
        warnings : list of str or None
            Receives one ``unknown field "<path>"`` per pruned field.

        Returns
        -------
        dict
            The stored object; unchanged, with the same resourceVersion, when the write changes
            nothing once pruned and normalised (no watch event then).

        Raises
        ------
        ApiError
            404 if absent, 400 on a name mismatch, 409 on a stale ``metadata.resourceVersion``,
            422 when adding finalizers to an object being deleted, 403 from ``admit``.

        """
        old = self._current(defn, namespace, name)
        if body.get("metadata", {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
        return self._commit(
            defn, old, copy.deepcopy(dict(body)), subresource, version, admit, warnings
        )

    def patch(
        self,
        defn: ResourceDef,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        version: str | None = None,
        admit: Admit | None = None,
        warnings: builtins.list[str] | None = None,
    ) -> Obj:
        """Patch an object (``PATCH``) by ``Content-Type``.

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            The namespace (``None`` for cluster-scoped resources).
        name : str
            ``metadata.name``.
        content_type : str
            ``application/merge-patch+json`` (RFC 7386), ``application/json-patch+json``
            (RFC 6902) or ``application/strategic-merge-patch+json`` (applied as a merge patch on
            built-in resources only).
        patch : Any
            The decoded patch document.
        subresource : str or None
            ``"status"`` for the status subresource, ``None`` for the main resource.
        version : str or None
            The requested API version (``apiVersion`` of the answer; its CRD schema prunes the
            patched object); preferred when ``None``.
        admit : Admit or None
            Admission check of the request's identity (see :data:`Admit`).
        warnings : list of str or None
            Receives one ``unknown field "<path>"`` per pruned field.

        Returns
        -------
        dict
            The stored object; unchanged, with the same resourceVersion, when the patch changes
            nothing once pruned and normalised (no watch event then).

        Raises
        ------
        ApiError
            415 for strategic merge on a custom resource or an unknown patch type, 422 when a
            JSON-patch ``test`` fails or an operation cannot apply, 409 on a stale
            ``metadata.resourceVersion`` in the patched object, 404 if absent, 403 from
            ``admit``.

        """
        old = self._current(defn, namespace, name)
        ctype = content_type.split(";")[0].strip().lower()
        if ctype == STRATEGIC_PATCH and not defn.custom:
            ctype = MERGE_PATCH
        if ctype == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(old, patch)
            if "resourceVersion" not in (patch.get("metadata") or {}):
                current = old["metadata"]["resourceVersion"]
                new.setdefault("metadata", {})["resourceVersion"] = current
        elif ctype == JSON_PATCH:
            try:
                new = jsonpatch.JsonPatch(patch).apply(old)
            except jsonpatch.JsonPatchTestFailed as e:
                raise ApiError(422, "Invalid", f"the server rejected our request: {e}") from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise ApiError(422, "Invalid", f"the server rejected our request: {e}") from None
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media"
                f" types include: {JSON_PATCH}, {MERGE_PATCH}",
            )
        return self._commit(defn, old, new, subresource, version, admit, warnings)

    def _prune(
        self,
        defn: ResourceDef,
        obj: Obj,
        version: str | None,
        warnings: builtins.list[str] | None,
        *,
        strict: bool = False,
    ) -> None:
        """Prune ``obj`` by the CRD schema of ``version`` (custom resources with a schema).

        Raises
        ------
        ApiError
            ``400 BadRequest`` when ``strict`` and a field is unknown, worded as the API
            server's strict decoding error.

        """
        schema = defn.schema(version) if defn.custom else None
        if schema is None:
            return
        dropped = prune(obj, schema)
        if strict and dropped:
            version = version or defn.preferred_version
            unknown = ", ".join(f'unknown field "{path}"' for path in dropped)
            raise ApiError(
                400,
                "BadRequest",
                f'{defn.kind} in version "{version}" cannot be handled as a {defn.kind}:'
                f" strict decoding error: {unknown}",
            )
        if warnings is not None:
            warnings.extend(f'unknown field "{path}"' for path in dropped)

    def _default(self, defn: ResourceDef, obj: Obj, version: str | None) -> None:
        """Fill in the ``default`` values of the CRD schema of ``version`` (custom resources)."""
        schema = defn.schema(version) if defn.custom and self._openapi else None
        if schema is not None:
            openapi.default(obj, schema)

    def _validate(
        self,
        defn: ResourceDef,
        new: Obj,
        old: Obj | None,
        version: str | None,
        warnings: builtins.list[str] | None,
    ) -> None:
        """Enforce the CRD schema of ``version`` (custom resources only): OpenAPI, then CEL.

        As the API server's custom resource strategies, on create and on update of the main
        resource and of ``/status`` alike, on the whole object as it would be stored: first
        the ``openAPIV3Schema`` (:func:`mock_kubernetes.openapi.validate`), then the CEL rules
        unless a wrong type, a missing required field, an unsupported value, a too long
        string or too many items blocks them (then a last ``<nil>: Invalid value: null: some
        validation rules were not checked ...`` says so). Failures on a value unchanged since
        ``old`` are not errors (validation ratcheting); CEL ones become warnings.

        Raises
        ------
        ApiError
            ``422 Invalid``: ``<Kind>.<group> "<name>" is invalid: <field>: <error>``
            (several as ``[..., ...]``), with ``details.causes`` (``field``, ``reason``,
            ``message``), e.g. ``spec.credentialsRef: Required value`` or ``spec: Invalid
            value: "object": <rule message>``.

        """
        if not self._openapi or not defn.custom:
            return
        version = version or defn.preferred_version
        schema = defn.schema(version)
        if schema is None:
            return
        errors = openapi.validate(new, schema, old)
        if openapi.blocks_cel(errors):
            errors.append(openapi.BLOCKED_CEL)
        elif self._crd_validation:
            validator = self._validators.get((defn.key, version))
            if validator is None:
                validator = self._validators[(defn.key, version)] = cel.Validator(schema)
            if validator.has_rules:
                failed, ratcheted = validator.validate(new, old)
                if warnings is not None:
                    warnings.extend(str(error) for error in ratcheted)
                errors += [openapi.FieldError(e.field, e.reason, e.body) for e in failed]
        if not errors:
            return
        name = str(new["metadata"].get("name") or "")
        qualified = f"{defn.kind}.{defn.group}" if defn.group else defn.kind
        text = ", ".join(str(error) for error in errors)
        if len(errors) > 1:
            text = f"[{text}]"
        raise ApiError(
            422,
            "Invalid",
            f'{qualified} "{name}" is invalid: {text}',
            details={
                "name": name,
                "group": defn.group,
                "kind": defn.kind,
                "causes": [
                    {"reason": e.reason, "message": e.body, "field": e.field or "<nil>"}
                    for e in errors
                ],
            },
        )

    def _commit(
        self,
        defn: ResourceDef,
        old: Obj,
        new: Obj,
        subresource: str | None,
        version: str | None,
        admit: Admit | None = None,
        warnings: builtins.list[str] | None = None,
    ) -> Obj:
        # Decoding the request prunes it, before anything is compared (a write of unknown
        # fields only is a no-op).
        self._prune(defn, new, version, warnings)
        old_meta = old["metadata"]
        new_meta = new.get("metadata") or {}
        rv = new_meta.get("resourceVersion")
        if rv and rv != old_meta["resourceVersion"]:
            group = f".{defn.group}" if defn.group else ""
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {defn.plural}{group}"
                f' "{old_meta["name"]}": the object has been modified; please apply'
                " your changes to the latest version and try again",
            )
        if subresource == "status" and defn.status_subresource:
            status = new.get("status")
            new = copy.deepcopy(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif subresource is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        else:
            if defn.status_subresource:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            meta = dict(new_meta)
            for field in (
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            new["metadata"] = meta
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
                if added:
                    raise ApiError(
                        422,
                        "Forbidden",
                        "no new finalizers can be added if the object"
                        f" is being deleted, found new finalizers {sorted(added)}",
                    )
            if not meta.get("finalizers"):
                meta.pop("finalizers", None)
            if defn.key == _NAMESPACES:
                # spec.finalizers of a Namespace change only through /finalize (namespace
                # strategy PrepareForUpdate), i.e. by the namespace controller here.
                kept = (old.get("spec") or {}).get("finalizers")
                spec = dict(new["spec"]) if isinstance(new.get("spec"), dict) else {}
                spec.pop("finalizers", None)
                if kept is not None:
                    spec["finalizers"] = copy.deepcopy(kept)
                if spec or "spec" in old:
                    new["spec"] = spec
                else:
                    new.pop("spec", None)
        new["apiVersion"] = old["apiVersion"]
        new["kind"] = old["kind"]
        self._default(defn, new, version)
        _normalize(defn, new)
        self._validate(defn, new, old, version, warnings)
        if admit is not None:
            admit(defn, "UPDATE", new, old)
        if new == old:  # a no-op write changes nothing, not even resourceVersion
            return self._render(defn, old, version)
        if defn.custom and (
            _spec_part(new, not defn.status_subresource)
            != _spec_part(old, not defn.status_subresource)
        ):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        return self._store(defn, old, new, version)

    def _store(self, defn: ResourceDef, old: Obj, new: Obj, version: str | None) -> Obj:
        meta = new["metadata"]
        meta["resourceVersion"] = self._next_rv()
        key = (meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not _held(defn, new):
            return self._remove(defn, key, new, old, version)
        self._objects[defn.key][key] = new
        self._index_owners(defn.key, key, old, new)
        self._emit(
            defn,
            WatchEvent(
                int(meta["resourceVersion"]), "MODIFIED", copy.deepcopy(new), copy.deepcopy(old)
            ),
        )
        return self._render(defn, new, version)

    def _remove(
        self, defn: ResourceDef, key: _ObjKey, last: Obj, old: Obj | None, version: str | None
    ) -> Obj:
        gone = self._objects[defn.key].pop(key, None)
        self._index_owners(defn.key, key, gone, None)
        uid = last["metadata"]["uid"]
        self._uids.pop(uid, None)
        self._emit(
            defn,
            WatchEvent(
                int(last["metadata"]["resourceVersion"]),
                "DELETED",
                copy.deepcopy(last),
                copy.deepcopy(old),
            ),
        )
        if self._gc:
            self._collect_dependents(uid)
        namespace = key[0]
        if namespace is not None and namespace not in self._bulk_deleting:
            self._sync_namespace(namespace)
        return self._render(defn, last, version)

    def delete(
        self,
        defn: ResourceDef,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        version: str | None = None,
    ) -> Obj:
        """Delete an object (``DELETE``).

        With finalizers the object gets ``deletionTimestamp`` (and a generation bump) and stays
        until its last finalizer is removed; without, it is removed at once.

        A Namespace (with ``namespace_lifecycle``) gets ``deletionTimestamp`` and
        ``status.phase: Terminating``; then the namespace controller deletes every object in
        it, of all resources at once in a random order (Secrets too): those without
        finalizers go at once, the others get ``deletionTimestamp`` and stay until their
        finalizers are removed. The Namespace is removed as soon as nothing is left in it
        (checked again after each removal); until then its ``NamespaceContentRemaining`` and
        ``NamespaceFinalizersRemaining`` conditions say what is left, as on a real cluster.

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            The namespace (``None`` for cluster-scoped resources).
        name : str
            ``metadata.name``.
        version : str or None
            The requested API version (``apiVersion`` of the answer); preferred when ``None``.
        options : mapping or None
            ``DeleteOptions``; ``preconditions.resourceVersion`` and ``preconditions.uid`` are
            checked.

        Returns
        -------
        dict
            The object as marked for deletion, or its last state.

        Raises
        ------
        ApiError
            404 if absent, 409 if a precondition fails, 403 for the namespaces ``default``,
            ``kube-system`` and ``kube-public``.

        """
        old = self._current(defn, namespace, name)
        meta = old["metadata"]
        _check_preconditions(meta, options)
        if meta.get("deletionTimestamp"):
            return self._render(defn, old, version)
        new = copy.deepcopy(old)
        if defn.key == _NAMESPACES and self._ns_lifecycle:
            return self._delete_namespace(defn, old, new, version)
        if meta.get("finalizers"):
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if "generation" in meta:
                new["metadata"]["generation"] = meta["generation"] + 1
            return self._store(defn, old, new, version)
        new["metadata"]["resourceVersion"] = self._next_rv()
        return self._remove(defn, (meta.get("namespace"), meta["name"]), new, old, version)

    def read_for_delete(
        self,
        defn: ResourceDef,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
    ) -> Obj | None:
        """Read an object as a DELETE does, and tell whether it would be removed at once.

        The first half of a DELETE in flight (`mock_kubernetes.inflight`): kube-apiserver's
        ``Store.Delete`` decides from this read; `commit_delete` is the second half.

        Returns
        -------
        dict or None
            The object as read, when it has no finalizers, is not being deleted and is not a
            Namespace (it would go at once); None when `delete` must decide (it stays, marked).

        Raises
        ------
        ApiError
            404 if absent, 409 if a precondition fails.
        """
        old = self._current(defn, namespace, name)
        meta = old["metadata"]
        _check_preconditions(meta, options)
        if meta.get("finalizers") or meta.get("deletionTimestamp") or defn.key == _NAMESPACES:
            return None
        return copy.deepcopy(old)

    def commit_delete(
        self,
        defn: ResourceDef,
        read: Obj,
        options: Mapping[str, Any] | None = None,
    ) -> Obj:
        """Remove the object a DELETE read (`read_for_delete`) without finalizers, as it is now.

        As etcd3's ``conditionalDelete``: the preconditions are checked again against the
        object stored now, the decision is not: finalizers added since the read (a PATCH
        answered 200 meanwhile) go with the object (real-cluster.md 13e).

        Returns
        -------
        dict
            A ``Status`` ``Success`` naming the object (kube-apiserver's answer to a custom
            resource deleted at once: ``finalizeDelete`` without ``ReturnDeletedObject``).

        Raises
        ------
        ApiError
            404 if the object read is gone (or another of its name is stored now), 409 if a
            precondition fails now.
        """
        meta = read["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        old = self._current(defn, namespace, name)
        if old["metadata"].get("uid") != meta.get("uid"):
            group = f".{defn.group}" if defn.group else ""
            raise ApiError(404, "NotFound", f'{defn.plural}{group} "{name}" not found')
        _check_preconditions(old["metadata"], options)
        last = copy.deepcopy(old)
        last["metadata"]["resourceVersion"] = self._next_rv()
        self._remove(defn, (namespace, name), last, old, None)
        group = defn.group
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                **({"group": group} if group else {}),
                "kind": defn.plural,
                "uid": meta.get("uid"),
            },
        }

    # -- namespaces -----------------------------------------------------------------------------

    def _check_namespace_accepts(self, defn: ResourceDef, namespace: str, name: str) -> None:
        """Refuse a create as the NamespaceLifecycle admission plugin does.

        Source: https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go;
        the messages are
        ``errors.NewNotFound`` and ``admission.NewForbidden`` of ``k8s.io/apimachinery``.
        """
        if not self._ns_lifecycle or _NAMESPACES not in self._defs:
            return
        ns = self._objects[_NAMESPACES].get((None, namespace))
        if ns is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
        if ns["metadata"].get("deletionTimestamp"):
            resource = f"{defn.plural}.{defn.group}" if defn.group else defn.plural
            subject = f'{resource} "{name}"' if name else resource
            raise ApiError(
                403,
                "Forbidden",
                f"{subject} is forbidden: unable to create new content in namespace"
                f" {namespace} because it is being terminated",
            )

    def _delete_namespace(self, defn: ResourceDef, old: Obj, new: Obj, version: str | None) -> Obj:
        name = old["metadata"]["name"]
        if name in IMMORTAL_NAMESPACES:
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
            )
        new["metadata"]["deletionTimestamp"] = _now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        answer = self._store(defn, old, new, version)
        self._delete_namespace_content(name)
        return answer

    def _namespace_content(self, namespace: str) -> builtins.list[tuple[ResourceDef, Obj]]:
        return [
            (self._defs[key], obj)
            for key, objects in self._objects.items()
            if self._defs[key].namespaced
            for (ns, _), obj in objects.items()
            if ns == namespace
        ]

    def _delete_namespace_content(self, namespace: str) -> None:
        """Delete everything in a terminating namespace (the namespace controller's job)."""
        content = self._namespace_content(namespace)
        random.shuffle(content)  # no order a controller can rely on
        self._bulk_deleting.add(namespace)
        try:
            for defn, obj in content:
                meta = obj["metadata"]
                if (namespace, meta["name"]) in self._objects[defn.key]:  # not collected yet
                    self.delete(defn, namespace, meta["name"])
        finally:
            self._bulk_deleting.discard(namespace)
        self._sync_namespace(namespace)

    def _sync_namespace(self, namespace: str) -> None:
        """Remove a terminating namespace once empty, else report what is left in it.

        Source: https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/namespace/deletion/namespaced_resources_deleter.go
        (conditions ``NamespaceContentRemaining`` and ``NamespaceFinalizersRemaining``).
        """
        defn = self._defs.get(_NAMESPACES)
        if defn is None or not self._ns_lifecycle:
            return
        old = self._objects[_NAMESPACES].get((None, namespace))
        if old is None or not old["metadata"].get("deletionTimestamp"):
            return
        new = copy.deepcopy(old)
        content = self._namespace_content(namespace)
        if not content:
            spec = new.setdefault("spec", {})
            spec["finalizers"] = [
                f for f in spec.get("finalizers") or [] if f != _NAMESPACE_FINALIZER
            ]
            if not spec["finalizers"]:
                del spec["finalizers"]
        counts: dict[str, int] = {}
        finalizers: dict[str, int] = {}
        for content_defn, obj in content:
            resource = content_defn.plural + (
                f".{content_defn.group}" if content_defn.group else ""
            )
            counts[resource] = counts.get(resource, 0) + 1
            for finalizer in obj["metadata"].get("finalizers") or []:
                finalizers[finalizer] = finalizers.get(finalizer, 0) + 1
        status = new.setdefault("status", {})
        status["conditions"] = _merge_conditions(
            status.get("conditions") or [],
            [
                _condition(
                    "NamespaceContentRemaining",
                    bool(counts),
                    "SomeResourcesRemain" if counts else "ContentRemoved",
                    "Some resources are remaining: "
                    + ", ".join(
                        f"{r} has {n} resource instances" for r, n in sorted(counts.items())
                    )
                    if counts
                    else "All content successfully removed",
                ),
                _condition(
                    "NamespaceFinalizersRemaining",
                    bool(finalizers),
                    "SomeFinalizersRemain" if finalizers else "ContentHasNoFinalizers",
                    "Some content in the namespace has finalizers remaining: "
                    + ", ".join(
                        f"{f} in {n} resource instances" for f, n in sorted(finalizers.items())
                    )
                    if finalizers
                    else "All content-preserving finalizers finished",
                ),
            ],
        )
        if new != old:
            self._store(defn, old, new, None)

    def _index_owners(self, key: _Key, obj_key: _ObjKey, old: Obj | None, new: Obj | None) -> None:
        """Keep `_dependents` in step with one object's ``ownerReferences`` (old -> new)."""

        def owners(obj: Obj | None) -> set[str]:
            refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
            return {str(ref.get("uid")) for ref in refs if ref.get("uid")}

        before, after = owners(old), owners(new)
        entry = (key, obj_key)
        for uid in before - after:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard(entry)
                if not dependents:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(entry)

    def _collect_dependents(self, owner_uid: str) -> None:
        """Collect the dependents of an owner gone (background propagation, simplified).

        A dependent whose every owner is gone is deleted (with finalizers it is marked and
        stays). One that still has an owner is not: the garbage collector patches its
        ``ownerReferences`` to drop the owners gone and leaves it live (kube-controller-manager's
        ``garbagecollector.go`` ``attemptToDeleteItem``: "remove dangling references" with a
        JSON merge patch on a custom resource; real-cluster.md 13f).
        """
        for key, obj_key in list(self._dependents.get(owner_uid, ())):
            obj = self._objects[key].get(obj_key)
            if obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            if owner_uid not in {ref.get("uid") for ref in refs}:
                continue
            kept = [ref for ref in refs if ref.get("uid") in self._uids]
            meta = obj["metadata"]
            if not kept:
                self.delete(self._defs[key], meta.get("namespace"), meta["name"])
                continue
            new = copy.deepcopy(obj)
            new["metadata"]["ownerReferences"] = copy.deepcopy(kept)
            self._store(self._defs[key], obj, new, None)

    # -- watches --------------------------------------------------------------------------------

    def watch(
        self,
        defn: ResourceDef,
        namespace: str | None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout: float | None = None,
        version: str | None = None,
        bookmark: float | None = None,
    ) -> AsyncIterator[Obj]:
        """Stream watch events (``{"type": ..., "object": ...}``) until closed or timed out.

        A watch without ``resource_version`` (or with ``"0"``) first sends every current object
        as ``ADDED``; a watch from a resourceVersion replays the newer events of the history.
        The subscription is taken in the same step as the snapshot, so no event is lost.

        Parameters
        ----------
        defn : ResourceDef
            The resource (from :meth:`resolve`).
        namespace : str or None
            Watch one namespace, or all when ``None``.
        resource_version : str or None
            The ``resourceVersion`` query parameter.
        label_selector, field_selector : str or None
            Query parameters ``labelSelector`` and ``fieldSelector``.
        timeout : float or None
            ``timeoutSeconds``: end the stream after so many seconds.
        version : str or None
            The requested API version (``apiVersion`` of the answer); preferred when ``None``.
        bookmark : float or None
            Seconds without an event after which a ``BOOKMARK`` event is sent (its object
            carries only ``kind``, ``apiVersion`` and ``metadata.resourceVersion``: every
            event up to it was sent), as a real API server does about once a minute for a
            watch asked with ``allowWatchBookmarks``
            (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks);
            ``None``: never.

        Returns
        -------
        AsyncIterator of dict
            Watch events; an expired resourceVersion yields one ``ERROR`` event (410 Expired).

        Raises
        ------
        ApiError
            400 on an unparseable selector or resourceVersion.

        """
        namespace = self._check_ns(defn, namespace)
        labels, fields = self._selectors(label_selector, field_selector)
        watcher = _Watcher(namespace, labels, fields, asyncio.Queue())
        initial: builtins.list[Obj] = []
        if resource_version in (None, "", "0"):
            for obj in self._objects[defn.key].values():
                if watcher.selects(obj):
                    initial.append({"type": "ADDED", "object": self._render(defn, obj, version)})
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise ApiError(
                    400, "BadRequest", f"invalid resourceVersion {resource_version!r}"
                ) from None
            if since < self._expired_rv.get(defn.key, 0):
                initial.append(
                    {
                        "type": "ERROR",
                        "object": ApiError(
                            410, "Expired", f"too old resource version: {since}"
                        ).to_status(),
                    }
                )
            else:
                for event in self._history[defn.key]:
                    translated = watcher.translate(event) if event.rv > since else None
                    if translated is not None:
                        initial.append(
                            {
                                "type": translated.type,
                                "object": self._render(defn, translated.obj, version),
                            }
                        )
        if not self._closed and not any(e["type"] == "ERROR" for e in initial):
            self._watchers[defn.key].add(watcher)
        return self._stream(defn, watcher, initial, timeout, version, bookmark)

    async def _stream(
        self,
        defn: ResourceDef,
        watcher: _Watcher,
        initial: builtins.list[Obj],
        timeout: float | None,
        version: str | None,
        bookmark: float | None = None,
    ) -> AsyncIterator[Obj]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            for item in initial:
                yield item
            if watcher not in self._watchers[defn.key]:
                return
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                marks = bookmark is not None and (remaining is None or bookmark < remaining)
                wait = bookmark if marks else remaining
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if not marks:
                        return
                    yield self._bookmark(defn, version)
                    continue
                if event is None:
                    return
                yield {"type": event.type, "object": self._render(defn, event.obj, version)}
        finally:
            self._watchers[defn.key].discard(watcher)

    def _bookmark(self, defn: ResourceDef, version: str | None) -> Obj:
        """Return a ``BOOKMARK`` at the current resourceVersion (the watcher's queue is empty)."""
        return {
            "type": "BOOKMARK",
            "object": {
                "apiVersion": defn.api_version(version or defn.preferred_version),
                "kind": defn.kind,
                "metadata": {"resourceVersion": str(self.resource_version)},
            },
        }

    def drop_watches(self) -> int:
        """End every open watch stream, as an API server going down does; return how many.

        New watches are still accepted (unlike `close`): clients that reconnect resume from
        their last resourceVersion (replayed from the history, or 410 Gone after
        `expire_history`).
        """
        dropped = 0
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                watcher.queue.put_nowait(None)
                dropped += 1
            watchers.clear()
        return dropped

    def expire_history(self) -> None:
        """Forget every resource's watch history, as a restarted API server's empty watch cache.

        A watch resumed from any resourceVersion older than the current one then answers one
        ``ERROR`` event with code 410 (``Expired``), and the client must list again
        (kube-apiserver: "too old resource version", ``staging/src/k8s.io/apiserver/pkg/storage/
        cacher``). Watches from the current resourceVersion or without one are served.
        """
        for key, history in self._history.items():
            history.clear()
            self._expired_rv[key] = self._rv

    def close(self) -> None:
        """End every open watch stream (for a fast server shutdown)."""
        self._closed = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)
