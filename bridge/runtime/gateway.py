"""The Kubernetes gateway (`Kube`): typed operations on any resource named by `Resource`.

Get, list, watch, create, merge-patch, set a finalizer, delete and post Events, with custom
objects as plain JSON (`bridge.runtime.rest`). Reads answer None for "not found"; writes
answer a `Write`; every other API failure propagates as ``kubernetes.client.ApiException``.
The names of `bridge.runtime.client` and `bridge.runtime.rest` that callers import from
here are re-exported.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from kubernetes.client import (
    ApiClient,
    ApiException,
    ApisApi,
    CoreV1Api,
    CoreV1Event,
    CustomObjectsApi,
    V1EventSource,
    V1ObjectMeta,
    V1ObjectReference,
)

from bridge.runtime.client import WRITE_METHODS, OperatorApiClient, api_client
from bridge.runtime.rest import MERGE_PATCH, Collection, JsonObjects, WatchStream

__all__ = [
    "MERGE_PATCH",
    "PAGE_SIZE",
    "WRITE_METHODS",
    "AccessDeniedError",
    "Collection",
    "JsonObjects",
    "Kube",
    "NotServedError",
    "OperatorApiClient",
    "Outcome",
    "Resource",
    "WatchStream",
    "Write",
    "access_denied",
    "api_client",
    "api_status_message",
]

log = logging.getLogger(__name__)


#: Objects asked for per page of a list (client-go's pager: ``tools/pager``, 500).
PAGE_SIZE = 500


class Outcome(Enum):
    """What a write at the Kubernetes boundary did (`Write.outcome`)."""

    #: The API server stored the write (`Write.obj` is the object as stored, when returned).
    WRITTEN = "written"
    #: Nothing had to change: no request was sent.
    UNCHANGED = "unchanged"
    #: The object does not exist (404 Not Found).
    GONE = "gone"
    #: 409 Conflict: a stale resourceVersion, or (a create) the name exists already.
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Write:
    """The typed outcome of one write: `Outcome` and, where there is one, the object.

    ``obj`` is the object as the API server returned it for `Outcome.WRITTEN`; for a create
    answering `Outcome.CONFLICT`, the object that exists under that name (read right after
    the 409; None when it was deleted meanwhile); else None.
    """

    outcome: Outcome
    obj: dict[str, Any] | None = None

    @property
    def written(self) -> bool:
        """True when the API server stored the write."""
        return self.outcome is Outcome.WRITTEN


UNCHANGED = Write(Outcome.UNCHANGED)
GONE = Write(Outcome.GONE)
CONFLICT = Write(Outcome.CONFLICT)


class NotServedError(RuntimeError):
    """The API server does not serve a resource the operator needs (e.g. no CAPI CRDs)."""


class AccessDeniedError(RuntimeError):
    """The API server refused a request: 401 Unauthorized or 403 Forbidden.

    ``str()`` of it is the API server's own message, e.g. ``ipaddressclaims.ipam.cluster.
    x-k8s.io is forbidden: User "system:serviceaccount:capi:ipam" cannot list resource
    ...``; made by `access_denied`.

    Parameters
    ----------
    status:
        The HTTP status (401 or 403).
    message:
        The message of the API server's ``Status`` body (see `api_status_message`).

    Attributes
    ----------
    status, message:
        As given.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def api_status_message(exc: ApiException) -> str:
    """Return the API server's message of a failed request.

    The API server answers a failed request with a ``Status`` object
    (``{"kind": "Status", "status": "Failure", "message": ..., "reason": ..., "code": ...}``,
    https://kubernetes.io/docs/reference/using-api/api-concepts/); its ``message`` is what
    a person should read.

    Parameters
    ----------
    exc:
        The kubernetes client's error.

    Returns
    -------
    str
        The ``Status`` body's ``message``; when the body is not such a JSON object, the
        body's text, else ``"<status> <reason>"``.
    """
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if body:
        try:
            status = json.loads(body)
        except ValueError:
            status = None
        if isinstance(status, Mapping) and status.get("message"):
            return str(status["message"])
        if status is None and str(body).strip():
            return str(body).strip()
    return f"{exc.status} {exc.reason}".strip()


