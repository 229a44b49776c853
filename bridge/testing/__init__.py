"""In-memory Kubernetes API for tests and the demo (like ``kopf.testing``, for a whole cluster)."""

from bridge.testing.emulator import KubeEmulator
from bridge.testing.resources import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_RESOURCES,
    ResourceDef,
    resources_from_crd,
)
from bridge.testing.selectors import FieldSelector, LabelSelector, SelectorError
from bridge.testing.server import EmulatedKubernetes
from bridge.testing.store import ApiError, ObjectStore, WatchEvent, merge_patch

__all__ = [
    "BUILTIN_RESOURCES",
    "KOPF_PEERING_RESOURCES",
    "ApiError",
    "EmulatedKubernetes",
    "FieldSelector",
    "KubeEmulator",
    "LabelSelector",
    "ObjectStore",
    "ResourceDef",
    "SelectorError",
    "WatchEvent",
    "merge_patch",
    "resources_from_crd",
]
