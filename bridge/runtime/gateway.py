"""The only module that talks to the Kubernetes API (the official ``kubernetes`` client).

Reads pools, Secrets and Clusters; creates, updates and deletes IPAddresses; patches
pool status; creates control-plane endpoint claims and patches their Clusters. Calls are
synchronous: handlers run in kopf's thread pool. "Not found" is a value (None) for reads; a
write of a claim, an IPAddress or a pool answers a `Write` (written, unchanged, gone,
conflict) that its caller handles case by case. Every other API failure propagates as
``kubernetes.client.ApiException``.
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

import kubernetes
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

from bridge.capi import ADDRESS_FINALIZER, CLUSTER_GROUP, GLOBAL_POOL_KINDS, GROUP, POOL_KINDS
from bridge.runtime.kubeconfig import load_configuration

__all__ = [
    "AccessDeniedError",
    "Kube",
    "NotServedError",
    "OperatorApiClient",
    "Outcome",
    "Write",
    "access_denied",
    "api_client",
    "api_status_message",
]

log = logging.getLogger(__name__)

POOL_VERSION = "v1alpha1"


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
    and the request is not sent. Events are notes, not state, and the Event saying that a
    replica stopped leading is posted after its fence closed.

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
    """

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        timeout: tuple[float, float] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(configuration)
        self.timeout = timeout
        self.fence = fence

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
        if self.fence is not None and method.upper() in WRITE_METHODS and not _is_event(url):
            self.fence()
        timeout = self.timeout if _request_timeout is None else _request_timeout
        return super().call_api(
            method,
            url,
            header_params=header_params,
            body=body,
            post_params=post_params,
            _request_timeout=timeout,
        )


