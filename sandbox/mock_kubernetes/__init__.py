"""In-memory Kubernetes API for tests and the demo (like ``kopf.testing``, for a whole cluster)."""

from mock_kubernetes.auth import AccessLog, AccessRecord, Identity, User, service_account_user
from mock_kubernetes.emulator import KubeEmulator
from mock_kubernetes.faults import Fault, Faults
from mock_kubernetes.inflight import DeletesInFlight
from mock_kubernetes.rbac import PolicyRule, RBACAuthorizer, deploy_identity
from mock_kubernetes.resources import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_RESOURCES,
    ResourceDef,
    resources_from_crd,
)
from mock_kubernetes.schema import prune
from mock_kubernetes.selectors import FieldSelector, LabelSelector, SelectorError
from mock_kubernetes.server import EmulatedKubernetes
from mock_kubernetes.store import ApiError, ObjectStore, WatchEvent, merge_patch

__all__ = [
    "BUILTIN_RESOURCES",
    "KOPF_PEERING_RESOURCES",
    "AccessLog",
    "AccessRecord",
    "ApiError",
    "DeletesInFlight",
    "EmulatedKubernetes",
    "Fault",
    "Faults",
    "FieldSelector",
    "Identity",
    "KubeEmulator",
    "LabelSelector",
    "ObjectStore",
    "PolicyRule",
    "RBACAuthorizer",
    "ResourceDef",
    "SelectorError",
    "User",
    "WatchEvent",
    "deploy_identity",
    "merge_patch",
    "prune",
    "resources_from_crd",
    "service_account_user",
]
