"""The management cluster's identity: the owner's first half on every IPAM entry it makes.

One IPAM serves many management clusters whose claim names repeat (``default/mgmt-cp-0`` in
every one of them). Each entry ipam-bridge makes names its owner, `backends.base.EntryOwner`:
this identity and the claim's ``<namespace>/<name>``. The identity is the setting
``IPAM_BRIDGE_CLUSTER_ID``, else the uid of namespace ``kube-system``: the API server gives
every namespace a random uid when it is created (RFC 4122 UUID), and ``kube-system`` lives as
long as the cluster, so two clusters differ without any configuration
(https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#uids).
"""

from __future__ import annotations

from typing import Protocol

from kubernetes.client import ApiException

from bridge.settings import Settings

__all__ = [
    "CLUSTER_ID_ENV",
    "CLUSTER_ID_NAMESPACE",
    "ClusterIdError",
    "NamespaceReader",
    "resolve_cluster_id",
]

#: The namespace whose uid is the default identity.
CLUSTER_ID_NAMESPACE = "kube-system"

#: The environment variable that sets the identity (`bridge.settings.Settings.cluster_id`).
CLUSTER_ID_ENV = "IPAM_BRIDGE_CLUSTER_ID"


class NamespaceReader(Protocol):
    """What `resolve_cluster_id` needs of a client: ``kubernetes.client.CoreV1Api`` has it."""

    def read_namespace(self, name: str) -> object:
        """Return the Namespace ``name`` (``V1Namespace``)."""


class ClusterIdError(RuntimeError):
    """The identity cannot be had: the message names `CLUSTER_ID_ENV` and what to do.

    Attributes
    ----------
    transient:
        True when the API server could not answer (a 5xx, a timeout): trying again may help.
        False when it refused (401/403: RBAC), the namespace is missing, or its uid is empty.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def resolve_cluster_id(settings: Settings, core_api: NamespaceReader) -> str:
    """Return this management cluster's identity, read once at start-up.

    Parameters
    ----------
    settings:
        The operator settings: ``cluster_id`` (``IPAM_BRIDGE_CLUSTER_ID``) wins when set
        (surrounding whitespace dropped; no API call then).
    core_api:
        A ``kubernetes.client.CoreV1Api`` (``read_namespace``: GET
        ``/api/v1/namespaces/kube-system``, which needs ``get`` on that one namespace).

    Returns
    -------
    str
        The setting, else the uid of namespace ``kube-system``.

    Raises
    ------
    ClusterIdError
        When the setting is empty and the uid cannot be read: the API server refused
        (RBAC), the namespace does not exist or has no uid, or (``transient``) the API
        server answered 5xx or 429 or not at all (a connection error). The message names
        the setting.
    """
    configured = settings.cluster_id.strip()
    if configured:
        return configured
    try:
        namespace = core_api.read_namespace(CLUSTER_ID_NAMESPACE)
    except ApiException as exc:
        raise ClusterIdError(
            f"{CLUSTER_ID_ENV} is empty and the uid of namespace {CLUSTER_ID_NAMESPACE} could "
            f"not be read (the API server answered {exc.status} {exc.reason}): grant get on "
            f"that namespace (deploy/ does) or set {CLUSTER_ID_ENV} to an identity of this "
            "management cluster that no other one uses",
            transient=exc.status is None or exc.status >= 500 or exc.status == 429,
        ) from exc
    except Exception as exc:  # urllib3's and the socket's: no answer at all
        raise ClusterIdError(
            f"{CLUSTER_ID_ENV} is empty and the uid of namespace {CLUSTER_ID_NAMESPACE} could "
            f"not be read (no answer from the API server: {type(exc).__name__})",
            transient=True,
        ) from exc
    metadata = getattr(namespace, "metadata", None)
    uid = str(getattr(metadata, "uid", "") or "").strip()
    if not uid:
        raise ClusterIdError(
            f"{CLUSTER_ID_ENV} is empty and namespace {CLUSTER_ID_NAMESPACE} has no uid: set "
            f"{CLUSTER_ID_ENV} to an identity of this management cluster that no other one uses"
        )
    return uid
