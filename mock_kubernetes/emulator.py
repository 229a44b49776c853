"""The HTTP face of the in-memory Kubernetes API: a kmock 0.8 handler serving an ObjectStore."""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import parsing as _kmock_parsing

from mock_kubernetes.auth import (
    AccessLog,
    Identity,
    RequestAttributes,
    User,
    forbidden,
    owner_references_admission,
    request_attributes,
)
from mock_kubernetes.partition import Partition
from mock_kubernetes.resources import ResourceDef
from mock_kubernetes.store import Admit, ApiError, ObjectStore

__all__ = ["KubeEmulator"]

# kmock 0.8's URL parser fails on `/api/v1/namespaces[/<name>[/status|/finalize]]` (it reads
# "namespaces" as the namespace prefix of a namespaced resource and raises ValueError, i.e. 500).
# Its Request parsing calls `parsing.parse_path` through the module, so wrapping that one
# function is the only way in; every other path goes to the original parser unchanged.
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+)(?:/(status|finalize))?)?/?")
_original_parse_path = _kmock_parsing.parse_path


def _parse_path(path: str) -> Any:
    match = _NAMESPACE_PATH.fullmatch(path)
    if match is None:
        return _original_parse_path(path)
    return _kmock_parsing.ParsedPath(
        group="",
        version="v1",
        plural="namespaces",
        namespace=None,
        name=match.group(1),
        subresource=match.group(2),
    )