def access_denied(exc: ApiException) -> AccessDeniedError | None:
    """Return the `AccessDeniedError` of a 401 or 403 answer, or None for any other error.

    Meant for the start-up handler: a refused discovery or list is fixed by a person (RBAC,
    credentials), not by retrying, so it stops the operator with the API server's message::

        except ApiException as exc:
            if (denied := access_denied(exc)) is not None:
                raise kopf.PermanentError(str(denied)) from exc
            raise

    Parameters
    ----------
    exc:
        The kubernetes client's error.

    Returns
    -------
    AccessDeniedError or None
        With the status and `api_status_message`; None when the status is not 401/403.
    """
    if exc.status in (401, 403):
        return AccessDeniedError(int(exc.status), api_status_message(exc))
    return None


def _missing(exc: ApiException) -> bool:
    return bool(exc.status == 404)


@dataclass(frozen=True)
class Resource:
    """A resource of the Kubernetes API: where its objects live.

    Attributes
    ----------
    group:
        The API group (``""`` for the core group).
    version:
        The version to read and write in (``v1``, ``v1beta2``...).
    plural:
        The resource's plural name in the URL (``ipaddressclaims``...).
    kind:
        The objects' kind; a list's items that lack ``kind`` and ``apiVersion`` get them.
        Empty: items are returned as listed.
    namespaced:
        False for a cluster-scoped resource (its objects have no namespace; a namespace
        given with one is ignored).
    """

    group: str
    version: str
    plural: str
    kind: str = ""
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """``group/version`` (``version`` alone for the core group)."""
        return f"{self.group}/{self.version}" if self.group else self.version


