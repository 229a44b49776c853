"""Namespace lifecycle of the in-memory Kubernetes API, through the official kubernetes client.

What a real cluster does (NamespaceLifecycle admission, kube-controller-manager's namespace
controller; ``/work/shared/reference/real-cluster.md`` item 7): a deleted namespace turns
Terminating, everything in it is deleted in no particular order, objects with finalizers stay
until their finalizers are removed, nothing new can be created in it, and it goes once empty.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import kubernetes.client
import pytest
import requests
from emulator_helpers import GROUP, widget
from kubernetes.client.rest import ApiException

from mock_kubernetes import EmulatedKubernetes

V2 = "v2"


def make_namespace(client: kubernetes.client.ApiClient, name: str) -> None:
    kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": name}})


def fill(client: kubernetes.client.ApiClient, ns: str) -> None:
    """A Secret, a ConfigMap, an Event, a Widget, and a Widget held by a finalizer."""
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"a": "b"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {}})
    core.create_namespaced_event(
        ns, {"metadata": {"name": "e1"}, "involvedObject": {"name": "x"}, "reason": "R"}
    )
    custom.create_namespaced_custom_object(GROUP, V2, ns, "widgets", widget("free"))
    held = widget("held", metadata={"name": "held", "finalizers": ["example.com/keep"]})
    custom.create_namespaced_custom_object(GROUP, V2, ns, "widgets", held)


def names(kube: EmulatedKubernetes, api_version: str, plural: str, ns: str) -> list[str]:
    return [o["metadata"]["name"] for o in kube.list(api_version, plural, ns)]


def test_deleting_a_namespace_deletes_its_content_and_waits_for_finalizers(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    make_namespace(client, "team")
    fill(client, "team")

    answer = core.delete_namespace("team")  # the namespace as marked (a dict: V1Status-typed)
    assert answer["status"]["phase"] == "Terminating" and answer["metadata"]["deletionTimestamp"]
    ns = core.read_namespace("team")
    assert ns.metadata.deletion_timestamp is not None
    assert ns.status.phase == "Terminating"
    assert ns.spec.finalizers == ["kubernetes"]
    conditions = {c.type: c for c in ns.status.conditions}
    assert conditions["NamespaceContentRemaining"].status == "True"
    assert conditions["NamespaceContentRemaining"].message == (
        "Some resources are remaining: widgets.example.com has 1 resource instances"
    )
    assert conditions["NamespaceFinalizersRemaining"].message == (
        "Some content in the namespace has finalizers remaining:"
        " example.com/keep in 1 resource instances"
    )
    # Everything without finalizers is gone at once, the Secret included.
    assert names(kube, "v1", "secrets", "team") == []
    assert names(kube, "v1", "configmaps", "team") == []
    assert names(kube, "v1", "events", "team") == []
    assert names(kube, f"{GROUP}/{V2}", "widgets", "team") == ["held"]
    held = custom.get_namespaced_custom_object(GROUP, V2, "team", "widgets", "held")
    assert held["metadata"]["deletionTimestamp"]

    # A second DELETE changes nothing; updates of what is left are allowed.
    core.delete_namespace("team")
    custom.patch_namespaced_custom_object(
        GROUP, V2, "team", "widgets", "held", {"metadata": {"labels": {"seen": "yes"}}}
    )
    assert core.read_namespace("team").status.phase == "Terminating"

    # The last finalizer goes: the object goes, and the namespace with it.
    custom.patch_namespaced_custom_object(
        GROUP, V2, "team", "widgets", "held", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(ApiException) as error:
        core.read_namespace("team")
    assert error.value.status == 404


@pytest.mark.parametrize("kind", ["secret", "event", "widget"])
def test_creating_in_a_terminating_namespace_is_forbidden(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient, kind: str
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    make_namespace(client, "team")
    held = widget("held", metadata={"name": "held", "finalizers": ["example.com/keep"]})
    custom.create_namespaced_custom_object(GROUP, V2, "team", "widgets", held)
    core.delete_namespace("team")

    create, resource = {
        "secret": (
            lambda: core.create_namespaced_secret("team", {"metadata": {"name": "new"}}),
            "secrets",
        ),
        "event": (
            lambda: core.create_namespaced_event(
                "team", {"metadata": {"name": "new"}, "involvedObject": {}}
            ),
            "events",
        ),
        "widget": (
            lambda: custom.create_namespaced_custom_object(
                GROUP, V2, "team", "widgets", widget("new")
            ),
            "widgets.example.com",
        ),
    }[kind]
    with pytest.raises(ApiException) as error:
        create()
    status = json.loads(error.value.body)
    assert (error.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        f'{resource} "new" is forbidden: unable to create new content in namespace team'
        " because it is being terminated"
    )


def test_an_empty_namespace_goes_at_once_and_then_nothing_can_be_created_in_it(
    client: kubernetes.client.ApiClient,
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    make_namespace(client, "empty")
    core.delete_namespace("empty")
    assert "empty" not in [n.metadata.name for n in core.list_namespace().items]
    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map("empty", {"metadata": {"name": "c"}})
    assert error.value.status == 404
    assert json.loads(error.value.body)["message"] == 'namespaces "empty" not found'


def test_creating_in_a_namespace_that_never_existed_is_404(
    client: kubernetes.client.ApiClient,
) -> None:
    custom = kubernetes.client.CustomObjectsApi(client)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(GROUP, V2, "nowhere", "widgets", widget("w"))
    assert error.value.status == 404
    assert json.loads(error.value.body)["message"] == 'namespaces "nowhere" not found'


@pytest.mark.parametrize("name", ["default", "kube-system"])
def test_system_namespaces_cannot_be_deleted(
    client: kubernetes.client.ApiClient, name: str
) -> None:
    with pytest.raises(ApiException) as error:
        kubernetes.client.CoreV1Api(client).delete_namespace(name)
    assert error.value.status == 403
    assert json.loads(error.value.body)["message"] == (
        f'namespaces "{name}" is forbidden: this namespace may not be deleted'
    )


def test_namespace_spec_finalizers_cannot_be_changed_by_an_update(
    client: kubernetes.client.ApiClient,
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    make_namespace(client, "team")
    patched = core.patch_namespace("team", {"spec": {"finalizers": []}, "metadata": {"labels": {}}})
    assert patched.spec.finalizers == ["kubernetes"]


def deletion_order(kube: EmulatedKubernetes, ns: str, since: str) -> list[str]:
    """The kinds of the objects of ``ns`` deleted after ``since``, in deletion order."""
    events: list[tuple[int, str]] = []
    for path, kind in (("/api/v1/secrets", "Secret"), (f"/apis/{GROUP}/{V2}/widgets", "Widget")):
        params = {"watch": "1", "resourceVersion": since, "timeoutSeconds": "0.2"}
        with requests.get(kube.url + path, params=params, stream=True, timeout=5) as response:
            for line in response.iter_lines():
                event: dict[str, Any] = json.loads(line)
                if event["type"] == "DELETED" and event["object"]["metadata"]["namespace"] == ns:
                    events.append((int(event["object"]["metadata"]["resourceVersion"]), kind))
    return [kind for _, kind in sorted(events)]


def test_content_is_deleted_in_no_fixed_order_of_resources(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    orders = []
    for n in range(4):
        ns = f"team-{n}"
        make_namespace(client, ns)
        for i in range(6):
            core.create_namespaced_secret(ns, {"metadata": {"name": f"s{i}"}})
            custom.create_namespaced_custom_object(GROUP, V2, ns, "widgets", widget(f"w{i}"))
        since = str(kube.store.resource_version)
        core.delete_namespace(ns)
        order = deletion_order(kube, ns, since)
        assert sorted(order) == ["Secret"] * 6 + ["Widget"] * 6
        orders.append(order)
    # Grouped by resource would switch kind once; a shuffled order switches more often.
    switches = [sum(a != b for a, b in itertools.pairwise(o)) for o in orders]
    assert max(switches) > 1, orders


def test_namespace_lifecycle_can_be_turned_off() -> None:
    with EmulatedKubernetes(namespace_lifecycle=False) as kube:
        created = kube.create(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "x"}}
        )
        assert created["metadata"]["namespace"] == "x"
        kube.delete("v1", "namespaces", "default")
        assert kube.get("v1", "namespaces", "default") is None


def test_kube_system_has_a_uid_of_its_own_in_every_api_server() -> None:
    # A real API server gives every namespace a random uid (a UUID) when it is created, so
    # kube-system's differs between two clusters and stays for the cluster's life: the
    # default management cluster identity of ipam-bridge (bridge/cluster_id.py).
    uids = []
    for _ in range(2):
        with EmulatedKubernetes() as server, server.api_client() as api_client:
            core = kubernetes.client.CoreV1Api(api_client)
            first = core.read_namespace("kube-system").metadata.uid
            assert first and core.read_namespace("kube-system").metadata.uid == first
            uids.append(first)
    assert uids[0] != uids[1]
    assert all(len(uid) == 36 and uid.count("-") == 4 for uid in uids)