_KUBE_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def kube_version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of API versions by Kubernetes priority: ``v2 < v1 < v1beta2 < v1beta1 < v1alpha1``.

    Versions that do not look like Kubernetes versions come last, alphabetically.
    """
    match = _KUBE_VERSION.fullmatch(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = int(match.group(1)), match.group(2), int(match.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, version)


_parse_path.__wrapped__ = _original_parse_path  # type: ignore[attr-defined]
if not hasattr(_kmock_parsing.parse_path, "__wrapped__"):
    _kmock_parsing.parse_path = _parse_path


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


def _is_resource_request(request: kmock.Request) -> bool:
    return request.resource is not None and bool(request.resource.plural)


def _is_create_request(request: kmock.Request) -> bool:
    return _is_resource_request(request) and request.name is None and request.method == "POST"


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """A kmock handler that serves an :class:`ObjectStore` with Kubernetes API semantics.

    Discovery (``/api``, ``/apis``, group and group/version lists) describes the store's
    declared resources; every request on a resource path is served from the store. kmock's DSL
    still works for fault injection and has priority, e.g. ``emulator['get /api/v1'] << 500``.

    Parameters
    ----------
    store : ObjectStore
        The objects and their semantics (created when omitted).
    history_size : int
        How many recent requests kmock keeps for assertions (``emulator.requests``-style
        views); kmock matches each request against its whole history, so it is kept short.
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

    Notes
    -----
    Extends ``kmock.KubernetesScaffold`` (the stateless part of kmock's Kubernetes support:
    error rendering as ``v1 Status``, the DSL, streaming) rather than
    ``kmock.KubernetesEmulator``, whose merge-everything object store would be bypassed
    entirely. Reaches into kmock 0.8 internals (hence the exact pin) at these places only:

    - the module-level ``parse_path`` wrapper above (namespaces URLs);
    - the scaffold's discovery methods ``_serve_root/_api/_apis/_group/_version``, overridden
      to describe the store's resources with their preferred (storage) version;
    - ``_requests`` of the root and of its reactions (``_payloads``), trimmed to the last
      ``history_size`` requests: kmock checks each request against its whole history, which
      made 200 objects take minutes;
    - ``_errors`` (the accumulated server-side errors, trimmed the same way).

    Authentication and authorization run first, before kmock sees the request (kmock's DSL
    reactions, fault injection included, apply to authorized requests only). See
    ``mock_kubernetes/README.md`` for what is emulated and what is not.

    """

    store: ObjectStore = attrs.field(factory=ObjectStore)
    history_size: int = 4
    admin: Identity = attrs.field(factory=_admin)
    identities: dict[str, Identity] = attrs.field(factory=dict)
    require_token: bool = False
    access_log: AccessLog = attrs.field(factory=AccessLog)
    latency: dict[str, float] = attrs.field(factory=dict)
    partition: Partition = attrs.field(factory=Partition)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.identities[self.admin.token] = self.admin
        # The API answers a successful create with 201 Created (the kubernetes client's
        # create_* methods deserialize only a 201); errors carry their own status.
        # A sub-priority above kmock's own fallbacks (discovery, 404): resource requests are the
        # bulk of the traffic, so they are matched first; user reactions still come before.
        fallback = self.fallback**1
        fallback[_is_create_request] << 201 << self._serve_resource
        fallback[_is_resource_request] << self._serve_resource
        # The kubernetes client's discovery calls (ApisApi, CoreApi) ask for "/apis/" and
        # "/api/" with a trailing slash, which the real API server answers like "/apis".
        fallback["get /apis/"] << self._serve_apis
        fallback["get /api/"] << self._serve_api

    async def __call__(self, raw_request: Any) -> Any:
        """Serve one aiohttp request (the entry point of the aiohttp ``web.Server``)."""
        limit = self.history_size
        if len(self._requests) > 2 * limit:
            del self._requests[:-limit]
            for payload in self._payloads:
                del payload._requests[:-limit]
            if self._errors:
                del self.errors[:-limit]
        attributes = request_attributes(raw_request.method, raw_request.path, raw_request.query)
        identity = self.authenticate(raw_request.headers.get("Authorization"))
        if identity is None:
            return _status_response(ApiError(401, "Unauthorized", "Unauthorized"), attributes)
        await self.partition.admit(identity, raw_request)
        allowed, reason = identity.authorize(attributes)
        self.access_log.record(identity.user, attributes, allowed)
        if not allowed:
            return _status_response(forbidden(identity.user, attributes, reason), attributes)
        delay = self.latency.get(attributes.verb, 0.0) if attributes.verb != "watch" else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        warnings: list[str] = []
        token = _WARNINGS.set(warnings)
        requester = _REQUESTER.set((identity, attributes))
        try:
            response = await super().__call__(raw_request)
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

    async def _serve_root(self, request: kmock.Request) -> dict[str, Any]:
        paths = {"/api", "/api/v1", "/apis", "/version"}
        for group, defs in self._groups().items():
            if group:
                paths.add(f"/apis/{group}")
                paths.update(f"/apis/{group}/{v}" for d in defs for v in d.versions)
        return {"paths": sorted(paths)}

    async def _serve_api(self, request: kmock.Request) -> dict[str, Any]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}

    async def _serve_apis(self, request: kmock.Request) -> dict[str, Any]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group_entry(g, d) for g, d in sorted(self._groups().items()) if g],
        }

    async def _serve_group(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        defs = self._groups().get(request.resource.group or "")
        if not defs or not request.resource.group:
            raise kmock.KubernetesResourceNotFoundError()
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            **self._group_entry(request.resource.group, defs),
        }

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        group, version = request.resource.group or "", request.resource.version or ""
        defs = [d for d in self._groups().get(group, []) if version in d.versions]
        if not defs and group:
            raise kmock.KubernetesResourceNotFoundError()
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for d in defs for entry in d.discovery()],
        }

    # -- resources ------------------------------------------------------------------------------

    async def _serve_resource(self, request: kmock.Request) -> Any:
        try:
            return self._dispatch(request)
        except ApiError as e:
            resource = request.resource
            details = e.details or {  # 422 Invalid brings its own (kind, causes)
                "name": request.name or "",
                "group": resource.group if resource else "",
                "kind": resource.plural if resource else "",
            }
            raise kmock.KubernetesError(
                status=e.status, reason=e.reason, message=e.message, details=details
            ) from None

    def _dispatch(self, request: kmock.Request) -> Any:
        resource = request.resource
        assert resource is not None and resource.plural is not None
        defn = self.store.resolve(resource.group or "", resource.version, resource.plural)
        version, ns, name = resource.version, request.namespace, request.name
        sub = request.subresource
        method = str(request.method.value).upper()
        params = request.params
        warnings = _WARNINGS.get(None)
        admit = self._admission()
        if method == "GET" and params.get("watch") in ("true", "1"):
            if name is not None:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "watch a single object with a metadata.name field selector",
                )
            timeout = params.get("timeoutSeconds")
            return self._watch_stream(
                self.store.watch(
                    defn,
                    ns,
                    resource_version=params.get("resourceVersion"),
                    label_selector=params.get("labelSelector"),
                    field_selector=params.get("fieldSelector"),
                    timeout=float(timeout) if timeout else None,
                    version=version,
                )
            )
        if name is None:
            if method == "GET":
                return self.store.list(
                    defn,
                    ns,
                    label_selector=params.get("labelSelector"),
                    field_selector=params.get("fieldSelector"),
                    version=version,
                )
            if method == "POST":
                return self.store.create(
                    defn,
                    ns,
                    self._body(request),
                    version=version,
                    admit=admit,
                    warnings=warnings,
                    dry_run=params.get("dryRun") == "All",
                    field_validation=params.get("fieldValidation"),
                )
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on collections")
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            return self.store.get(defn, ns, name, version=version)
        if method == "PUT":
            return self.store.replace(
                defn,
                ns,
                name,
                self._body(request),
                subresource=sub,
                version=version,
                admit=admit,
                warnings=warnings,
            )
        if method == "PATCH":
            ctype = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
            return self.store.patch(
                defn,
                ns,
                name,
                ctype,
                self._body(request, dict_only=False),
                subresource=sub,
                version=version,
                admit=admit,
                warnings=warnings,
            )
        if method == "DELETE" and sub is None:
            options = self._body(request) if request.body else None
            return self.store.delete(defn, ns, name, options, version=version)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _admission(self) -> Admit | None:
        """Return the admission checks of the request being served (restricted identities)."""
        requester = _REQUESTER.get(None)
        if requester is None or requester[0].authorizer is None:
            return None
        identity, attributes = requester
        return owner_references_admission(
            identity, attributes, self.access_log, self.store.find_kind
        )

    @staticmethod
    def _body(request: kmock.Request, *, dict_only: bool = True) -> Any:
        try:
            body = json.loads(request.body or b"null")
        except ValueError:
            raise ApiError(400, "BadRequest", "the request body is not valid JSON") from None
        if dict_only and not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        return body

    @staticmethod
    async def _watch_stream(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[Any]:
        yield b""  # send the headers now: a watch may stay silent for a long time
        async for event in events:
            yield event