def _items(r: Resource, page: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return a list page's items, with ``kind`` and ``apiVersion`` when `Resource.kind` is set."""
    items = [dict(item) for item in page.get("items") or []]
    if r.kind:
        for item in items:
            item.setdefault("kind", r.kind)
            item.setdefault("apiVersion", r.api_version)
    return items


def _where(r: Resource, namespace: str | None) -> tuple[str, str, str, str | None]:
    """Return where `JsonObjects` finds ``r``'s objects (a namespace only if namespaced)."""
    return r.group, r.version, r.plural, (namespace or None) if r.namespaced else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class Kube:
    """The Kubernetes gateway: get, list, create, patch and delete objects of any resource.

    Knows no resource of its own: callers say which (`Resource`). "Not found" is a value
    (None for reads, `Outcome.GONE` for writes); a write answers a `Write`. Every other API
    failure propagates as ``kubernetes.client.ApiException``. Calls are synchronous (the
    work queue's worker threads make them) and thread-safe.

    Parameters
    ----------
    client:
        An ``ApiClient`` (see `api_client`); shared by every worker thread.
    """

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.core = CoreV1Api(client)
        self.custom = JsonObjects(client)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    # -- discovery ------------------------------------------------------------------

    def preferred_version(self, group: str, plural: str, supported: tuple[str, ...]) -> str:
        """Return the version of ``group/plural`` to use.

        The server's preferred version if we support it, else the first of ``supported``
        that serves ``plural`` (API discovery: ``/apis`` and ``/apis/<group>/<version>``,
        https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api).

        Raises
        ------
        NotServedError
            When the group or resource is not served in any supported version.
        """
        groups = ApisApi(self.client).get_api_versions().groups or []
        found = next((g for g in groups if g.name == group), None)
        if found is None:
            raise NotServedError(f"API group {group} is not served (are CAPI's CRDs installed?)")
        served = [v.version for v in found.versions or []]
        preferred = found.preferred_version.version if found.preferred_version else None
        candidates = ([preferred] if preferred in supported else []) + [
            v for v in supported if v in served and v != preferred
        ]
        for version in candidates:
            found_resources = CustomObjectsApi(self.client).get_api_resources(group, version)
            resources = found_resources.resources or []
            if any(r.name == plural for r in resources):
                return str(version)
        raise NotServedError(
            f"{plural}.{group} is not served in any of the versions {', '.join(supported)}"
        )

    # -- reads ----------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """Return one object, or None when it (or its resource) is not found.

        ``namespace`` is ignored for a cluster-scoped resource.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404.
        """
        try:
            found = self.custom.get(*_where(resource, namespace), name)
        except ApiException as exc:
            if _missing(exc):
                return None
            raise
        return cast(dict[str, Any], found)

    def list(
        self,
        resource: Resource,
        namespaces: Sequence[str | None] = (),
        *,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Return the objects of ``resource`` in ``namespaces`` (empty, or None: all).

        A cluster-scoped resource is listed whole, whatever ``namespaces``. Items lacking
        ``kind`` and ``apiVersion`` get the resource's (when `Resource.kind` is set). The
        list is read in pages (`list_collection`); ``limit`` instead asks the API server for
        one page of at most that many per namespace (a probe).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure (404 when the resource is not served).
        """
        r = resource
        wanted: list[str | None] = [ns for ns in namespaces if ns] if r.namespaced else []
        scopes = wanted or [None]
        if limit:
            pages = [self._page(r, ns, limit, None) for ns in scopes]
            return [item for page in pages for item in _items(r, page)]
        return [item for ns in scopes for item in self.list_collection(r, ns).items]

    def list_collection(
        self, resource: Resource, namespace: str | None, *, page_size: int = PAGE_SIZE
    ) -> Collection:
        """Return the objects of ``resource`` in ``namespace`` (None: all) and the list's version.

        Read in pages of ``page_size`` (``limit`` and ``continue``, as client-go's pager,
        https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks);
        the list's ``metadata.resourceVersion`` (the first page's) is where a watch of the
        same objects starts (`watch`), so that it tells every change after the list and none
        before. When a continue token has expired (410: the API server compacted past the
        list's resourceVersion) the list is read again whole, in one request, as client-go's
        ``ListPager`` does with ``FullListIfExpired``.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure.
        """
        r = resource
        items: list[dict[str, Any]] = []
        version, token = "", None
        while True:
            try:
                page = self._page(r, namespace, page_size, token)
            except ApiException as exc:
                if exc.status != 410 or token is None:
                    raise
                log.info("list of %s: the continue token expired (410): listing whole", r.plural)
                page = self._page(r, namespace, None, None)
                return Collection(_items(r, page), str(_meta(page).get("resourceVersion") or ""))
            items.extend(_items(r, page))
            meta = _meta(page)
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if token is None:
                return Collection(items, version)

    def _page(
        self, r: Resource, namespace: str | None, limit: int | None, token: str | None
    ) -> dict[str, Any]:
        """Return one page of a list (``limit`` None: the whole list)."""
        return cast(dict[str, Any], self.custom.list(*_where(r, namespace), limit, token))

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        *,
        timeout_seconds: int,
        read_timeout: float,
    ) -> WatchStream:
        """Watch ``resource`` in ``namespace`` (None: all) from ``resource_version``.

        See `JsonObjects.watch` (parameters, errors).
        """
        return self.custom.watch(
            *_where(resource, namespace),
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            read_timeout=read_timeout,
        )

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """Return a Secret's data decoded to text (``data`` and ``stringData``), or None."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if _missing(exc):
                return None
            raise
        data: dict[str, str] = {}
        for key, value in (secret.data or {}).items():
            data[key] = base64.b64decode(value).decode("utf-8", errors="replace")
        for key, value in (getattr(secret, "string_data", None) or {}).items():
            data[key] = value
        return data

    # -- writes ---------------------------------------------------------------------

    def create(self, resource: Resource, body: Mapping[str, Any]) -> Write:
        """Create a namespaced object.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the stored object, or `Outcome.CONFLICT` (no object) on
            409 AlreadyExists.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 409 (e.g. 403 in a terminating namespace).
        """
        r = resource
        namespace = body["metadata"]["namespace"]
        try:
            created = self.custom.create(r.group, r.version, r.plural, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return CONFLICT
            raise
        return Write(Outcome.WRITTEN, cast(dict[str, Any], created))

    def patch(
        self, resource: Resource, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Write:
        """Merge-patch (RFC 7386) an object.

        Custom resources take no strategic merge: lists in ``patch`` replace the stored
        ones whole. A ``metadata.resourceVersion`` in ``patch`` makes the API server answer
        409 Conflict when the object changed since
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts).

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the object as stored, `Outcome.GONE` (404), or
            `Outcome.CONFLICT` (409: a stale resourceVersion).

        Raises
        ------
        kubernetes.client.ApiException
            422 when the schema refuses the result; any other failure but 404 and 409.
        """
        try:
            return Write(Outcome.WRITTEN, self._merge_patch(resource, namespace, name, patch))
        except ApiException as exc:
            if _missing(exc):
                return GONE
            if exc.status == 409:
                return CONFLICT
            raise

    def patch_status(
        self, resource: Resource, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Write:
        """Merge-patch an object's status subresource (``patch`` holds ``status``).

        What the served schema does not know is pruned by the API server: the returned
        object shows what was kept. A ``metadata.resourceVersion`` in ``patch`` guards the
        write (409 when the object changed since).

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the object as stored, or `Outcome.GONE` (404).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404.
        """
        try:
            stored = self._merge_patch(resource, namespace, name, patch, status=True)
        except ApiException as exc:
            if _missing(exc):
                return GONE
            raise
        return Write(Outcome.WRITTEN, stored)

    def _merge_patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """Merge-patch an object (``status``: its status subresource); errors propagate."""
        where = _where(resource, namespace)
        return cast(dict[str, Any], self.custom.patch(*where, name, patch, status=status))

    def set_finalizer(
        self, resource: Resource, obj: Mapping[str, Any], finalizer: str, present: bool
    ) -> Write:
        """Add or remove one finalizer of ``obj`` with a merge patch guarded by resourceVersion.

        Only ``finalizer`` changes: the others are written back as they were read, and a
        concurrent change of the object makes the API answer 409 (the caller reads again
        and retries). Nothing is written when the finalizer is already as asked.

        Parameters
        ----------
        obj:
            The object as last read (``metadata.name``, ``namespace``, ``finalizers``,
            ``resourceVersion``).

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the object as stored; `Outcome.UNCHANGED` when nothing
            had to change (no request); `Outcome.GONE` on 404; `Outcome.CONFLICT` on 409.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        meta = _meta(obj)
        return _finalizer_patch(
            meta,
            finalizer,
            present,
            lambda patch: self._merge_patch(
                resource, str(meta.get("namespace") or ""), meta["name"], patch
            ),
        )

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        *,
        finalizer: str | None = None,
        current: Mapping[str, Any] | None = None,
    ) -> Write:
        """Delete a namespaced object, removing ``finalizer`` from it first (when it has it).

        The finalizer list is written with the object's resourceVersion, so a concurrent
        change makes the API answer 409. A missing object is success.

        Parameters
        ----------
        finalizer:
            The finalizer of ours that protects the object (None: none).
        current:
            The object as last seen (``metadata.finalizers`` and ``resourceVersion``, e.g.
            from a cache): no read is sent. When it is stale (409 Conflict), or not given,
            the object is read once and the write tried again with what was read. The
            DELETE carries ``preconditions.uid`` (the uid as seen or read); when ``current``
            has a uid and the object read has another, the object seen is gone (`GONE`).

        Returns
        -------
        Write
            `Outcome.WRITTEN` when this call deleted it (``obj``: the object as the removal
            of ``finalizer`` stored it, None when no finalizer had to go); `Outcome.GONE`
            when it did not exist (any more); `Outcome.CONFLICT` when a 409 persists after
            that one read.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        if current is not None:
            deleted = self._delete(resource, namespace, name, finalizer, current)
            if deleted.outcome is not Outcome.CONFLICT:
                return deleted
        uid = _meta(current).get("uid") if current is not None else None
        current = self.get(resource, namespace, name)
        if current is None or (uid and _meta(current).get("uid") != uid):
            return GONE  # the object seen is gone: another of its name is not ours to delete
        return self._delete(resource, namespace, name, finalizer, current)

    def _delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        finalizer: str | None,
        current: Mapping[str, Any],
    ) -> Write:
        """Remove ``finalizer`` (guarded by resourceVersion), then delete (guarded by uid)."""
        r, meta = resource, _meta(current)
        removed = UNCHANGED
        if finalizer is not None:
            removed = _finalizer_patch(
                meta,
                finalizer,
                False,
                lambda patch: self._merge_patch(r, namespace, name, patch),
            )
            if removed.outcome in (Outcome.GONE, Outcome.CONFLICT):
                return removed
        try:
            self.custom.delete(
                r.group, r.version, r.plural, namespace, name, str(meta.get("uid") or "")
            )
        except ApiException as exc:
            if _missing(exc):
                return GONE
            if exc.status == 409:
                return CONFLICT
            raise
        return Write(Outcome.WRITTEN, removed.obj)

    def set_secret_finalizer(
        self, namespace: str, name: str, finalizer: str, present: bool
    ) -> Write:
        """Add or remove ``finalizer`` on a Secret with a merge patch guarded by resourceVersion.

        Reads the Secret's metadata first (the write carries its resourceVersion); a Secret
        that is being deleted can lose a finalizer but not get one (the API refuses).

        Returns
        -------
        Write
            `Outcome.WRITTEN` (``obj`` None); `Outcome.UNCHANGED` when nothing had to change
            or a Secret being deleted would need a new finalizer (no write); `Outcome.GONE`
            when the Secret does not exist; `Outcome.CONFLICT` on 409 (the Secret changed
            between the read and the write: the caller reads again and retries).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if _missing(exc):
                return GONE
            raise
        meta = secret.metadata
        if meta is None:
            return UNCHANGED
        if (
            present
            and meta.deletion_timestamp is not None
            and finalizer not in (meta.finalizers or [])
        ):
            return UNCHANGED
        seen = {"finalizers": list(meta.finalizers or []), "resourceVersion": meta.resource_version}
        return _finalizer_patch(
            seen,
            finalizer,
            present,
            # A merge patch (RFC 7386) replaces the list; the client's default for built-in
            # kinds is a strategic merge patch, which merges ObjectMeta.finalizers
            # (patchStrategy "merge") and so could never remove one.
            lambda patch: self.core.patch_namespaced_secret(
                name, namespace, patch, _content_type="application/merge-patch+json"
            ),
        )

    # -- events ---------------------------------------------------------------------

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create the ``core/v1`` Event ``event`` (JSON, its name set) in ``namespace``.

        Raises
        ------
        kubernetes.client.ApiException
            When the API refuses it (409: the name exists).
        """
        self.core.create_namespaced_event(namespace, CoreV1Event.model_validate(event))

    def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Patch the Event ``name`` (``count``, ``lastTimestamp``, ``message``).

        Sent as the client sends a PATCH of a mapping (a strategic merge patch, which for
        these scalar fields is a JSON merge patch).

        Raises
        ------
        kubernetes.client.ApiException
            When the API refuses it (404: the Event is gone).
        """
        self.core.patch_namespaced_event(name, namespace, dict(patch))

    def post_event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Create a core/v1 Event about ``obj``.

        Events about a cluster-scoped object live in ``default``, as client-go's recorder
        puts them (https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/).

        Raises
        ------
        kubernetes.client.ApiException
            When the API refuses the Event.
        """
        meta = _meta(obj)
        namespace = str(meta.get("namespace") or "default")
        now = datetime.datetime.now(datetime.UTC)
        event = CoreV1Event(
            metadata=V1ObjectMeta(generate_name="ipam-bridge-", namespace=namespace),
            involved_object=V1ObjectReference(
                api_version=obj.get("apiVersion"),
                kind=obj.get("kind"),
                name=meta.get("name"),
                namespace=meta.get("namespace") or None,
                uid=meta.get("uid"),
            ),
            type=type,
            reason=reason,
            message=message[:1024],
            source=V1EventSource(component="ipam-bridge"),
            reporting_component="ipam-bridge",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self.core.create_namespaced_event(namespace, event)


def _finalizer_patch(
    meta: Mapping[str, Any],
    finalizer: str,
    present: bool,
    patch: Callable[[dict[str, Any]], Any],
) -> Write:
    """Send the merge patch that adds or removes ``finalizer`` (see `Kube.set_finalizer`).

    ``meta`` is the object's metadata as read; ``patch(body)`` sends the request.
    """
    current = list(meta.get("finalizers") or [])
    wanted = [f for f in current if f != finalizer] + ([finalizer] if present else [])
    if wanted == current:
        return UNCHANGED
    body = {"metadata": {"finalizers": wanted, "resourceVersion": meta.get("resourceVersion")}}
    try:
        result = patch(body)
    except ApiException as exc:
        if _missing(exc):
            return GONE
        if exc.status == 409:
            return CONFLICT
        raise
    return Write(Outcome.WRITTEN, result if isinstance(result, dict) else None)
