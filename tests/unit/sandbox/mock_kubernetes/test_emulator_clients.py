"""The sync kubernetes client, direct object access and fault injection against the emulator."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes.client
import pytest
from emulator_helpers import GROUP, WIDGETS_PATH, Api, widget
from kubernetes.client.rest import ApiException

from mock_kubernetes import ApiError, EmulatedKubernetes


def test_kubernetes_client_core_and_custom_objects(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "stringData": {"token": "t"}}
    )
    secret = core.read_namespaced_secret("creds", "default")
    assert secret.metadata.uid and secret.metadata.resource_version
    assert [n.metadata.name for n in core.list_namespace().items] == ["default", "kube-system"]

    custom = kubernetes.client.CustomObjectsApi(client)
    created = custom.create_namespaced_custom_object(
        GROUP, "v2", "default", "widgets", widget("w", spec={"x": 1})
    )
    custom.patch_namespaced_custom_object_status(
        GROUP, "v2", "default", "widgets", "w", {"status": {"ready": True}}
    )
    fetched = custom.get_namespaced_custom_object(GROUP, "v2", "default", "widgets", "w")
    assert fetched["status"] == {"ready": True}
    assert fetched["metadata"]["uid"] == created["metadata"]["uid"]
    with pytest.raises(ApiException) as error:
        custom.replace_namespaced_custom_object(GROUP, "v2", "default", "widgets", "w", created)
    assert error.value.status == 409


def test_direct_object_access(kube: EmulatedKubernetes) -> None:
    created = kube.create(
        widget("w", metadata={"name": "w", "namespace": "default", "finalizers": ["f"]})
    )
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "default") == created
    assert kube.get(f"{GROUP}/v2", "Widget", "w", "default") == created  # kind works too
    kube.patch(f"{GROUP}/v2", "widgets", "w", {"status": {"s": 1}}, "default", subresource="status")
    assert [o["status"] for o in kube.list(f"{GROUP}/v2", "widgets")] == [{"s": 1}]
    kube.delete(f"{GROUP}/v2", "widgets", "w", "default")
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "default")["metadata"]["deletionTimestamp"]
    kube.patch(f"{GROUP}/v2", "widgets", "w", {"metadata": {"finalizers": []}}, "default")
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "default") is None
    with pytest.raises(ApiError) as error:
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    assert error.value.status == 404


def test_kubeconfig_is_explicit(kube: EmulatedKubernetes, tmp_path: Any) -> None:
    path = kube.write_kubeconfig(tmp_path / "kubeconfig")
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(path), client_configuration=config)
    assert config.host == kube.url
    with kubernetes.client.ApiClient(config) as api_client:
        names = [
            n.metadata.name for n in kubernetes.client.CoreV1Api(api_client).list_namespace().items
        ]
    assert "default" in names


def test_injected_faults_answer_the_matching_requests(kube: EmulatedKubernetes, api: Api) -> None:
    kube.handler.faults.inject("GET", WIDGETS_PATH, 503)
    response = api.session.get(kube.url + WIDGETS_PATH, timeout=5)
    assert response.status_code == 503
    assert response.json()["reason"] == "ServiceUnavailable"
    assert api("GET", WIDGETS_PATH)[0] == 200  # the fault was served once
    kube.handler.faults.inject(None, WIDGETS_PATH, 500, times=None)
    assert [api("GET", WIDGETS_PATH)[0] for _ in range(3)] == [500, 500, 500]
    assert api("GET", "/api/v1/namespaces/default/secrets")[0] == 200  # another path
    kube.handler.faults.clear()
    assert api("GET", WIDGETS_PATH)[0] == 200


def test_concurrent_read_modify_write_loses_no_update(kube: EmulatedKubernetes) -> None:
    """Eight writers append to one list with resourceVersion checks; every append survives."""
    api = Api(kube.url)
    api(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "counter"}, "data": {"items": ""}},
    )
    path = "/api/v1/namespaces/default/configmaps/counter"
    conflicts = []

    def writer(n: int) -> None:
        local = Api(kube.url)
        for i in range(4):
            while True:
                _, current = local("GET", path)
                items = current["data"]["items"] + f"{n}-{i},"
                current["data"]["items"] = items
                status, _ = local("PUT", path, current)
                if status == 200:
                    break
                assert status == 409
                conflicts.append(1)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    items = [x for x in api("GET", path)[1]["data"]["items"].split(",") if x]
    assert sorted(items) == sorted(f"{n}-{i}" for n in range(8) for i in range(4))


def test_garbage_collection_of_dependents(kube: EmulatedKubernetes, api: Api) -> None:
    _, owner = api("POST", WIDGETS_PATH, widget("owner"))
    _, other = api("POST", WIDGETS_PATH, widget("other"))
    ref = {
        "apiVersion": f"{GROUP}/v2",
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    other_ref = {**ref, "name": "other", "uid": other["metadata"]["uid"]}
    api("POST", WIDGETS_PATH, widget("child", metadata={"name": "child", "ownerReferences": [ref]}))
    api(
        "POST",
        WIDGETS_PATH,
        widget("shared", metadata={"name": "shared", "ownerReferences": [ref, other_ref]}),
    )
    api(
        "POST",
        WIDGETS_PATH,
        widget("held", metadata={"name": "held", "finalizers": ["f"], "ownerReferences": [ref]}),
    )
    api("DELETE", f"{WIDGETS_PATH}/owner")
    assert api("GET", f"{WIDGETS_PATH}/child")[0] == 404
    assert api("GET", f"{WIDGETS_PATH}/shared")[0] == 200  # another owner still exists
    _, held = api("GET", f"{WIDGETS_PATH}/held")
    assert held["metadata"]["deletionTimestamp"]  # finalizers of dependents are honoured


def test_the_crds_served_are_objects_established_as_on_a_real_api_server(
    kube: EmulatedKubernetes, client: kubernetes.client.ApiClient
) -> None:
    crds = kubernetes.client.ApiextensionsV1Api(client)
    names = sorted(c.metadata.name for c in crds.list_custom_resource_definition().items)
    assert names == [f"gadgets.{GROUP}", f"widgets.{GROUP}"]
    crd = client.sanitize_for_serialization(
        crds.read_custom_resource_definition(f"widgets.{GROUP}")
    )
    conditions = {c["type"]: (c["status"], c["reason"]) for c in crd["status"]["conditions"]}
    assert conditions == {
        "NamesAccepted": ("True", "NoConflicts"),
        "Established": ("True", "InitialNamesAccepted"),
    }
    assert crd["status"]["acceptedNames"]["listKind"] == "WidgetList"
    storage = [v["name"] for v in crd["spec"]["versions"] if v["storage"]]
    assert crd["status"]["storedVersions"] == storage
    # One declared later is served and shown alike; declaring it again keeps one object.
    later = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gizmos.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "kind": "Gizmo"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    kube.declare_crd(later)
    kube.declare_crd(later)
    found = [c.metadata.name for c in crds.list_custom_resource_definition().items]
    assert found.count(f"gizmos.{GROUP}") == 1
    assert (
        kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
            GROUP, "v1", "default", "gizmos"
        )["items"]
        == []
    )
