"""The JSON request layer: custom objects as plain JSON, watch streams, lists.

`JsonObjects` sends the requests of ``kubernetes.client.CustomObjectsApi`` through an
``ApiClient`` and answers plain dicts (no models); `WatchStream` reads a watch's lines;
`Collection` is a list and the resourceVersion it was read at.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import (
    ApiClient,
    ApiException,
)

__all__ = ["MERGE_PATCH", "Collection", "JsonObjects", "WatchStream"]


#: The JSON merge patch media type (RFC 7386), which custom resources accept
#: (https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply).
MERGE_PATCH = "application/merge-patch+json"
_NAMESPACED = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"
_CLUSTER = "/apis/{group}/{version}/{plural}"


def _page_query(limit: int | None, token: str | None) -> list[tuple[str, Any]]:
    """Return the ``limit`` and ``continue`` query parameters of one page of a list."""
    query: list[tuple[str, Any]] = [("limit", limit)] if limit else []
    if token:
        query.append(("continue", token))
    return query


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
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        limit: int | None = None,
        _continue: str | None = None,
    ) -> Any:
        """LIST the objects of a namespace (at most ``limit``; from a ``continue`` token)."""
        query = _page_query(limit, _continue)
        return self._request("GET", *self._params(group, version, plural, namespace), query=query)

    def list_cluster_custom_object(
        self,
        group: str,
        version: str,
        plural: str,
        limit: int | None = None,
        _continue: str | None = None,
    ) -> Any:
        """LIST the objects of all namespaces, or of a cluster-scoped resource (paged alike)."""
        query = _page_query(limit, _continue)
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
        self, group: str, version: str, namespace: str, plural: str, name: str, uid: str = ""
    ) -> Any:
        """DELETE a namespaced object (the API server's default propagation).

        With ``uid``, the request's ``DeleteOptions`` carry ``preconditions.uid``: the API
        server answers 409 Conflict when the object of that name has another uid
        (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/delete-options/).
        """
        body = None
        if uid:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        path, params = self._params(group, version, plural, namespace, name)
        content_type = "application/json" if body is not None else None
        return self._request("DELETE", path, params, body=body, content_type=content_type)


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
