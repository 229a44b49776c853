"""Owner-reference garbage collection (real-cluster.md item 11), through the kubernetes client.

Background propagation: once every owner of an object is gone, the object is deleted (with
finalizers it gets ``deletionTimestamp`` and stays until they are removed). A namespaced
dependent may have a cluster-scoped owner.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest
from emulator_helpers import GROUP, widget
from kubernetes.client.rest import ApiException

from mock_kubernetes import EmulatedKubernetes


@pytest.fixture
def custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def make_gadget(custom: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": name}}
    result: dict[str, Any] = custom.create_cluster_custom_object(GROUP, "v1", "gadgets", body)
    return result


def make_dependent(
    custom: kubernetes.client.CustomObjectsApi,
    name: str,
    owner: dict[str, Any],
    namespace: str = "default",
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "ownerReferences": [owner_ref(owner)]}
    if finalizers:
        metadata["finalizers"] = finalizers
    result: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, "v2", namespace, "widgets", widget(name, metadata=metadata)
    )
    return result


def exists(custom: kubernetes.client.CustomObjectsApi, name: str, ns: str = "default") -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, "v2", ns, "widgets", name)
    except ApiException as e:
        assert e.status == 404
        return False
    return True


def test_namespaced_dependent_of_a_cluster_scoped_owner_is_collected(
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    owner = make_gadget(custom, "g")
    make_dependent(custom, "child", owner)
    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "g")
    assert not exists(custom, "child")


def test_collection_waits_for_the_owner_to_be_gone_not_just_deleting(
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "metadata": {"name": "g", "finalizers": ["example.com/keep"]},
    }
    owner = custom.create_cluster_custom_object(GROUP, "v1", "gadgets", body)
    make_dependent(custom, "child", owner)
    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "g")
    assert exists(custom, "child")  # background propagation: the owner is still there
    custom.patch_cluster_custom_object(
        GROUP, "v1", "gadgets", "g", {"metadata": {"finalizers": None}}
    )
    assert not exists(custom, "child")


def test_dependent_with_finalizers_is_marked_and_stays_until_they_are_removed(
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    owner = make_gadget(custom, "g")
    make_dependent(custom, "held", owner, finalizers=["example.com/keep"])
    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "g")
    held = custom.get_namespaced_custom_object(GROUP, "v2", "default", "widgets", "held")
    assert held["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(
        GROUP, "v2", "default", "widgets", "held", {"metadata": {"finalizers": None}}
    )
    assert not exists(custom, "held")


def test_collection_in_a_terminating_namespace(
    kube: EmulatedKubernetes,
    client: kubernetes.client.ApiClient,
    custom: kubernetes.client.CustomObjectsApi,
) -> None:
    """Owners and dependents in a namespace being deleted, and a cluster-scoped owner."""
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": "team"}})
    gadget = make_gadget(custom, "g")
    held_owner = custom.create_namespaced_custom_object(
        GROUP,
        "v2",
        "team",
        "widgets",
        widget("owner", metadata={"name": "owner", "finalizers": ["example.com/keep"]}),
    )
    make_dependent(custom, "held-child", held_owner, "team", finalizers=["example.com/keep"])
    make_dependent(custom, "gadget-child", gadget, "team", finalizers=["example.com/keep"])
    free_owner = custom.create_namespaced_custom_object(
        GROUP, "v2", "team", "widgets", widget("free-owner")
    )
    for i in range(5):  # collected by the GC or deleted by the namespace controller, in any order
        make_dependent(custom, f"free-child-{i}", free_owner, "team")

    core.delete_namespace("team")
    left = {o["metadata"]["name"] for o in kube.list(f"{GROUP}/v2", "widgets", "team")}
    assert left == {"owner", "held-child", "gadget-child"}

    # The cluster-scoped owner goes: its dependent in the terminating namespace is deleted
    # (already marked: it keeps its deletionTimestamp and waits for its finalizer).
    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "g")
    child = custom.get_namespaced_custom_object(GROUP, "v2", "team", "widgets", "gadget-child")
    assert child["metadata"]["deletionTimestamp"]

    for name in ("owner", "held-child", "gadget-child"):
        custom.patch_namespaced_custom_object(
            GROUP, "v2", "team", "widgets", name, {"metadata": {"finalizers": None}}
        )
    assert "team" not in [n.metadata.name for n in core.list_namespace().items]


def test_no_collection_when_turned_off() -> None:
    with EmulatedKubernetes(crds=[], garbage_collection=False) as kube:
        owner = kube.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "o", "namespace": "default"},
            }
        )
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "o",
            "uid": owner["metadata"]["uid"],
        }
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "d", "namespace": "default", "ownerReferences": [ref]},
            }
        )
        kube.delete("v1", "configmaps", "o", "default")
        assert kube.get("v1", "configmaps", "d", "default") is not None


def test_one_owner_gone_of_two_is_dropped_and_the_dependent_stays_live(
    kube: EmulatedKubernetes, custom: kubernetes.client.CustomObjectsApi
) -> None:
    """real-cluster.md 13f: the GC patches the dependent's ownerReferences, never deletes it."""
    first = make_gadget(custom, "first")
    second = make_gadget(custom, "second")
    body = widget(
        "shared",
        metadata={
            "name": "shared",
            "ownerReferences": [owner_ref(first), {**owner_ref(second), "controller": False}],
            "finalizers": ["example.com/keep"],
        },
    )
    created = custom.create_namespaced_custom_object(GROUP, "v2", "default", "widgets", body)
    events = kube.store.resource_version

    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "first")
    shared = custom.get_namespaced_custom_object(GROUP, "v2", "default", "widgets", "shared")
    assert [ref["uid"] for ref in shared["metadata"]["ownerReferences"]] == [
        second["metadata"]["uid"]
    ]
    assert "deletionTimestamp" not in shared["metadata"]  # live: nothing marks it
    assert shared["metadata"]["finalizers"] == ["example.com/keep"]
    # A write of its own: a new resourceVersion (a MODIFIED event for its watchers).
    assert int(shared["metadata"]["resourceVersion"]) > events
    assert shared["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]

    # The last owner goes: now the dependent is deleted (marked: it has a finalizer).
    custom.delete_cluster_custom_object(GROUP, "v1", "gadgets", "second")
    shared = custom.get_namespaced_custom_object(GROUP, "v2", "default", "widgets", "shared")
    assert shared["metadata"]["deletionTimestamp"]
