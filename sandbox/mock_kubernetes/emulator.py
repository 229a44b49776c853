"""The HTTP face of the in-memory Kubernetes API: an aiohttp handler serving an ObjectStore.

:class:`KubeEmulator` is an ``aiohttp.web.Server`` request handler
(https://docs.aiohttp.org/en/stable/web_lowlevel.html). It authenticates, authorizes and
routes each request as the API server does (``k8s.io/apiserver``'s request info, see
:func:`mock_kubernetes.auth.request_attributes`), serves discovery from the store's declared
resources and every resource request from the store, answers failures with a ``v1 Status``
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/) and streams
watches as one JSON event per line
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes).

It is written on aiohttp alone, not on kmock (the HTTP mock library with a Kubernetes
scaffold, https://github.com/nolar/kmock): kmock's public API cannot serve this API. Its URL
parser refuses ``/api/v1/namespaces/<name>``, its discovery lists the resources of its own
DSL declarations, and it keeps every request served and matches each new one against all of
them, with no public way to bound that history (quadratic: 200 objects took minutes). What
kmock would add besides (error rendering, streaming, a fault-injection DSL) is a few dozen
lines here; fault injection is :class:`mock_kubernetes.faults.Faults`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import logging
import re
import socket
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web

from mock_kubernetes.auth import (
    AccessLog,
    Identity,
    RequestAttributes,
    User,
    forbidden,
    owner_references_admission,
    request_attributes,
)
from mock_kubernetes.faults import Faults
from mock_kubernetes.inflight import DeletesInFlight
from mock_kubernetes.partition import Partition
from mock_kubernetes.resources import ResourceDef
from mock_kubernetes.silence import Silence
from mock_kubernetes.store import Admit, ApiError, ObjectStore

__all__ = ["KubeEmulator", "Route", "kube_version_priority", "route"]

_log = logging.getLogger(__name__)

_KUBE_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")

#: What ``GET /version`` answers (``version.Info``): a Kubernetes release of the emulator's
#: era, so that clients that check the server version see a supported one.
SERVER_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0+mock-kubernetes",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "",
    "goVersion": "",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def kube_version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of API versions by Kubernetes priority: ``v2 < v1 < v1beta2 < v1beta1 < v1alpha1``.

    Versions that do not look like Kubernetes versions come last, alphabetically
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definition-versioning/#version-priority).
    """
    match = _KUBE_VERSION.fullmatch(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = int(match.group(1)), match.group(2), int(match.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, version)


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a resource request goes: ``/api[s]/<group>/<version>/[namespaces/<ns>/]<plural>...``.

    Attributes
    ----------
    group : str
        API group (``""``: the core group of ``/api``).
    version : str
        API version.
    plural : str
        Resource.
    namespace : str or None
        The namespace of the URL (``None``: cluster-scoped, or all namespaces).
    name : str or None
        The object (``None``: the collection).
    subresource : str or None
        ``status``, ``finalize``... (``None``: the object itself).

    """

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def route(path: str) -> Route | None:
    """Return the resource a URL path names, or ``None`` for other paths (discovery...).

    ``/api/v1/namespaces[/<name>[/status|/finalize]]`` is the Namespace resource itself;
    ``.../namespaces/<ns>/<plural>...`` is ``<plural>`` in namespace ``<ns>``.

    Parameters
    ----------
    path : str
        The URL path, without the query.

    Returns
    -------
    Route or None
        ``None`` when the path names no resource (``/``, ``/api``, ``/apis/<group>``,
        ``/apis/<group>/<version>``, ``/version``...).

    """
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    namespace_itself = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
    if rest[0] == "namespaces" and len(rest) > 2 and not namespace_itself:
        namespace, rest = rest[1], rest[2:]
    return Route(
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
    )


# The API server's warnings of the request being served (``Warning`` response headers); set
# per request in KubeEmulator.__call__, filled by the store (pruned fields).
_WARNINGS: contextvars.ContextVar[list[str]] = contextvars.ContextVar("kube_emulator_warnings")
# Who makes the request being served, and what it asks (for admission checks).
_REQUESTER: contextvars.ContextVar[tuple[Identity, RequestAttributes]] = contextvars.ContextVar(
    "kube_emulator_requester"
)


def _warning_header(text: str) -> str:
    """Format a ``Warning`` header as the API server does (RFC 7234 code 299, agent ``-``)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def _admin() -> Identity:
    return Identity(User("admin", ("system:masters", "system:authenticated")))


def _status_response(error: ApiError, attributes: RequestAttributes) -> aiohttp.web.Response:
    body = error.to_status()
    if attributes.resource_request:
        body["details"] = {
            "name": attributes.name,
            "group": attributes.api_group,
            "kind": attributes.resource,
        }
    return aiohttp.web.json_response(body, status=error.status)


def _not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


@dataclasses.dataclass(kw_only=True)
class KubeEmulator:
    """An aiohttp request handler that serves an :class:`ObjectStore` with Kubernetes semantics.

    Discovery (``/``, ``/api``, ``/apis``, group and group/version lists, ``/version``)
    describes the store's declared resources; every request on a resource path is served from
    the store; any other path is ``404``. Authentication, the partition, authorization, the
    latency and injected faults apply, in this order, before a request is served.

    Parameters
    ----------
    store : ObjectStore
        The objects and their semantics (created when omitted).
    admin : Identity
        The unrestricted identity (user ``admin`` in ``system:masters``).
    identities : dict of str to Identity
        Bearer token -> identity; the admin's is added on creation.
    require_token : bool
        When false (the default), a request without credentials is served as the admin;
        when true it gets ``401 Unauthorized``, as do unknown tokens in any case.
    access_log : AccessLog
        Every authorization decision (requests, and checks admission makes for them).
    latency : dict of str to float
        Seconds added before answering an authorized request, by verb (``get``, ``list``,
        ``create``, ``patch``, ``update``, ``delete``...; ``watch`` streams are never
        delayed); empty (the default) adds none. For benchmarks: a real API server answers
        reads in milliseconds and writes after an etcd commit. Other requests are served
        meanwhile (the wait does not block the server).
    partition : Partition
        Identities cut off from the server (their requests hang or are refused while others
        are served): a network partition of one client.
    faults : Faults
        Injected failures: chosen authorized requests answered with an error status.
    silence : Silence
        A silent network for every client: open watch streams send nothing more, new
        requests are held (`mock_kubernetes.silence`).
    bookmark_seconds : float or None
        Seconds without an event after which a watch asked with ``allowWatchBookmarks``
        gets a ``BOOKMARK`` (60, as a real API server); ``None``: never.
    deletes : DeletesInFlight
        A window between a DELETE's read and its commit (`mock_kubernetes.inflight`): a
        finalizer PATCH committed meanwhile is lost with the object (real-cluster.md 13e).
        Closed by default.

    Notes
    -----
    See ``mock_kubernetes/README.md`` for what is emulated and what is not.

    """

    store: ObjectStore = dataclasses.field(default_factory=ObjectStore)
    admin: Identity = dataclasses.field(default_factory=_admin)
    identities: dict[str, Identity] = dataclasses.field(default_factory=dict)
    require_token: bool = False
    access_log: AccessLog = dataclasses.field(default_factory=AccessLog)
    latency: dict[str, float] = dataclasses.field(default_factory=dict)
    partition: Partition = dataclasses.field(default_factory=Partition)
    faults: Faults = dataclasses.field(default_factory=Faults)
    silence: Silence = dataclasses.field(default_factory=Silence)
    bookmark_seconds: float | None = 60.0
    deletes: DeletesInFlight = dataclasses.field(default_factory=DeletesInFlight)
    _watching: set[asyncio.Transport] = dataclasses.field(
        default_factory=set, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.identities[self.admin.token] = self.admin

    async def __call__(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve one request (the handler of an ``aiohttp.web.Server``).

        Parameters
        ----------
        request : aiohttp.web.BaseRequest
            The HTTP request.

        Returns
        -------
        aiohttp.web.StreamResponse
            The answer: JSON, a ``v1 Status`` on failure, or a watch stream (already sent).

        """
        await self.silence.admit(request)
        attributes = request_attributes(request.method, request.path, request.query)
        identity = self.authenticate(request.headers.get("Authorization"))
        if identity is None:
            return _status_response(ApiError(401, "Unauthorized", "Unauthorized"), attributes)
        await self.partition.admit(identity, request)
        allowed, reason = identity.authorize(attributes)
        self.access_log.record(identity.user, attributes, allowed)
        if not allowed:
            return _status_response(forbidden(identity.user, attributes, reason), attributes)
        delay = self.latency.get(attributes.verb, 0.0) if attributes.verb != "watch" else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        fault = self.faults.take(request.method, request.path)
        if fault is not None:
            error = ApiError(fault, Faults.reason(fault), f"injected fault: {fault}")
            return _status_response(error, attributes)
        warnings: list[str] = []
        token = _WARNINGS.set(warnings)
        requester = _REQUESTER.set((identity, attributes))
        try:
            response = await self._serve(request)
        finally:
            _REQUESTER.reset(requester)
            _WARNINGS.reset(token)
        if warnings and not response.prepared:
            for warning in warnings:
                response.headers.add("Warning", _warning_header(warning))
        return response

    def authenticate(self, authorization: str | None) -> Identity | None:
        """Return the identity of an ``Authorization`` header, or ``None`` (401).

        Parameters
        ----------
        authorization : str or None
            The header; ``Bearer <token>`` is understood.

        Returns
        -------
        Identity or None
            The token's identity; the admin for no header unless :attr:`require_token`;
            ``None`` for an unknown token or another scheme.

        """
        if not authorization:
            return None if self.require_token else self.admin
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.identities.get(token.strip())

    async def _serve(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Answer an authorized request: a resource, discovery, or 404; errors as Status."""
        target = route(request.path)
        try:
            if target is not None:
                body = await request.read()
                raced = await self._delete_in_flight(request, target, body)
                if raced is not None:
                    return aiohttp.web.json_response(raced)
                result = self._dispatch(request, target, body)
                if isinstance(result, AsyncIterator):
                    return await self._stream(request, result)
                created = request.method == "POST" and target.name is None
                return aiohttp.web.json_response(result, status=201 if created else 200)
            if request.method not in ("GET", "HEAD"):
                raise _not_found()
            return aiohttp.web.json_response(self._discovery(request.path))
        except ApiError as e:
            status = e.to_status()
            if target is not None:
                status["details"] = e.details or {  # 422 Invalid brings its own (kind, causes)
                    "name": target.name or "",
                    "group": target.group,
                    "kind": target.plural,
                }
            return aiohttp.web.json_response(status, status=e.status)
        except Exception as e:  # a bug of the emulator: tell the client, as a 500 Status
            _log.exception("the emulator failed to serve %s %s", request.method, request.path)
            error = ApiError(500, "InternalError", f"the emulator failed: {e!r}")
            return aiohttp.web.json_response(error.to_status(), status=500)

    async def _stream(
        self, request: aiohttp.web.BaseRequest, events: AsyncIterator[dict[str, Any]]
    ) -> aiohttp.web.StreamResponse:
        """Send watch events as JSON lines; the headers go at once (a watch may stay silent).

        A stream the `silence` silenced sends nothing more, not even its end, and stays open.
        """
        epoch = self.silence.epoch
        response = aiohttp.web.StreamResponse(
            status=200, headers={"Content-Type": "application/json"}
        )
        await response.prepare(request)
        transport = request.transport
        if transport is not None:
            self._watching.add(transport)
        try:
            try:
                async for event in events:
                    if self.silence.silenced(epoch):
                        break
                    await response.write(json.dumps(event).encode() + b"\n")
            except ConnectionError:
                return response  # the client went away
            except Exception as e:  # a bug of the emulator: one ERROR event, then the end
                _log.exception("the emulator failed during the watch %s", request.path)
                error = ApiError(500, "InternalError", f"the emulator failed: {e!r}")
                await response.write(
                    json.dumps({"type": "ERROR", "object": error.to_status()}).encode() + b"\n"
                )
            if self.silence.silenced(epoch):
                await _aclose(events)  # the store forgets the watcher at once
                await self.silence.hold_open(request)
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away while the stream ended
        finally:
            if transport is not None:
                self._watching.discard(transport)
            await _aclose(events)  # the store forgets the watcher at once
        return response

    def reset_watches(self) -> int:
        """Cut every open watch connection with a TCP reset; return how many (loop thread).

        As a load balancer, a proxy or a NAT that drops a long-lived connection does: the
        client's next read fails with "connection reset by peer" in the middle of the
        stream (no end of the chunked body). The server stays up: new connections, and
        watches resumed from a resourceVersion, are served as before.
        """
        cut = 0
        for transport in list(self._watching):
            sock = transport.get_extra_info("socket")
            if sock is not None:  # linger 0: close() sends RST, not FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            cut += 1
        self._watching.clear()
        self.store.drop_watches()  # their handlers end (the store forgets the watchers)
        return cut

    # -- discovery ------------------------------------------------------------------------------

    def _groups(self) -> dict[str, list[ResourceDef]]:
        groups: dict[str, list[ResourceDef]] = {}
        for defn in self.store.resources:
            groups.setdefault(defn.group, []).append(defn)
        return groups

    def _group_entry(self, group: str, defs: list[ResourceDef]) -> dict[str, Any]:
        # Several CRDs can share a group (CAPI's claims and our pools): like the API server,
        # list the group's versions by Kubernetes version priority (GA > beta > alpha, higher
        # numbers first) and prefer the first (apiextensions-apiserver sorts discovery with
        # version.CompareKubeAwareVersionStrings).
        versions: list[str] = []
        for defn in defs:
            versions.extend(v for v in defn.versions if v not in versions)
        versions.sort(key=kube_version_priority)
        preferred = versions[0] if group else defs[0].preferred_version
        return {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{preferred}", "version": preferred},
        }

    def _discovery(self, path: str) -> dict[str, Any]:
        """Answer ``GET`` on a path that names no resource.

        Raises
        ------
        ApiError
            404 for a path that is not discovery, or an API group or version not served.

        """
        parts = [p for p in path.strip("/").split("/") if p]
        if not parts:
            return self._root()
        if parts == ["version"]:
            return dict(SERVER_VERSION)
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [self._group_entry(g, d) for g, d in sorted(self._groups().items()) if g],
            }
        if len(parts) == 2 and parts[0] == "api":
            return self._resource_list("", parts[1])
        if len(parts) == 2 and parts[0] == "apis":
            defs = self._groups().get(parts[1])
            if not defs:
                raise _not_found()
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group_entry(parts[1], defs)}
        if len(parts) == 3 and parts[0] == "apis":
            return self._resource_list(parts[1], parts[2])
        raise _not_found()

    def _root(self) -> dict[str, Any]:
        paths = {"/api", "/api/v1", "/apis", "/version"}
        for group, defs in self._groups().items():
            if group:
                paths.add(f"/apis/{group}")
                paths.update(f"/apis/{group}/{v}" for d in defs for v in d.versions)
        return {"paths": sorted(paths)}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        defs = [d for d in self._groups().get(group, []) if version in d.versions]
        if not defs and group:
            raise _not_found()
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for d in defs for entry in d.discovery()],
        }

    # -- resources ------------------------------------------------------------------------------

    async def _delete_in_flight(
        self, request: aiohttp.web.BaseRequest, target: Route, raw: bytes
    ) -> dict[str, Any] | None:
        """Serve a DELETE through the window of `deletes` when it applies; else None.

        The object is read (the decision), the window waited out, then the object removed as
        it is by then (`ObjectStore.commit_delete`). None: served by `_dispatch` (no window
        for this request, or the object has finalizers and is marked, not removed).
        """
        if not (
            request.method.upper() == "DELETE"
            and target.name is not None
            and target.subresource is None
            and self.deletes.applies(target.plural)
        ):
            return None
        defn = self.store.resolve(target.group, target.version, target.plural)
        options = _body(raw) if raw else None
        read = self.store.read_for_delete(defn, target.namespace, target.name, options)
        if read is None:
            return None
        await self.deletes.wait()
        return self.store.commit_delete(defn, read, options)

    def _dispatch(self, request: aiohttp.web.BaseRequest, target: Route, raw: bytes) -> Any:
        """Serve a resource request from the store.

        Returns
        -------
        Any
            The answer's JSON body, or an async iterator of watch events.

        Raises
        ------
        ApiError
            As the store or the API server answers (404 for an unknown resource or
            subresource, 405 for a method the path does not take, 400 for a bad body).

        """
        defn = self.store.resolve(target.group, target.version, target.plural)
        version, ns, name, sub = target.version, target.namespace, target.name, target.subresource
        method = request.method.upper()
        params: Mapping[str, str] = request.query
        admit, warnings = self._admission(), _WARNINGS.get(None)
        if method == "GET" and params.get("watch") in ("true", "1"):
            return self._watch(defn, target, params)
        if name is None:
            if method == "GET":
                return self.store.list(
                    defn,
                    ns,
                    label_selector=params.get("labelSelector"),
                    field_selector=params.get("fieldSelector"),
                    version=version,
                    limit=_limit(params.get("limit")),
                    continue_token=params.get("continue"),
                )
            if method == "POST":
                return self.store.create(
                    defn,
                    ns,
                    _body(raw),
                    version=version,
                    admit=admit,
                    warnings=warnings,
                    dry_run=params.get("dryRun") == "All",
                    field_validation=params.get("fieldValidation"),
                )
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on collections")
        if sub not in (None, "status"):
            raise _not_found()
        if method == "GET":
            return self.store.get(defn, ns, name, version=version)
        if method == "PUT":
            return self.store.replace(
                defn,
                ns,
                name,
                _body(raw),
                subresource=sub,
                version=version,
                admit=admit,
                warnings=warnings,
            )
        if method == "PATCH":
            return self.store.patch(
                defn,
                ns,
                name,
                request.headers.get("Content-Type", ""),
                _body(raw, dict_only=False),
                subresource=sub,
                version=version,
                admit=admit,
                warnings=warnings,
            )
        if method == "DELETE" and sub is None:
            options = _body(raw) if raw else None
            return self.store.delete(defn, ns, name, options, version=version)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _watch(
        self, defn: ResourceDef, target: Route, params: Mapping[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        if target.name is not None:
            raise ApiError(
                405, "MethodNotAllowed", "watch a single object with a metadata.name field selector"
            )
        timeout = params.get("timeoutSeconds")
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        return self.store.watch(
            defn,
            target.namespace,
            resource_version=params.get("resourceVersion"),
            label_selector=params.get("labelSelector"),
            field_selector=params.get("fieldSelector"),
            timeout=float(timeout) if timeout else None,
            version=target.version,
            bookmark=self.bookmark_seconds if bookmarks else None,
        )

    def _admission(self) -> Admit | None:
        """Return the admission checks of the request being served (restricted identities)."""
        requester = _REQUESTER.get(None)
        if requester is None or requester[0].authorizer is None:
            return None
        identity, attributes = requester
        return owner_references_admission(
            identity, attributes, self.access_log, self.store.find_kind
        )


async def _aclose(events: AsyncIterator[dict[str, Any]]) -> None:
    """Close an event stream (an async generator's ``aclose``); closing twice is harmless."""
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


def _limit(value: str | None) -> int | None:
    """Return the ``limit`` query parameter as a number (None when absent or 0).

    Raises
    ------
    ApiError
        400 when it is not a non-negative integer.
    """
    if not value:
        return None
    try:
        limit = int(value)
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid limit {value!r}") from None
    if limit < 0:
        raise ApiError(400, "BadRequest", f"invalid limit {value!r}")
    return limit or None


def _body(raw: bytes, *, dict_only: bool = True) -> Any:
    """Decode a request body (JSON).

    Raises
    ------
    ApiError
        400 when it is not JSON, or (``dict_only``) not a JSON object.

    """
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        raise ApiError(400, "BadRequest", "the request body is not valid JSON") from None
    if dict_only and not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    return body
