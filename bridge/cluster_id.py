"""The identity of this management cluster, written as the owner of every IPAM entry.

One IPAM serves many management clusters; each entry ipam-bridge makes names its
`backends.base.EntryOwner`, whose ``cluster_id`` is the setting ``IPAM_BRIDGE_CLUSTER_ID``
or, when that is empty, the uid of namespace ``kube-system``: it differs between two clusters
without any configuration and stays the same for a cluster's life (a Namespace's uid never
changes; Kubernetes API conventions, "metadata.uid").
"""

from __future__ import annotations

from typing import Protocol

from bridge.settings import Settings

__all__ = [
    "CLUSTER_ID_ENV",
    "CLUSTER_ID_NAMESPACE",
    "ClusterIdError",
    "NamespaceReader",
    "resolve_cluster_id",
]

#: The environment variable of the setting (`bridge.settings.Settings.cluster_id`).
CLUSTER_ID_ENV = "IPAM_BRIDGE_CLUSTER_ID"
#: The namespace whose uid is the default identity.
CLUSTER_ID_NAMESPACE = "kube-system"


class ClusterIdError(RuntimeError):
    """The management cluster's identity could not be found (the message says how to fix it)."""


class NamespaceReader(Protocol):
    """What `resolve_cluster_id` needs of a client: ``kubernetes.client.CoreV1Api`` has it."""

    def read_namespace(self, name: str) -> object:
        """Return the Namespace ``name`` (a ``V1Namespace``; ``metadata.uid`` is read)."""
        ...


def resolve_cluster_id(settings: Settings, core_api: NamespaceReader) -> str:
    """Return this management cluster's identity, the owner written on every IPAM entry.

    ``settings.cluster_id`` (``IPAM_BRIDGE_CLUSTER_ID``) when set, stripped; when empty, the
    ``metadata.uid`` of namespace ``kube-system``, read with one ``GET
    /api/v1/namespaces/kube-system`` (RBAC: ``get`` on that one namespace).

    Parameters
    ----------
    settings:
        The operator's settings.
    core_api:
        A ``kubernetes.client.CoreV1Api`` (or anything with its ``read_namespace``).

    Returns
    -------
    str
        The identity: never empty.

    Raises
    ------
    ClusterIdError
        When the namespace cannot be read (no permission, no API server) or has no uid; the
        message names ``IPAM_BRIDGE_CLUSTER_ID`` as the way to set the identity instead.
    """
    configured = settings.cluster_id.strip()
    if configured:
        return configured
    try:
        namespace = core_api.read_namespace(CLUSTER_ID_NAMESPACE)
    except Exception as exc:  # the client raises ApiException, urllib3 and OSError errors
        status = getattr(exc, "status", None)
        why = (
            f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else type(exc).__name__
        )
        raise ClusterIdError(
            f"cannot read namespace {CLUSTER_ID_NAMESPACE} for this management cluster's "
            f"identity ({why}); grant 'get' on namespace {CLUSTER_ID_NAMESPACE} or set "
            f"{CLUSTER_ID_ENV}"
        ) from exc
    metadata = getattr(namespace, "metadata", None)
    uid = str(getattr(metadata, "uid", None) or "").strip()
    if not uid:
        raise ClusterIdError(
            f"namespace {CLUSTER_ID_NAMESPACE} has no metadata.uid; set {CLUSTER_ID_ENV}"
        )
    return uid
