"""In-memory Kubernetes API for tests and the demo (like ``kopf.testing``, for a whole cluster)."""

from bridge.testing.auth import AccessLog, AccessRecord, Identity, User, service_account_user
from bridge.testing.emulator import KubeEmulator
from bridge.testing.rbac import PolicyRule, RBACAuthorizer, deploy_identity
from bridge.testing.resources import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_RESOURCES,
    ResourceDef,
    resources_from_crd,
)
from bridge.testing.schema import prune
from bridge.testing.selectors import FieldSelector, LabelSelector, SelectorError
from bridge.testing.server import EmulatedKubernetes
from bridge.testing.store import ApiError, ObjectStore, WatchEvent, merge_patch

__all__ = [
    "BUILTIN_RESOURCES",
    "KOPF_PEERING_RESOURCES",
    "AccessLog",
    "AccessRecord",
    "ApiError",
    "EmulatedKubernetes",
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
