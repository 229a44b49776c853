"""The JSON request layer: custom objects as plain JSON, watch streams, lists.

`JsonObjects` sends the requests of ``kubernetes.client.CustomObjectsApi`` through an
``ApiClient`` and answers plain dicts (no models); `WatchStream` reads a watch's lines;
`Collection` is a list and the resourceVersion it was read at.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import (
    ApiClient,
    ApiException,
)

__all__ = ["MERGE_PATCH", "Collection", "JsonObjects", "WatchStream"]

log = logging.getLogger(__name__)


#: The JSON merge patch media type (RFC 7386), which custom resources accept
#: (https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply).
MERGE_PATCH = "application/merge-patch+json"


class JsonObjects:
    """Custom objects as plain JSON, sent through an ``ApiClient``.

    The requests of ``kubernetes.client.CustomObjectsApi`` with the scope as a parameter
    (``namespace`` None: a cluster-scoped resource, or all namespaces of a list or watch).
    They go through the same ``ApiClient`` (``param_serialize`` builds the URL, headers and
    credentials; ``call_api`` sends it, so an `OperatorApiClient`'s timeout and fence apply
    to each) and answer the API server's JSON as plain dicts: no pydantic validation, no
    deserialisation into the client's types. Bodies are JSON-ready mappings; patches are
    JSON merge patches (RFC 7386).

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

    def _serialize(
        self,
        method: str,
        where: tuple[str, str, str, str | None],
        name: str,
        query: Sequence[tuple[str, Any]],
        headers: dict[str, str],
        subresource: str = "",
    ) -> tuple[str, str, dict[str, str]]:
        """Return the method, URL and headers of a request on ``where`` (and ``name``)."""
        group, version, plural, namespace = where
        params = {"group": group, "version": version, "plural": plural, "name": name}
        path = "/apis/{group}/{version}/{plural}"
        if namespace is not None:
            params["namespace"] = namespace
            path = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"
        method, url, headers, _, _ = self.client.param_serialize(
            method=method,
            resource_path=path + "/{name}" + subresource if name else path,
            path_params=params,
            query_params=list(query) or None,
            header_params={"Accept": "application/json", **headers},
            auth_settings=["BearerToken"],
        )
        return method, url, headers

    def _request(
        self,
        method: str,
        where: tuple[str, str, str, str | None],
        name: str = "",
        *,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        content_type: str = "application/json",
        subresource: str = "",
    ) -> Any:
        """Send one request; return the answer's JSON (None for an empty body).

        Each request's method, URL, status and seconds are logged at DEBUG.
        """
        headers = {"Content-Type": content_type} if body is not None else {}
        method, url, headers = self._serialize(method, where, name, query, headers, subresource)
        started = time.monotonic()
        response = self.client.call_api(method, url, headers, None if body is None else dict(body))
        data = response.read()
        log.debug("%s %s -> %d in %.3fs", method, url, response.status, time.monotonic() - started)
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return json.loads(data) if data else None

    def get(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> Any:
        """GET one object."""
        return self._request("GET", (group, version, plural, namespace), name)

    def list(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        limit: int | None = None,
        token: str | None = None,
    ) -> Any:
        """LIST the objects (at most ``limit``; from a ``continue`` token)."""
        query: list[tuple[str, Any]] = [("limit", limit)] if limit else []
        if token:
            query.append(("continue", token))
        return self._request("GET", (group, version, plural, namespace), query=query)

    def watch(
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
        where = (group, version, plural, namespace)
        method, url, headers = self._serialize("GET", where, "", query, {})
        connect = getattr(self.client, "timeout", None)
        timeout = (connect[0] if connect else read_timeout, read_timeout)
        response = self.client.call_api(method, url, headers, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return WatchStream(response.response)

    def create(
        self, group: str, version: str, plural: str, namespace: str, body: Mapping[str, Any]
    ) -> Any:
        """POST a new namespaced object."""
        return self._request("POST", (group, version, plural, namespace), body=body)

    def patch(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        status: bool = False,
    ) -> Any:
        """Merge-patch an object (``status``: its status subresource)."""
        return self._request(
            "PATCH",
            (group, version, plural, namespace),
            name,
            body=body,
            content_type=MERGE_PATCH,
            subresource="/status" if status else "",
        )

    def delete(
        self, group: str, version: str, plural: str, namespace: str, name: str, uid: str = ""
    ) -> Any:
        """DELETE a namespaced object (the API server's default propagation).

        With ``uid``, the request's ``DeleteOptions`` carry ``preconditions.uid``: the API
        server answers 409 Conflict when the object of that name has another uid
        (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/delete-options/).
        """
        body = None
        if uid:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        return self._request("DELETE", (group, version, plural, namespace), name, body=body)


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
