"""Authentication, authorization and the access log of the in-memory Kubernetes API.

An :class:`Identity` is a user with a bearer token and an :class:`Authorizer` (``None``: the
unrestricted admin, like ``system:masters``). Every request is mapped to the attributes the
API server authorizes (:func:`request_attributes`, after
https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go),
decided, and written to an :class:`AccessLog`; refusals carry the API server's messages
(https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go).
:func:`owner_references_admission` is the OwnerReferencesPermissionEnforcement admission
plugin (https://github.com/kubernetes/kubernetes/blob/master/plugin/pkg/admission/gc/gc_admission.go).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from mock_kubernetes.resources import ResourceDef
from mock_kubernetes.store import Admit, ApiError

__all__ = [
    "DISCOVERY_PATHS",
    "AccessLog",
    "AccessRecord",
    "Authorizer",
    "Identity",
    "RequestAttributes",
    "User",
    "forbidden",
    "owner_references_admission",
    "request_attributes",
    "service_account_user",
]

#: Non-resource paths every authenticated identity may read: the bootstrap ClusterRoles
#: ``system:discovery`` and ``system:public-info-viewer``, bound to ``system:authenticated``.
DISCOVERY_PATHS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
)

# requestinfo.go: verbs that are URL parts, subresources of namespaces.
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# strconv.ParseBool, which decodes the ``watch`` query parameter.
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})


@dataclasses.dataclass(frozen=True)
class User:
    """An authenticated user (``user.Info``).

    Parameters
    ----------
    name : str
        The user name, e.g. ``system:serviceaccount:ipam-bridge-system:ipam-bridge-manager``.
    groups : tuple of str
        Its groups (``system:authenticated`` is implied by being authenticated).

    """

    name: str
    groups: tuple[str, ...] = ("system:authenticated",)


def service_account_user(namespace: str, name: str) -> User:
    """Return the user a ServiceAccount token authenticates as.

    Parameters
    ----------
    namespace, name : str
        The ServiceAccount.

    Returns
    -------
    User
        ``system:serviceaccount:<namespace>:<name>`` in the groups ``system:serviceaccounts``,
        ``system:serviceaccounts:<namespace>`` and ``system:authenticated`` (as
        ``k8s.io/apiserver/pkg/authentication/serviceaccount`` builds it).

    """
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


@dataclasses.dataclass(frozen=True)
class RequestAttributes:
    """What the API server authorizes a request by (``authorizer.Attributes``).

    Attributes
    ----------
    verb : str
        ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
        ``deletecollection`` for resource requests; the lower-case HTTP method otherwise.
    path : str
        The URL path.
    resource_request : bool
        Whether the path names a resource (else: discovery, ``/version``, ``/healthz``...).
    api_group, api_version, resource, subresource, namespace, name : str
        The resource request's parts (empty when absent; ``namespace`` empty for
        cluster-scoped requests and for lists across all namespaces).

    """

    verb: str
    path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_path(self) -> str:
        """``<resource>`` or ``<resource>/<subresource>``, as RBAC rules name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(
    method: str, path: str, query: Mapping[str, str] | None = None
) -> RequestAttributes:
    """Map an HTTP request to its authorization attributes as the API server does.

    Parameters
    ----------
    method : str
        HTTP method.
    path : str
        URL path, e.g. ``/apis/ipam.cluster.x-k8s.io/v1beta2/namespaces/x/ipaddressclaims``.
    query : mapping of str to str, optional
        Query parameters (``watch``, ``fieldSelector`` matter).

    Returns
    -------
    RequestAttributes
        A GET without a name is ``list``, or ``watch`` with ``watch=true``; a
        ``fieldSelector`` ``metadata.name=<n>`` names the object of a list or watch; a DELETE
        without a name is ``deletecollection``; ``/api/v1/namespaces/<n>`` is in namespace
        ``<n>``.

    Notes
    -----
    Source: ``NewRequestInfo`` of
    https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go,
    with the prefixes ``api`` (the core group) and ``apis``.

    """
    query = query or {}
    verb = method.lower()
    parts = [p for p in path.strip("/").split("/") if p]
    non_resource = RequestAttributes(verb=verb, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return non_resource
        verb, parts = parts[0], parts[1:]
    else:
        verb = _METHOD_VERBS.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "") in _TRUE else "list"
        for term in (query.get("fieldSelector") or "").split(","):
            field, op, value = term.partition("==") if "==" in term else term.partition("=")
            if op and field.strip() == "metadata.name" and "!" not in field:
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(
        verb=verb,
        path=path,
        resource_request=True,
        api_group=group,
        api_version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )


class Authorizer(Protocol):
    """Decides whether a user may do what a request asks (``authorizer.Authorizer``)."""

    def authorize(self, user: User, attributes: RequestAttributes) -> tuple[bool, str]:
        """Return ``(allowed, reason)``; the reason (may be empty) ends a refusal's message."""
        ...


def _default_token() -> str:
    return secrets.token_urlsafe(24)


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a bearer token authenticates as, and what it may do.

    Parameters
    ----------
    user : User
        The authenticated user.
    authorizer : Authorizer or None
        Its permissions; ``None`` for an unrestricted identity (the tests' admin).
    token : str
        The bearer token (random by default).

    """

    user: User
    authorizer: Authorizer | None = None
    token: str = dataclasses.field(default_factory=_default_token, repr=False)

    @property
    def name(self) -> str:
        """The user name."""
        return self.user.name

    def authorize(self, attributes: RequestAttributes) -> tuple[bool, str]:
        """Decide ``attributes`` for this identity (discovery paths are always allowed).

        Returns
        -------
        tuple of (bool, str)
            Allowed, and the authorizer's reason.

        """
        if self.authorizer is None:
            return True, ""
        if not attributes.resource_request and _matches_path(DISCOVERY_PATHS, attributes.path):
            return True, ""
        return self.authorizer.authorize(self.user, attributes)


def _matches_path(patterns: Iterable[str], path: str) -> bool:
    return any(
        p == "*" or p == path or (p.endswith("*") and path.startswith(p.rstrip("*")))
        for p in patterns
    )


@dataclasses.dataclass(frozen=True)
class AccessRecord:
    """One authorization decision of the emulator.

    Attributes
    ----------
    user : str
        The user name.
    verb, group, resource, subresource, namespace, name : str
        As in :class:`RequestAttributes` (``resource`` empty for non-resource requests).
    path : str
        The URL path (empty for admission checks).
    allowed : bool
        The decision.
    via : str
        ``"request"`` for the request itself, ``"OwnerReferencesPermissionEnforcement"`` for
        a check that admission plugin made on the request's behalf.

    """

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str
    allowed: bool
    via: str = "request"

    @property
    def resource_path(self) -> str:
        """``<resource>`` or ``<resource>/<subresource>``."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class AccessLog:
    """Every authorization decision of an emulator, for tests to read (thread-safe).

    Examples
    --------
    >>> kube.access_log.permissions(user)  # doctest: +SKIP
    {('ipam.cluster.x-k8s.io', 'ipaddressclaims', 'list'), ...}

    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[AccessRecord] = []

    def record(
        self, user: User, attributes: RequestAttributes, allowed: bool, via: str = "request"
    ) -> AccessRecord:
        """Append one decision and return its record."""
        entry = AccessRecord(
            user=user.name,
            verb=attributes.verb,
            group=attributes.api_group,
            resource=attributes.resource,
            subresource=attributes.subresource,
            namespace=attributes.namespace,
            name=attributes.name,
            path=attributes.path,
            allowed=allowed,
            via=via,
        )
        with self._lock:
            self._records.append(entry)
        return entry

    def records(
        self, user: str | User | Identity | None = None, *, allowed: bool | None = None
    ) -> list[AccessRecord]:
        """Return the decisions so far, oldest first.

        Parameters
        ----------
        user : str or User or Identity, optional
            Only this user's.
        allowed : bool, optional
            Only the allowed (``True``) or the denied (``False``) ones.

        """
        name = user.name if isinstance(user, (User, Identity)) else user
        with self._lock:
            found = list(self._records)
        return [
            r
            for r in found
            if (name is None or r.user == name) and (allowed is None or r.allowed == allowed)
        ]

    def permissions(
        self, user: str | User | Identity, *, allowed: bool | None = None
    ) -> set[tuple[str, str, str]]:
        """Return the ``(group, resource[/subresource], verb)`` triples a user needed.

        Resource requests and admission checks count; discovery and other non-resource
        requests do not. Compare with the rules of an RBAC role to find what is missing
        (``allowed=False``) or granted but never used.
        """
        return {
            (r.group, r.resource_path, r.verb)
            for r in self.records(user, allowed=allowed)
            if r.resource
        }

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()


def forbidden(user: User, attributes: RequestAttributes, reason: str = "") -> ApiError:
    """Return the ``403 Forbidden`` the API server answers a refused request with.

    Source: ``responsewriters.Forbidden`` and ``forbiddenMessage``: for example
    ``ipaddresses.ipam.cluster.x-k8s.io "m1" is forbidden: User "system:serviceaccount:ns:sa"
    cannot delete resource "ipaddresses" in API group "ipam.cluster.x-k8s.io" in the
    namespace "test"``.
    """
    if not attributes.resource_request:
        message = f'User "{user.name}" cannot {attributes.verb} path "{attributes.path}"'
        return ApiError(403, "Forbidden", f"forbidden: {message}{_reason(reason)}")
    scope = (
        f'in the namespace "{attributes.namespace}"'
        if attributes.namespace
        else "at the cluster scope"
    )
    message = (
        f'User "{user.name}" cannot {attributes.verb} resource "{attributes.resource_path}"'
        f' in API group "{attributes.api_group}" {scope}'
    )
    return ApiError(
        403,
        "Forbidden",
        f"{_subject(attributes.api_group, attributes.resource, attributes.name)}"
        f" is forbidden: {message}{_reason(reason)}",
    )


def _reason(reason: str) -> str:
    return f": {reason}" if reason else ""


def _subject(group: str, resource: str, name: str) -> str:
    """``<resource>.<group> "<name>"`` as ``apierrors.NewForbidden`` names its object."""
    qualified = f"{resource}.{group}" if group else resource
    return f'{qualified} "{name}"' if name else qualified


def _blocking_uids(obj: Mapping[str, Any] | None) -> set[str]:
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return {str(r.get("uid")) for r in refs if r.get("blockOwnerDeletion") is True}


def owner_references_admission(
    identity: Identity,
    attributes: RequestAttributes,
    log: AccessLog,
    find_kind: Callable[[str, str], ResourceDef],
) -> Admit:
    """Return the OwnerReferencesPermissionEnforcement check of one request.

    Parameters
    ----------
    identity : Identity
        Who makes the request.
    attributes : RequestAttributes
        The request (its namespace, resource, subresource and name).
    log : AccessLog
        Where the checks made on the request's behalf are recorded.
    find_kind : callable
        ``find_kind(apiVersion, kind) -> ResourceDef`` (the REST mapping of an owner
        reference); raises :class:`ApiError` when nothing serves it.

    Returns
    -------
    Admit
        For the store: on an update that changes ``ownerReferences`` the identity needs
        ``delete`` on the object itself; on a create or update that adds an owner reference
        with ``blockOwnerDeletion: true`` it needs ``update`` on the owner's ``finalizers``
        subresource (in the dependent's namespace for a namespaced owner). Refusals are
        ``403 Forbidden`` with the plugin's messages.

    Notes
    -----
    Source: ``Validate`` and ``ownerRefToDeleteAttributeRecords`` of
    https://github.com/kubernetes/kubernetes/blob/master/plugin/pkg/admission/gc/gc_admission.go;
    the ``: , <nil>`` ending of its messages is the RBAC authorizer's empty reason and nil
    error, as a real API server prints them.

    """

    def admit(
        defn: ResourceDef, operation: str, new: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        if identity.authorizer is None:
            return
        new_refs = (new.get("metadata") or {}).get("ownerReferences") or []
        old_refs = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        changing = bool(new_refs) if old is None else new_refs != old_refs
        if not changing:
            return
        name = attributes.name or str((new.get("metadata") or {}).get("name") or "")
        subject = _subject(defn.group, defn.plural, name)
        if operation != "CREATE":
            check = dataclasses.replace(attributes, verb="delete", name=name, path="")
            allowed, reason = identity.authorize(check)
            log.record(identity.user, check, allowed, "OwnerReferencesPermissionEnforcement")
            if not allowed:
                raise ApiError(
                    403,
                    "Forbidden",
                    f"{subject} is forbidden: cannot set an ownerRef on a resource you can't"
                    f" delete: {reason}, <nil>",
                )
        added = _blocking_uids(new) - _blocking_uids(old)
        for ref in new_refs:
            if str(ref.get("uid")) not in added:
                continue
            try:
                owner = find_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
            except ApiError as e:
                raise ApiError(
                    403,
                    "Forbidden",
                    f"{subject} is forbidden: cannot set blockOwnerDeletion in this case because"
                    f" cannot find RESTMapping for APIVersion {ref.get('apiVersion')} Kind"
                    f" {ref.get('kind')}: {e.message}",
                ) from None
            check = RequestAttributes(
                verb="update",
                path="",
                resource_request=True,
                api_group=owner.group,
                api_version=owner.preferred_version,
                resource=owner.plural,
                subresource="finalizers",
                namespace=attributes.namespace if owner.namespaced else "",
                name=str(ref.get("name", "")),
            )
            allowed, reason = identity.authorize(check)
            log.record(identity.user, check, allowed, "OwnerReferencesPermissionEnforcement")
            if not allowed:
                raise ApiError(
                    403,
                    "Forbidden",
                    f"{subject} is forbidden: cannot set blockOwnerDeletion if an ownerReference"
                    f" refers to a resource you can't set finalizers on: {reason}, <nil>",
                )

    return admit
