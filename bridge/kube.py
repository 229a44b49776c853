"""The only module that talks to the Kubernetes API (the official ``kubernetes`` client).

Reads pools, Secrets and Clusters; creates, updates and deletes IPAddresses; patches
pool status. Calls are synchronous: handlers run in kopf's thread pool. "Not found" is a
value (None), every other API failure propagates as ``kubernetes.client.ApiException``.
"""

from __future__ import annotations

import base64
import datetime
import os
from collections.abc import Mapping
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

from bridge.capi import ADDRESS_FINALIZER, CLUSTER_GROUP, GROUP, POOL_KINDS

__all__ = ["Kube", "NotServedError", "api_client", "in_cluster", "load_configuration"]

POOL_VERSION = "v1alpha1"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class NotServedError(RuntimeError):
    """The API server does not serve a resource the operator needs (e.g. no CAPI CRDs)."""


def in_cluster() -> bool:
    """Return True when running in a pod with a service account and no explicit kubeconfig."""
    return "KUBECONFIG" not in os.environ and bool(os.path.exists(SERVICE_ACCOUNT_TOKEN))


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """Return the client configuration of the current cluster.

    Parameters
    ----------
    kubeconfig:
        A kubeconfig file; None reads ``$KUBECONFIG`` *now* (the kubernetes package reads it
        only at import time), else the in-cluster service account, else ``~/.kube/config``.
    """
    configuration = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        kubernetes.config.load_kube_config(
            config_file=path.split(os.pathsep)[0], client_configuration=configuration
        )
    elif in_cluster():
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


def api_client(
    configuration: kubernetes.client.Configuration | None = None, *, pool_size: int = 10
) -> ApiClient:
    """Return an ``ApiClient`` on ``configuration`` (default: `load_configuration()`).

    Parameters
    ----------
    pool_size:
        HTTP connections kept per host (one per concurrent worker thread).
    """
    configuration = configuration or load_configuration()
    configuration.connection_pool_maxsize = max(pool_size, 4)
    return ApiClient(configuration)


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
        """Return a pool object of one of our kinds, or None when it does not exist."""
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, POOL_VERSION, namespace, POOL_KINDS[kind], name
                ),
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

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
            try:
                return cast(
                    dict[str, Any],
                    self.custom.get_namespaced_custom_object(
                        CLUSTER_GROUP, version, namespace, "clusters", name
                    ),
                )
            except ApiException as exc:
                if not _missing(exc):
                    raise
        return None

    # -- IPAddresses --------------------------------------------------------------

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return an ``IPAddress``, or None when it does not exist."""
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, version, namespace, "ipaddresses", name
                ),
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

    def create_ip_address(self, version: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create an ``IPAddress``; return it, or None when one of that name already exists."""
        namespace = body["metadata"]["namespace"]
        try:
            return cast(
                dict[str, Any],
                self.custom.create_namespaced_custom_object(
                    GROUP, version, namespace, "ipaddresses", dict(body)
                ),
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise

    def list_ip_addresses(self, version: str, namespace: str) -> list[dict[str, Any]]:
        """Return every ``IPAddress`` of a namespace."""
        result = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GROUP, version, namespace, "ipaddresses"),
        )
        return list(result.get("items") or [])

    def delete_ip_address(self, version: str, namespace: str, name: str) -> None:
        """Remove our ``ProtectAddress`` finalizer from an ``IPAddress`` and delete it.

        The finalizer goes first (the contract: an IPAddress must not outlive its claim's
        finalizer); a missing object is success. The finalizer list is written with the
        object's resourceVersion, so a concurrent change makes the API answer 409, which
        propagates (kopf retries).
        """
        current = self.get_ip_address(version, namespace, name)
        if current is None:
            return
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
                    return
                raise
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, version, namespace, "ipaddresses", name
            )
        except ApiException as exc:
            if not _missing(exc):
                raise

    # -- pools ----------------------------------------------------------------------

    def list_pools(self, kind: str, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Return every pool of ``kind`` in ``namespaces`` (empty: all namespaces).

        Lists from the API are ``kind``-less; each item gets its ``kind`` back.
        """
        plural = POOL_KINDS[kind]
        if namespaces:
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

    def set_pool_finalizer(self, pool: Mapping[str, Any], finalizer: str, present: bool) -> None:
        """Add or remove ``finalizer`` on a pool, guarded by its resourceVersion.

        A stale resourceVersion makes the API answer 409 (propagated); a missing pool is
        ignored.
        """
        meta = pool.get("metadata") or {}
        finalizers = [f for f in meta.get("finalizers") or [] if f != finalizer]
        if present:
            finalizers.append(finalizer)
        if finalizers == list(meta.get("finalizers") or []):
            return
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP,
                POOL_VERSION,
                meta["namespace"],
                POOL_KINDS[str(pool["kind"])],
                meta["name"],
                {
                    "metadata": {
                        "finalizers": finalizers,
                        "resourceVersion": meta.get("resourceVersion"),
                    }
                },
            )
        except ApiException as exc:
            if not _missing(exc):
                raise

    def patch_pool_status(
        self, namespace: str, kind: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch a pool's status subresource (a missing pool is ignored)."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, POOL_VERSION, namespace, POOL_KINDS[kind], name, {"status": dict(status)}
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
        namespace = str(meta.get("namespace"))
        now = datetime.datetime.now(datetime.UTC)
        event = CoreV1Event(
            metadata=V1ObjectMeta(generate_name="ipam-bridge-", namespace=namespace),
            involved_object=V1ObjectReference(
                api_version=obj.get("apiVersion"),
                kind=obj.get("kind"),
                name=meta.get("name"),
                namespace=namespace,
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
