"""The only module that talks to the Kubernetes API (the official ``kubernetes`` client).

A generic gateway (`Kube`): get, list, create, merge-patch, patch status, set a finalizer,
delete and post Events, for any resource named by group, version and plural (`Resource`);
which resources the operator uses is said outside the runtime (`bridge.objects.client`).
Custom objects travel as plain JSON (`JsonObjects`: the client's ``ApiClient``, without
its models), the hot path of every claim.
Calls are synchronous: the work queue's worker threads make them. "Not found" is a value
(None) for reads; a write answers a `Write` (written, unchanged, gone, conflict) that its
caller handles case by case. Every other API failure propagates as
``kubernetes.client.ApiException``. Also here: the ``ApiClient`` every request goes through
(`OperatorApiClient`: a timeout on each request, a fence before each write) and the
API server's refusals (`AccessDeniedError`, `NotServedError`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

import kubernetes
import urllib3
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

from bridge.runtime.kubeconfig import load_configuration

__all__ = [
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


#: HTTP methods that change something on the API server (checked by the fence).
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _is_event(url: str) -> bool:
    """Return True for a request on Events (``core/v1`` or ``events.k8s.io``)."""
    path = url.split("?", 1)[0]
    return path.endswith("/events") or "/events/" in path or "/events.k8s.io/" in path


class OperatorApiClient(ApiClient):
    """An ``ApiClient`` whose every request has a timeout and whose writes pass a fence.

    The kubernetes client sends a request without any timeout unless each call passes
    ``_request_timeout`` (a documented per-call parameter of every API method): a connection
    that died silently then hangs its worker for ever. ``ApiClient.call_api`` is the public
    method every API method's request goes through, so this subclass supplies the default
    there; a call's own ``_request_timeout`` wins.

    Before each POST, PUT, PATCH and DELETE other than an Event, ``fence`` is called in the
    calling thread (`bridge.runtime.fence.Fence.check`): it raises when this replica may not write,
    and the request is not sent. Such a write is then sent with one total timeout (urllib3's
    ``Timeout(total=...)``, which the kubernetes client makes of a single number: connecting
    and each wait for bytes end by it) of its read timeout cut by ``write_timeout``
    (`bridge.runtime.fence.Fence.bound`: to the time the Lease stays valid), so the replica
    stops waiting on a write before its fence closes. Events are notes, not state, and the
    Event saying that a replica stopped leading is posted after its fence closed.

    Parameters
    ----------
    configuration:
        The client configuration (`load_configuration`).
    timeout:
        ``(connect, read)`` timeout of each request in seconds (urllib3's meaning: the read
        timeout bounds each wait for bytes, not the whole answer); None: the client's
        default (no timeout).
    fence:
        Raises before a write that must not be sent; None: every write is sent.
    write_timeout:
        Takes a write's timeout in seconds (``math.inf``: none) and returns it cut to the
        Lease's time left, or raises to refuse the write; None: writes keep ``timeout``.
    """

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        timeout: tuple[float, float] | None = None,
        fence: Callable[[], None] | None = None,
        write_timeout: Callable[[float], float] | None = None,
    ) -> None:
        super().__init__(configuration)
        self.timeout = timeout
        self.fence = fence
        self.write_timeout = write_timeout

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        """``ApiClient.call_api`` with the default timeout and the fence (see the class).

        Raises
        ------
        bridge.runtime.fence.LeadershipLostError
            From ``fence``, for a write this replica may not send.
        kubernetes.client.ApiException, urllib3.exceptions.HTTPError
            As ``ApiClient.call_api`` (a timeout is urllib3's ``TimeoutError``).
        """
        timeout = self.timeout if _request_timeout is None else _request_timeout
        if method.upper() in WRITE_METHODS and not _is_event(url):
            if self.fence is not None:
                self.fence()
            if self.write_timeout is not None:
                timeout = self.write_timeout(_whole(timeout))
        return super().call_api(
            method,
            url,
            header_params=header_params,
            body=body,
            post_params=post_params,
            _request_timeout=timeout,
        )


def _whole(timeout: Any) -> float:
    """Return the seconds a write may take in all under ``_request_timeout`` ``timeout``.

    A number is already a total (the kubernetes client's ``rest`` module makes it
    ``urllib3.Timeout(total=...)``); a ``(connect, read)`` pair gives its read timeout (the
    longer wait, for an answer); None gives ``math.inf``.
    """
    if isinstance(timeout, int | float):
        return float(timeout)
    if isinstance(timeout, tuple) and len(timeout) == 2:
        return float(max(timeout))
    return math.inf


def api_client(
    configuration: kubernetes.client.Configuration | None = None,
    *,
    pool_size: int = 10,
    timeout: tuple[float, float] | None = None,
    fence: Callable[[], None] | None = None,
    write_timeout: Callable[[float], float] | None = None,
) -> OperatorApiClient:
    """Return an `OperatorApiClient` on ``configuration`` (default: `load_configuration()`).

    Loading the configuration may read files and run a kubeconfig's exec plugin: call this
    off the event loop.

    Parameters
    ----------
    pool_size:
        HTTP connections kept per host (one per concurrent worker thread).
    timeout:
        ``(connect, read)`` seconds of every request (``Settings.kube_timeout``); None: none.
    fence:
        Called before every write but Events; raises to refuse it (`fence.Fence.check`).
    write_timeout:
        Cuts the timeout of every write but Events (`fence.Fence.bound`); see
        `OperatorApiClient`.
    """
    configuration = configuration or load_configuration()
    configuration.connection_pool_maxsize = max(pool_size, 4)
    return OperatorApiClient(
        configuration, timeout=timeout, fence=fence, write_timeout=write_timeout
    )


def _missing(exc: ApiException) -> bool:
    return bool(exc.status == 404)


#: The JSON merge patch media type (RFC 7386), which custom resources accept
#: (https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply).
MERGE_PATCH = "application/merge-patch+json"
_NAMESPACED = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"
_CLUSTER = "/apis/{group}/{version}/{plural}"


class JsonObjects:
    """Custom objects as plain JSON: the requests of ``kubernetes.client.CustomObjectsApi``.

    The same methods (names and positional parameters) as the generated
    ``CustomObjectsApi`` the gateway uses, sending the same requests through the same
    ``ApiClient`` (``param_serialize`` builds the URL, headers and credentials;
    ``call_api`` sends it, so an `OperatorApiClient`'s timeout and fence apply to each),
    answering the API server's JSON as plain dicts (``json.loads``): no validation of the
    arguments by pydantic, no walk of the body by ``sanitize_for_serialization``, no
    deserialisation into the client's types. Bodies are JSON-ready mappings; patches are
    JSON merge patches (RFC 7386, https://www.rfc-editor.org/rfc/rfc7386).

    Each method raises ``kubernetes.client.ApiException`` (its subclasses: 404
    ``NotFoundException``, 409 ``ConflictException``...) for a non-2xx answer, as the
    generated methods do (``ApiException.from_response``), and urllib3's errors (a
    timeout, a refused connection) unchanged.

    Parameters
    ----------
    client:
        The ``ApiClient`` every request goes through.
    """

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        *,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        content_type: str | None = None,
    ) -> Any:
        """Send one request; return the answer's JSON (None for an empty body)."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        method, url, headers, _, post = self.client.param_serialize(
            method=method,
            resource_path=path,
            path_params=dict(params),
            query_params=list(query) or None,
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        # The body goes as it is: param_serialize would only copy a JSON-ready mapping.
        response = self.client.call_api(method, url, headers, body, post)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return json.loads(data) if data else None

    @staticmethod
    def _params(
        group: str, version: str, plural: str, namespace: str | None = None, name: str = ""
    ) -> tuple[str, dict[str, str]]:
        params = {"group": group, "version": version, "plural": plural}
        path = _CLUSTER if namespace is None else _NAMESPACED
        if namespace is not None:
            params["namespace"] = namespace
        if name:
            params["name"] = name
            path += "/{name}"
        return path, params

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        """GET one namespaced object."""
        return self._request("GET", *self._params(group, version, plural, namespace, name))

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> Any:
        """GET one cluster-scoped object."""
        return self._request("GET", *self._params(group, version, plural, None, name))

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, limit: int | None = None
    ) -> Any:
        """LIST the objects of a namespace (at most ``limit`` when given)."""
        query = [("limit", limit)] if limit else []
        return self._request("GET", *self._params(group, version, plural, namespace), query=query)

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, limit: int | None = None
    ) -> Any:
        """LIST the objects of all namespaces, or of a cluster-scoped resource."""
        query = [("limit", limit)] if limit else []
        return self._request("GET", *self._params(group, version, plural), query=query)

    def watch_custom_objects(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
    ) -> WatchStream:
        """WATCH the objects of a namespace (None: all) from ``resource_version``.

        Asks for bookmarks (``allowWatchBookmarks``) and for the server to end the watch
        after ``timeout_seconds``; a wait of more than ``read_timeout`` seconds for the next
        bytes raises urllib3's ``ReadTimeoutError`` from the stream (a connection that died
        silently). The watch protocol:
        https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes

        Raises
        ------
        kubernetes.client.ApiException
            When the API server answers the request with an error (410 Gone: the version is
            too old, list again).
        """
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
        ]
        path, params = self._params(group, version, plural, namespace)
        method, url, headers, _, _ = self.client.param_serialize(
            method="GET",
            resource_path=path,
            path_params=params,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        connect = getattr(self.client, "timeout", None)
        timeout = (connect[0] if connect else read_timeout, read_timeout)
        response = self.client.call_api(method, url, headers, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return WatchStream(response.response)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Mapping[str, Any]
    ) -> Any:
        """POST a new namespaced object."""
        path, params = self._params(group, version, plural, namespace)
        return self._request("POST", path, params, body=body, content_type="application/json")

    def patch_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
    ) -> Any:
        """Merge-patch a namespaced object."""
        path, params = self._params(group, version, plural, namespace, name)
        return self._request("PATCH", path, params, body=body, content_type=MERGE_PATCH)

    def patch_namespaced_custom_object_status(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
    ) -> Any:
        """Merge-patch the status subresource of a namespaced object."""
        path, params = self._params(group, version, plural, namespace, name)
        return self._request("PATCH", path + "/status", params, body=body, content_type=MERGE_PATCH)

    def patch_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> Any:
        """Merge-patch a cluster-scoped object."""
        path, params = self._params(group, version, plural, None, name)
        return self._request("PATCH", path, params, body=body, content_type=MERGE_PATCH)

    def patch_cluster_custom_object_status(
        self, group: str, version: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> Any:
        """Merge-patch the status subresource of a cluster-scoped object."""
        path, params = self._params(group, version, plural, None, name)
        return self._request("PATCH", path + "/status", params, body=body, content_type=MERGE_PATCH)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        """DELETE a namespaced object (the API server's default propagation)."""
        return self._request("DELETE", *self._params(group, version, plural, namespace, name))


class WatchStream:
    """The events of one watch request, as they come: ``{"type": ..., "object": {...}}``.

    Iterating reads the response line by line (one JSON event per line, the API server's
    watch encoding) in the calling thread; `close` may be called from another thread and
    ends a read waiting for the next line at once.

    Parameters
    ----------
    response:
        The streamed urllib3 response of a watch request.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield each event as JSON.

        Raises
        ------
        urllib3.exceptions.HTTPError
            When the connection breaks or a read times out.
        """
        for line in self._response:
            if line.strip():
                event: dict[str, Any] = json.loads(line)
                yield event

    def close(self) -> None:
        """End the stream (from any thread): a waiting read returns, the connection closes.

        ``HTTPResponse.shutdown`` (urllib3 >= 2.3) shuts the socket's reading side down.
        """
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # released or closed
            self._response.shutdown()
        self._response.close()


@dataclass(frozen=True)
class Collection:
    """A list of objects and the resourceVersion it was read at (to watch from)."""

    items: list[dict[str, Any]]
    resource_version: str


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
    on_stored:
        Write-through: called with the plural and the object as the API server returned it
        after each successful write that returned one (a cache sees our own write at once).
    on_deleted:
        Called with ``(plural, namespace, name)`` after an object was deleted (or found
        gone) by `delete`.
    """

    def __init__(
        self,
        client: ApiClient,
        *,
        on_stored: Callable[[str, Mapping[str, Any]], None] | None = None,
        on_deleted: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.core = CoreV1Api(client)
        self.custom = JsonObjects(client)
        self.on_stored = on_stored
        self.on_deleted = on_deleted

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def _stored(self, plural: str, body: Any) -> Any:
        """Pass a write's result to `on_stored` (when it is an object); return it unchanged."""
        if self.on_stored is not None and isinstance(body, Mapping):
            self.on_stored(plural, body)
        return body

    def _gone(self, plural: str, namespace: str, name: str) -> None:
        if self.on_deleted is not None:
            self.on_deleted(plural, namespace, name)

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
        r = resource
        try:
            if r.namespaced:
                found = self.custom.get_namespaced_custom_object(
                    r.group, r.version, namespace, r.plural, name
                )
            else:
                found = self.custom.get_cluster_custom_object(r.group, r.version, r.plural, name)
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
        ``kind`` and ``apiVersion`` get the resource's (when `Resource.kind` is set).
        ``limit`` asks the API server for at most that many per namespace.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure (404 when the resource is not served).
        """
        r = resource
        extra: dict[str, Any] = {"limit": limit} if limit else {}
        wanted = [ns for ns in namespaces if ns] if r.namespaced else []
        if wanted:
            results = [
                self.custom.list_namespaced_custom_object(r.group, r.version, ns, r.plural, **extra)
                for ns in wanted
            ]
        else:
            results = [
                self.custom.list_cluster_custom_object(r.group, r.version, r.plural, **extra)
            ]
        items = [
            dict(item)
            for result in results
            for item in cast(dict[str, Any], result).get("items") or []
        ]
        if r.kind:
            for item in items:
                item.setdefault("kind", r.kind)
                item.setdefault("apiVersion", r.api_version)
        return items

    def list_collection(self, resource: Resource, namespace: str | None) -> Collection:
        """Return the objects of ``resource`` in ``namespace`` (None: all) and the list's version.

        The list's ``metadata.resourceVersion`` is where a watch of the same objects starts
        (`watch`), so that it tells every change after the list and none before.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure.
        """
        r = resource
        if r.namespaced and namespace:
            found = self.custom.list_namespaced_custom_object(
                r.group, r.version, namespace, r.plural
            )
        else:
            found = self.custom.list_cluster_custom_object(r.group, r.version, r.plural)
        body = cast(dict[str, Any], found)
        items = [dict(item) for item in body.get("items") or []]
        if r.kind:
            for item in items:
                item.setdefault("kind", r.kind)
                item.setdefault("apiVersion", r.api_version)
        return Collection(items, str(_meta(body).get("resourceVersion") or ""))

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

        See `JsonObjects.watch_custom_objects` (parameters, errors).
        """
        r = resource
        return self.custom.watch_custom_objects(
            r.group,
            r.version,
            r.plural,
            namespace if r.namespaced and namespace else None,
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

    def create(
        self, resource: Resource, body: Mapping[str, Any], *, write_through: bool = True
    ) -> Write:
        """Create a namespaced object.

        With ``write_through`` the stored object goes to `on_stored`.

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
            created = self.custom.create_namespaced_custom_object(
                r.group, r.version, namespace, r.plural, dict(body)
            )
        except ApiException as exc:
            if exc.status == 409:
                return CONFLICT
            raise
        stored = self._stored(r.plural, created) if write_through else created
        return Write(Outcome.WRITTEN, cast(dict[str, Any], stored))

    def patch(
        self, resource: Resource, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch (RFC 7386) an object; return it as stored, or None when it is gone.

        Custom resources take no strategic merge: lists in ``patch`` replace the stored
        ones whole. A ``metadata.resourceVersion`` in ``patch`` makes the API server answer
        409 Conflict when the object changed since
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts).

        Raises
        ------
        kubernetes.client.ApiException
            409 for a stale resourceVersion, 422 when the schema refuses the result; any
            other failure but 404.
        """
        return self._merge_patch(resource, namespace, name, patch, status=False)

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
        stored = self._merge_patch(resource, namespace, name, patch, status=True)
        return GONE if stored is None else Write(Outcome.WRITTEN, stored)

    def _merge_patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        status: bool,
    ) -> dict[str, Any] | None:
        """Merge-patch an object (``status``: its status subresource); None when it is gone."""
        r, custom = resource, self.custom
        try:
            if r.namespaced:
                namespaced = (
                    custom.patch_namespaced_custom_object_status
                    if status
                    else custom.patch_namespaced_custom_object
                )
                stored = namespaced(r.group, r.version, namespace, r.plural, name, dict(patch))
            else:
                cluster = (
                    custom.patch_cluster_custom_object_status
                    if status
                    else custom.patch_cluster_custom_object
                )
                stored = cluster(r.group, r.version, r.plural, name, dict(patch))
        except ApiException as exc:
            if _missing(exc):
                return None
            raise
        return cast(dict[str, Any], self._stored(r.plural, stored))

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
            lambda patch: self._patch_or_raise(
                resource, str(meta.get("namespace") or ""), meta["name"], patch
            ),
        )

    def _patch_or_raise(
        self, resource: Resource, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Any:
        """Merge-patch like `patch`, but let 404 propagate (`set_finalizer` maps it)."""
        r = resource
        if r.namespaced:
            stored = self.custom.patch_namespaced_custom_object(
                r.group, r.version, namespace, r.plural, name, dict(patch)
            )
        else:
            stored = self.custom.patch_cluster_custom_object(
                r.group, r.version, r.plural, name, dict(patch)
            )
        return self._stored(r.plural, stored)

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
        change makes the API answer 409. A missing object is success. `on_deleted` is told.

        Parameters
        ----------
        finalizer:
            The finalizer of ours that protects the object (None: none).
        current:
            The object as last seen (``metadata.finalizers`` and ``resourceVersion``, e.g.
            from a cache): no read is sent. When it is stale (409 Conflict), or not given,
            the object is read once and the write tried again with what was read.

        Returns
        -------
        Write
            `Outcome.WRITTEN` when this call deleted it; `Outcome.GONE` when it did not exist
            (any more); `Outcome.CONFLICT` when a 409 persists after that one read.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        if current is not None:
            try:
                return self._delete(resource, namespace, name, finalizer, current)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        current = self.get(resource, namespace, name)
        if current is None:
            self._gone(resource.plural, namespace, name)
            return GONE
        try:
            return self._delete(resource, namespace, name, finalizer, current)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return CONFLICT

    def _delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        finalizer: str | None,
        current: Mapping[str, Any],
    ) -> Write:
        """Remove ``finalizer`` (guarded by resourceVersion), then delete; 409 propagates."""
        r = resource
        meta = _meta(current)
        finalizers = list(meta.get("finalizers") or [])
        if finalizer is not None and finalizer in finalizers:
            finalizers.remove(finalizer)
            patch = {
                "metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": meta.get("resourceVersion"),
                }
            }
            try:
                self.custom.patch_namespaced_custom_object(
                    r.group, r.version, namespace, r.plural, name, patch
                )
            except ApiException as exc:
                if _missing(exc):
                    self._gone(r.plural, namespace, name)
                    return GONE
                raise
        try:
            self.custom.delete_namespaced_custom_object(
                r.group, r.version, namespace, r.plural, name
            )
        except ApiException as exc:
            if not _missing(exc):
                raise
            self._gone(r.plural, namespace, name)
            return GONE
        self._gone(r.plural, namespace, name)
        return Write(Outcome.WRITTEN)

    def set_secret_finalizer(
        self, namespace: str, name: str, finalizer: str, present: bool
    ) -> bool:
        """Add or remove ``finalizer`` on a Secret; return False when the Secret does not exist.

        Reads the Secret's metadata first (the write is guarded by its resourceVersion); a
        Secret that is being deleted can lose a finalizer but not get one (the API refuses).

        Raises
        ------
        kubernetes.client.ApiException
            409 when the Secret changed between the read and the write (the caller retries);
            any other failure but 404.
        """
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if _missing(exc):
                return False
            raise
        meta = secret.metadata
        if meta is None:
            return True
        if (
            present
            and meta.deletion_timestamp is not None
            and finalizer not in (meta.finalizers or [])
        ):
            return True
        seen = {"finalizers": list(meta.finalizers or []), "resourceVersion": meta.resource_version}
        written = _finalizer_patch(
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
        if written.outcome is Outcome.CONFLICT:
            raise ApiException(status=409, reason="Conflict")
        return written.outcome is not Outcome.GONE

    # -- events ---------------------------------------------------------------------

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create the ``core/v1`` Event ``event`` (JSON, its name set) in ``namespace``.

        Raises
        ------
        kubernetes.client.ApiException
            When the API refuses it (409: the name exists).
        """
        meta, involved = event["metadata"], event["involvedObject"]
        body = CoreV1Event(
            metadata=V1ObjectMeta(name=meta["name"], namespace=namespace),
            involved_object=V1ObjectReference(
                api_version=involved.get("apiVersion"),
                kind=involved.get("kind"),
                name=involved.get("name"),
                namespace=involved.get("namespace"),
                uid=involved.get("uid"),
            ),
            type=event["type"],
            reason=event["reason"],
            message=event["message"],
            source=V1EventSource(component=event["source"]["component"]),
            reporting_component=event["reportingComponent"],
            first_timestamp=_parse_time(event["firstTimestamp"]),
            last_timestamp=_parse_time(event["lastTimestamp"]),
            count=event["count"],
        )
        self.core.create_namespaced_event(namespace, body)

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


def _parse_time(stamp: str) -> datetime.datetime:
    """Return the UTC time of an RFC 3339 ``...Z`` timestamp."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


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