def api_client(
    configuration: kubernetes.client.Configuration | None = None,
    *,
    pool_size: int = 10,
    timeout: tuple[float, float] | None = None,
    fence: Callable[[], None] | None = None,
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
    """
    configuration = configuration or load_configuration()
    configuration.connection_pool_maxsize = max(pool_size, 4)
    return OperatorApiClient(configuration, timeout=timeout, fence=fence)


def _missing(exc: ApiException) -> bool:
    return bool(exc.status == 404)


class Kube:
    """Typed access to the objects the operator reads and writes.

    Parameters
    ----------
    client:
        An ``ApiClient`` (see `api_client`); shared by every worker thread.
    """

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.core = CoreV1Api(client)
        self.custom = CustomObjectsApi(client)
        #: Write-through to the operator's cache (`bridge.runtime.cache`): called with the plural
        #: (``ipaddressclaims``, ``ipaddresses``) and the object as the API server returned
        #: it after each successful write of a claim or an IPAddress.
        self.on_stored: Callable[[str, Mapping[str, Any]], None] | None = None
        #: Called with ``(plural, namespace, name)`` after an IPAddress was deleted.
        self.on_deleted: Callable[[str, str, str], None] | None = None

    def _stored(self, plural: str, body: Any) -> Any:
        """Pass a write's result to `on_stored` (when it is an object); return it unchanged."""
        if self.on_stored is not None and isinstance(body, Mapping):
            self.on_stored(plural, body)
        return body

    def _create(
        self, version: str, plural: str, body: Mapping[str, Any], *, write_through: bool = True
    ) -> Write:
        """Create a namespaced object of our API group.

        With ``write_through`` the stored object goes to `on_stored` (the cache sees our own
        write at once, and the echo of its watch event queues nothing).

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
        namespace = body["metadata"]["namespace"]
        try:
            created = self.custom.create_namespaced_custom_object(
                GROUP, version, namespace, plural, dict(body)
            )
        except ApiException as exc:
            if exc.status == 409:
                return CONFLICT
            raise
        stored = self._stored(plural, created) if write_through else created
        return Write(Outcome.WRITTEN, cast(dict[str, Any], stored))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    # -- discovery ------------------------------------------------------------------

    def preferred_version(self, group: str, plural: str, supported: tuple[str, ...]) -> str:
        """Return the version of ``group/plural`` to use.

        The server's preferred version if we support it, else the first of ``supported``
        that serves ``plural`` (API discovery: ``/apis`` and ``/apis/<group>/<version>``).

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
            resources = self.custom.get_api_resources(group, version).resources or []
            if any(r.name == plural for r in resources):
                return str(version)
        raise NotServedError(
            f"{plural}.{group} is not served in any of the versions {', '.join(supported)}"
        )

    # -- reads ----------------------------------------------------------------------

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """Return a pool object of one of our kinds, or None when it does not exist.

        A Global kind is cluster-scoped: ``namespace`` is ignored (pass ``""``).
        """
        if kind in GLOBAL_POOL_KINDS:
            try:
                return cast(
                    dict[str, Any],
                    self.custom.get_cluster_custom_object(
                        GROUP, POOL_VERSION, POOL_KINDS[kind], name
                    ),
                )
            except ApiException as exc:
                if _missing(exc):
                    return None
                raise
        return self._get(GROUP, POOL_VERSION, namespace, POOL_KINDS[kind], name)

    def _patch_pool(self, pool: Mapping[str, Any], body: Mapping[str, Any]) -> Any:
        """Merge-patch a pool object (namespaced or Global); errors propagate."""
        meta = pool.get("metadata") or {}
        kind = str(pool["kind"])
        if kind in GLOBAL_POOL_KINDS:
            return self.custom.patch_cluster_custom_object(
                GROUP, POOL_VERSION, POOL_KINDS[kind], meta["name"], dict(body)
            )
        return self.custom.patch_namespaced_custom_object(
            GROUP, POOL_VERSION, meta["namespace"], POOL_KINDS[kind], meta["name"], dict(body)
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

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the CAPI ``Cluster`` object, or None when it (or the Cluster CRD) is absent."""
        for version in ("v1beta2", "v1beta1"):
            cluster = self._get(CLUSTER_GROUP, version, namespace, "clusters", name)
            if cluster is not None:
                return cluster
        return None

    def list_clusters(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
        """Return the CAPI ``Cluster`` objects of ``namespaces`` (empty: all namespaces).

        In the first served version of ``v1beta2``, ``v1beta1``; None when Clusters are not
        served at all (a management cluster without CAPI core).
        """
        for version in ("v1beta2", "v1beta1"):
            try:
                if namespaces:
                    results = [
                        cast(
                            dict[str, Any],
                            self.custom.list_namespaced_custom_object(
                                CLUSTER_GROUP, version, ns, "clusters"
                            ),
                        )
                        for ns in namespaces
                    ]
                else:
                    results = [
                        cast(
                            dict[str, Any],
                            self.custom.list_cluster_custom_object(
                                CLUSTER_GROUP, version, "clusters"
                            ),
                        )
                    ]
            except ApiException as exc:
                if _missing(exc):
                    continue
                raise
            items = [dict(item) for result in results for item in result.get("items") or []]
            for item in items:
                item.setdefault("apiVersion", f"{CLUSTER_GROUP}/{version}")
                item.setdefault("kind", "Cluster")
            return items
        return None

    def read_cluster(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the CAPI ``Cluster`` as served in ``version`` (``v1beta2``/``v1beta1``), or None.

        For control-plane endpoints (`control_plane`): one GET in the version detected at
        start-up, so the patch that follows speaks the same schema.
        """
        return self._get(CLUSTER_GROUP, version, namespace, "clusters", name)

    def patch_cluster(
        self, version: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch (RFC 7386) a CAPI ``Cluster``; return it as stored (None when it is gone).

        The caller puts the ``metadata.resourceVersion`` it read into ``patch``: the API server
        then answers 409 Conflict when the Cluster changed since (propagated), so nothing read
        earlier is ever overwritten. Lists in the patch (``spec.topology.variables``) replace
        the stored ones whole: custom resources take no strategic merge.

        Raises
        ------
        kubernetes.client.ApiException
            409 when the resourceVersion is stale; 422 when the Cluster's schema refuses the
            result; any other failure but 404.
        """
        try:
            return cast(
                dict[str, Any],
                self.custom.patch_namespaced_custom_object(
                    CLUSTER_GROUP, version, namespace, "clusters", name, dict(patch)
                ),
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

    def _get(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        """Return a namespaced custom object, or None when it (or its resource) is not found."""
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(group, version, namespace, plural, name),
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

    # -- claims -------------------------------------------------------------------

    def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an ``IPAddressClaim`` as served in ``version``, or None when it does not exist."""
        return self._get(GROUP, version, namespace, "ipaddressclaims", name)

    def list_claims(
        self, version: str, namespaces: tuple[str, ...] = (), *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Return the ``IPAddressClaim`` objects of ``namespaces`` (empty: all namespaces).

        ``limit`` asks the API server for at most that many per namespace (a cheap check
        that the operator may list claims at all).
        """
        extra: dict[str, Any] = {"limit": limit} if limit else {}
        if namespaces:
            results = [
                cast(
                    dict[str, Any],
                    self.custom.list_namespaced_custom_object(
                        GROUP, version, ns, "ipaddressclaims", **extra
                    ),
                )
                for ns in namespaces
            ]
        else:
            results = [
                cast(
                    dict[str, Any],
                    self.custom.list_cluster_custom_object(
                        GROUP, version, "ipaddressclaims", **extra
                    ),
                )
            ]
        return [dict(item) for result in results for item in result.get("items") or []]

    def create_claim(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create an ``IPAddressClaim`` (a control-plane endpoint's).

        Returns `Outcome.WRITTEN` with the claim, or `Outcome.CONFLICT` when the name exists.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 409 AlreadyExists (e.g. 403 in a terminating namespace).
        """
        # Not written through to the cache: the claim's own watch event must queue it.
        return self._create(version, "ipaddressclaims", body, write_through=False)

    def patch_claim_status(
        self, version: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> Write:
        """Merge-patch a claim's status subresource.

        What the served schema does not know is pruned by the API server (e.g.
        ``status.v1beta2`` on CAPI < 1.9): the returned object shows what was kept.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the claim as stored, or `Outcome.GONE` (404).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404.
        """
        try:
            stored = self.custom.patch_namespaced_custom_object_status(
                GROUP, version, namespace, "ipaddressclaims", name, {"status": dict(status)}
            )
        except ApiException as exc:
            if _missing(exc):
                return GONE
            raise
        return Write(Outcome.WRITTEN, cast(dict[str, Any], self._stored("ipaddressclaims", stored)))

    def set_claim_finalizer(self, claim: Mapping[str, Any], finalizer: str, present: bool) -> Write:
        """Add or remove ``finalizer`` on a claim; the outcome as `set_finalizer` gives it."""
        version = str(claim.get("apiVersion") or "").rsplit("/", 1)[-1]
        result = self.set_finalizer(
            claim,
            finalizer,
            present,
            lambda name, namespace, body: self.custom.patch_namespaced_custom_object(
                GROUP, version, namespace, "ipaddressclaims", name, body
            ),
        )
        self._stored("ipaddressclaims", result.obj)
        return result

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
        body = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "finalizers": list(meta.finalizers or []),
                "resourceVersion": meta.resource_version,
            }
        }
        if (
            present
            and meta.deletion_timestamp is not None
            and finalizer not in (meta.finalizers or [])
        ):
            return True
        written = self.set_finalizer(
            body,
            finalizer,
            present,
            # A merge patch (RFC 7386) replaces the list; the client's default for built-in
            # kinds is a strategic merge patch, which merges ObjectMeta.finalizers
            # (patchStrategy "merge") and so could never remove one.
            lambda n, ns, patch: self.core.patch_namespaced_secret(
                n, ns, patch, _content_type="application/merge-patch+json"
            ),
        )
        if written.outcome is Outcome.CONFLICT:
            raise ApiException(status=409, reason="Conflict")
        return written.outcome is not Outcome.GONE

    @staticmethod
    def set_finalizer(
        obj: Mapping[str, Any],
        finalizer: str,
        present: bool,
        patch: Any,
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
        patch:
            ``patch(name, namespace, body)``: the client call that merge-patches the object.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the object as the patch returned it; `Outcome.UNCHANGED`
            when nothing had to change (no request); `Outcome.GONE` on 404;
            `Outcome.CONFLICT` on 409 (a stale resourceVersion).

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 404 and 409.
        """
        meta = obj.get("metadata") or {}
        current = list(meta.get("finalizers") or [])
        wanted = [f for f in current if f != finalizer] + ([finalizer] if present else [])
        if wanted == current:
            return UNCHANGED
        try:
            result = patch(
                meta["name"],
                meta.get("namespace"),
                {
                    "metadata": {
                        "finalizers": wanted,
                        "resourceVersion": meta.get("resourceVersion"),
                    }
                },
            )
        except ApiException as exc:
            if _missing(exc):
                return GONE
            if exc.status == 409:
                return CONFLICT
            raise
        return Write(Outcome.WRITTEN, result if isinstance(result, dict) else None)

    # -- IPAddresses --------------------------------------------------------------

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an ``IPAddress``, or None when it does not exist."""
        return self._get(GROUP, version, namespace, "ipaddresses", name)

    def create_ip_address(self, version: str, body: Mapping[str, Any]) -> Write:
        """Create an ``IPAddress``.

        Returns
        -------
        Write
            `Outcome.WRITTEN` with the stored IPAddress; on 409 AlreadyExists the one of that
            name is read: `Outcome.CONFLICT` with it (None when it was deleted meanwhile), so
            the caller can tell its own from a foreign one.

        Raises
        ------
        kubernetes.client.ApiException
            Any failure but 409 of the create, any failure but 404 of the read.
        """
        created = self._create(version, "ipaddresses", body)
        if created.outcome is not Outcome.CONFLICT:
            return created
        meta = body["metadata"]
        return Write(
            Outcome.CONFLICT, self.get_ip_address(version, meta["namespace"], meta["name"])
        )

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        """Return every ``IPAddress`` of a namespace (None: of all namespaces)."""
        if namespace is None:
            result = cast(
                dict[str, Any],
                self.custom.list_cluster_custom_object(GROUP, version, "ipaddresses"),
            )
        else:
            result = cast(
                dict[str, Any],
                self.custom.list_namespaced_custom_object(GROUP, version, namespace, "ipaddresses"),
            )
        return list(result.get("items") or [])

    def delete_ip_address(
        self,
        version: str,
        namespace: str,
        name: str,
        current: Mapping[str, Any] | None = None,
    ) -> Write:
        """Remove our ``ProtectAddress`` finalizer from an ``IPAddress`` and delete it.

        The finalizer goes first (the contract: an IPAddress must not outlive its claim's
        finalizer); a missing object is success. The finalizer list is written with the
        object's resourceVersion, so a concurrent change makes the API answer 409.

        Parameters
        ----------
        current:
            The IPAddress as last seen (``metadata.finalizers`` and ``resourceVersion``, e.g.
            from the operator's cache): no read is sent. When it is stale (409 Conflict), or
            not given, the object is read once and the write tried again with what was read.

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
                return self._delete_ip_address(version, namespace, name, current)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        current = self.get_ip_address(version, namespace, name)
        if current is None:
            self._gone("ipaddresses", namespace, name)
            return GONE
        try:
            return self._delete_ip_address(version, namespace, name, current)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return CONFLICT

    def _delete_ip_address(
        self, version: str, namespace: str, name: str, current: Mapping[str, Any]
    ) -> Write:
        meta = current.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if ADDRESS_FINALIZER in finalizers:
            finalizers.remove(ADDRESS_FINALIZER)
            try:
                self.custom.patch_namespaced_custom_object(
                    GROUP,
                    version,
                    namespace,
                    "ipaddresses",
                    name,
                    {
                        "metadata": {
                            "finalizers": finalizers,
                            "resourceVersion": meta.get("resourceVersion"),
                        }
                    },
                )
            except ApiException as exc:
                if _missing(exc):
                    self._gone("ipaddresses", namespace, name)
                    return GONE
                raise
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, version, namespace, "ipaddresses", name
            )
        except ApiException as exc:
            if not _missing(exc):
                raise
            self._gone("ipaddresses", namespace, name)
            return GONE
        self._gone("ipaddresses", namespace, name)
        return Write(Outcome.WRITTEN)

    def _gone(self, plural: str, namespace: str, name: str) -> None:
        if self.on_deleted is not None:
            self.on_deleted(plural, namespace, name)

    # -- pools ----------------------------------------------------------------------

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return every pool of ``kind`` in ``namespaces`` (empty: all namespaces).

        A Global kind is cluster-scoped: all of them, whatever ``namespaces``. Lists from the
        API are ``kind``-less; each item gets its ``kind`` back.
        """
        plural = POOL_KINDS[kind]
        if namespaces and kind not in GLOBAL_POOL_KINDS:
            results = [
                cast(
                    dict[str, Any],
                    self.custom.list_namespaced_custom_object(GROUP, POOL_VERSION, ns, plural),
                )
                for ns in namespaces
            ]
        else:
            results = [
                cast(
                    dict[str, Any],
                    self.custom.list_cluster_custom_object(GROUP, POOL_VERSION, plural),
                )
            ]
        items = [dict(item) for result in results for item in result.get("items") or []]
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", f"{GROUP}/{POOL_VERSION}")
        return items

    def set_pool_finalizer(self, pool: Mapping[str, Any], finalizer: str, present: bool) -> Write:
        """Add or remove ``finalizer`` on a pool, guarded by its resourceVersion.

        Namespaced and Global (cluster-scoped) kinds alike; the outcome as `set_finalizer`
        gives it (a stale resourceVersion is `Outcome.CONFLICT`, a missing pool
        `Outcome.GONE`).
        """
        return self.set_finalizer(
            pool, finalizer, present, lambda _name, _namespace, body: self._patch_pool(pool, body)
        )

    def annotate_pool(self, pool: Mapping[str, Any], key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation of a pool; a missing pool is ignored."""
        meta = pool.get("metadata") or {}
        if (meta.get("annotations") or {}).get(key) == value:
            return
        try:
            self._patch_pool(pool, {"metadata": {"annotations": {key: value}}})
        except ApiException as exc:
            if not _missing(exc):
                raise

    def patch_pool_status(
        self,
        namespace: str,
        kind: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> None:
        """Merge-patch a pool's status subresource (a missing pool is ignored).

        A Global kind is cluster-scoped: ``namespace`` is ignored. With
        ``resource_version`` the patch carries ``metadata.resourceVersion``: the API server
        applies it only to that version of the pool and answers 409 Conflict otherwise
        (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts). A writer
        of a list (``status.conditions``: a merge patch replaces lists whole) passes the
        version it merged into, so a condition written by another writer since is never
        dropped.

        Raises
        ------
        kubernetes.client.ApiException
            409 when ``resource_version`` is given and the pool changed since; any other
            failure but 404.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            if kind in GLOBAL_POOL_KINDS:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, POOL_VERSION, POOL_KINDS[kind], name, body
                )
                return
            self.custom.patch_namespaced_custom_object_status(
                GROUP, POOL_VERSION, namespace, POOL_KINDS[kind], name, body
            )
        except ApiException as exc:
            if not _missing(exc):
                raise

    def patch_pool_conditions(
        self, pool: Mapping[str, Any], conditions: Sequence[Mapping[str, Any]]
    ) -> None:
        """Write a pool's ``status.conditions`` whole, guarded by the resourceVersion read.

        For a writer that owns one condition type among others (the drift audit's
        ``InSync``): it reads the pool, merges its condition into the list and writes the
        list back with ``metadata.resourceVersion`` (a merge patch replaces lists whole), so
        a status written by someone else since makes the API answer 409 Conflict instead of
        being overwritten. A missing pool is ignored. Namespaced and Global kinds alike.

        Parameters
        ----------
        pool:
            The pool as read (``kind``, ``metadata.name``, ``namespace``,
            ``resourceVersion``).
        conditions:
            The whole new list of conditions.

        Raises
        ------
        kubernetes.client.ApiException
            409 when the pool changed since it was read; any other failure but 404.
        """
        meta = pool.get("metadata") or {}
        kind = str(pool["kind"])
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"conditions": [dict(c) for c in conditions]},
        }
        try:
            if kind in GLOBAL_POOL_KINDS:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, POOL_VERSION, POOL_KINDS[kind], meta["name"], body
                )
            else:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, POOL_VERSION, meta["namespace"], POOL_KINDS[kind], meta["name"], body
                )
        except ApiException as exc:
            if not _missing(exc):
                raise

    # -- events ---------------------------------------------------------------------

    def post_event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Create a core/v1 Event about ``obj`` (for code running outside kopf handlers).

        Raises
        ------
        kubernetes.client.ApiException
            When the API refuses the Event.
        """
        meta = obj.get("metadata") or {}
        # Events about a cluster-scoped object (a Global pool) live in "default", as
        # client-go's recorder puts them.
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
