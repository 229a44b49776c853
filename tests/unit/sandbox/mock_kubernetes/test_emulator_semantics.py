"""Write semantics of the in-memory Kubernetes API, exercised over HTTP."""

from __future__ import annotations

import re

import pytest
from emulator_helpers import GROUP, WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def create(api: Api, name: str, **fields: object) -> dict:
    status, body = api("POST", WIDGETS_PATH, widget(name, **fields))
    assert status == 201, body
    return body


def test_create_sets_uid_timestamp_generation_and_global_resource_version(api: Api) -> None:
    first = create(api, "a", spec={"x": 1})
    _, secret = api(
        "POST", "/api/v1/namespaces/default/secrets", {"metadata": {"name": "s"}, "data": {}}
    )
    second = create(api, "b", spec={"x": 1})
    rvs = [int(o["metadata"]["resourceVersion"]) for o in (first, secret, second)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3  # one counter across resources
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["metadata"]["creationTimestamp"])
    assert first["metadata"]["generation"] == 1
    assert "generation" not in secret["metadata"]  # built-ins without spec keep none here


def test_generation_bumps_on_spec_changes_only(api: Api) -> None:
    obj = create(api, "a", spec={"x": 1})
    path = f"{WIDGETS_PATH}/a"
    _, labelled = api("PATCH", path, {"metadata": {"labels": {"l": "1"}}}, content_type=MERGE)
    assert labelled["metadata"]["generation"] == obj["metadata"]["generation"]
    _, with_status = api("PATCH", path + "/status", {"status": {"s": 1}}, content_type=MERGE)
    assert with_status["metadata"]["generation"] == obj["metadata"]["generation"]
    _, changed = api("PATCH", path, {"spec": {"x": 2}}, content_type=MERGE)
    assert changed["metadata"]["generation"] == obj["metadata"]["generation"] + 1


def test_noop_patch_keeps_resource_version(api: Api) -> None:
    obj = create(api, "a", spec={"x": 1})
    _, same = api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 1}}, content_type=MERGE)
    assert same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_get_list_put_delete(api: Api) -> None:
    obj = create(api, "a", spec={"x": 1})
    status, fetched = api("GET", f"{WIDGETS_PATH}/a")
    assert status == 200 and fetched == obj
    fetched["spec"] = {"x": 5}
    status, replaced = api("PUT", f"{WIDGETS_PATH}/a", fetched)
    assert status == 200 and replaced["spec"] == {"x": 5}
    status, listed = api("GET", WIDGETS_PATH)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(
        replaced["metadata"]["resourceVersion"]
    )
    status, _ = api("DELETE", f"{WIDGETS_PATH}/a")
    assert status == 200
    status, missing = api("GET", f"{WIDGETS_PATH}/a")
    assert status == 404 and missing["reason"] == "NotFound"


def test_create_existing_is_409_already_exists(api: Api) -> None:
    create(api, "a")
    status, body = api("POST", WIDGETS_PATH, widget("a"))
    assert (status, body["reason"]) == (409, "AlreadyExists")


def test_stale_resource_version_in_put_is_409(api: Api) -> None:
    obj = create(api, "a", spec={"x": 1})
    api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 2}}, content_type=MERGE)
    obj["spec"] = {"x": 3}
    status, body = api("PUT", f"{WIDGETS_PATH}/a", obj)  # still carries the old resourceVersion
    assert (status, body["reason"]) == (409, "Conflict")
    assert api("GET", f"{WIDGETS_PATH}/a")[1]["spec"] == {"x": 2}


def test_stale_resource_version_in_merge_patch_is_409(api: Api) -> None:
    obj = create(api, "a", spec={"x": 1})
    api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 2}}, content_type=MERGE)
    stale = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"x": 3}}
    status, _ = api("PATCH", f"{WIDGETS_PATH}/a", stale, content_type=MERGE)
    assert status == 409


def test_json_patch_test_failure_is_422_and_success_applies(api: Api) -> None:
    obj = create(api, "a", metadata={"name": "a", "finalizers": ["f/1"]})
    rv = obj["metadata"]["resourceVersion"]
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": str(int(rv) - 1)},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    status, _ = api("PATCH", f"{WIDGETS_PATH}/a", stale, content_type=JSON_PATCH)
    assert status == 422
    fresh = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "f/2"},
    ]
    status, body = api("PATCH", f"{WIDGETS_PATH}/a", fresh, content_type=JSON_PATCH)
    assert status == 200 and body["metadata"]["finalizers"] == ["f/1", "f/2"]


def test_merge_patch_follows_rfc7386(api: Api) -> None:
    create(api, "a", spec={"keep": 1, "drop": 2, "list": [1, 2], "nested": {"a": 1}})
    patch = {"spec": {"drop": None, "list": [3], "nested": {"b": 2}}}
    _, body = api("PATCH", f"{WIDGETS_PATH}/a", patch, content_type=MERGE)
    assert body["spec"] == {"keep": 1, "list": [3], "nested": {"a": 1, "b": 2}}


def test_strategic_merge_is_415_on_custom_resources_and_merge_on_core(api: Api) -> None:
    create(api, "a", spec={"x": 1})
    status, body = api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 2}}, content_type=STRATEGIC)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    api(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "c"}, "data": {"a": "1"}},
    )
    status, body = api(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c",
        {"data": {"b": "2"}},
        content_type=STRATEGIC,
    )
    assert status == 200 and body["data"] == {"a": "1", "b": "2"}


def test_status_subresource_is_separated(api: Api) -> None:
    created = create(api, "a", spec={"x": 1}, status={"ignored": True})
    assert "status" not in created  # status is not set on create
    path = f"{WIDGETS_PATH}/a"
    _, body = api("PATCH", path, {"spec": {"x": 2}, "status": {"s": 1}}, content_type=MERGE)
    assert body["spec"] == {"x": 2} and "status" not in body
    _, body = api(
        "PATCH", path + "/status", {"spec": {"x": 3}, "status": {"s": 2}}, content_type=MERGE
    )
    assert body["spec"] == {"x": 2} and body["status"] == {"s": 2}
    body["spec"] = {"x": 4}
    body["status"] = {"s": 3}
    _, put = api("PUT", path, body)
    assert put["spec"] == {"x": 4} and put["status"] == {"s": 2}


def test_status_is_plain_field_without_subresource(api: Api) -> None:
    path = f"/apis/{GROUP}/v1/gadgets"
    _, body = api("POST", path, {"metadata": {"name": "g"}, "status": {"s": 1}})
    assert body["status"] == {"s": 1}
    status, _ = api("PATCH", f"{path}/g/status", {"status": {"s": 2}}, content_type=MERGE)
    assert status == 404


def test_delete_with_finalizers_marks_then_last_finalizer_removal_deletes(api: Api) -> None:
    create(api, "a", metadata={"name": "a", "finalizers": ["f/1", "f/2"]})
    path = f"{WIDGETS_PATH}/a"
    status, marked = api("DELETE", path)
    assert status == 200 and marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["generation"] == 2
    _, again = api("DELETE", path)  # a second DELETE changes nothing
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    status, body = api(
        "PATCH", path, {"metadata": {"finalizers": ["f/1", "f/3"]}}, content_type=MERGE
    )
    assert status == 422 and "f/3" in body["message"]  # no new finalizers once deleting
    api("PATCH", path, {"metadata": {"finalizers": ["f/2"]}}, content_type=MERGE)
    assert api("GET", path)[0] == 200
    status, last = api("PATCH", path, {"metadata": {"finalizers": None}}, content_type=MERGE)
    assert status == 200 and last["metadata"]["name"] == "a"
    assert api("GET", path)[0] == 404


def test_delete_without_finalizers_is_immediate(api: Api) -> None:
    create(api, "a")
    status, body = api("DELETE", f"{WIDGETS_PATH}/a")
    assert status == 200 and "deletionTimestamp" not in body["metadata"]
    assert api("GET", f"{WIDGETS_PATH}/a")[0] == 404
    assert api("DELETE", f"{WIDGETS_PATH}/a")[0] == 404


def test_delete_precondition_mismatch_is_409(api: Api) -> None:
    obj = create(api, "a")
    body = {"preconditions": {"resourceVersion": str(int(obj["metadata"]["resourceVersion"]) + 1)}}
    assert api("DELETE", f"{WIDGETS_PATH}/a", body)[0] == 409
    assert api("GET", f"{WIDGETS_PATH}/a")[0] == 200


def test_delete_precondition_uid_tells_an_object_from_another_of_its_name(api: Api) -> None:
    first = create(api, "a")
    assert api("DELETE", f"{WIDGETS_PATH}/a")[0] == 200
    second = create(api, "a")  # another object under the same name
    stale = {"preconditions": {"uid": first["metadata"]["uid"]}}
    status, answer = api("DELETE", f"{WIDGETS_PATH}/a", stale)
    assert (status, answer["reason"]) == (409, "Conflict")
    assert "Precondition failed: uid" in answer["message"]
    assert api("GET", f"{WIDGETS_PATH}/a")[0] == 200
    current = {"preconditions": {"uid": second["metadata"]["uid"]}}
    assert api("DELETE", f"{WIDGETS_PATH}/a", current)[0] == 200
    assert api("GET", f"{WIDGETS_PATH}/a")[0] == 404


def test_generate_name(api: Api) -> None:
    names = set()
    for _ in range(5):
        _, body = api("POST", WIDGETS_PATH, {"metadata": {"generateName": "w-"}})
        names.add(body["metadata"]["name"])
    assert len(names) == 5 and all(re.fullmatch(r"w-[a-z0-9]{5}", n) for n in names)
    status, body = api("POST", WIDGETS_PATH, {"metadata": {}})
    assert (status, body["reason"]) == (422, "Invalid")


def test_served_versions_share_objects(api: Api) -> None:
    create(api, "a", spec={"x": 1})
    status, body = api("GET", f"/apis/{GROUP}/v1/namespaces/default/widgets/a")
    assert status == 200 and body["apiVersion"] == f"{GROUP}/v1" and body["spec"] == {"x": 1}
    assert api("GET", f"/apis/{GROUP}/v9/namespaces/default/widgets/a")[0] == 404


def test_namespace_mismatch_is_400(api: Api) -> None:
    body = widget("a", metadata={"name": "a", "namespace": "other"})
    assert api("POST", WIDGETS_PATH, body)[0] == 400


def test_namespaces_endpoints(api: Api) -> None:
    status, body = api("GET", "/api/v1/namespaces")
    assert status == 200
    assert {"default", "kube-system"} <= {n["metadata"]["name"] for n in body["items"]}
    status, created = api("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    assert status == 201 and created["status"]["phase"] == "Active"
    status, fetched = api("GET", "/api/v1/namespaces/team-a")
    assert status == 200 and fetched["metadata"]["uid"] == created["metadata"]["uid"]
    status, _ = api("POST", "/api/v1/namespaces/team-a/secrets", {"metadata": {"name": "s"}})
    assert status == 201
    assert api("GET", "/api/v1/namespaces/team-a/secrets/s")[0] == 200


def test_cluster_scoped_resource(api: Api) -> None:
    path = f"/apis/{GROUP}/v1/gadgets"
    status, body = api("POST", path, {"metadata": {"name": "g", "namespace": "ignored"}})
    assert status == 201 and "namespace" not in body["metadata"]
    assert api("GET", f"{path}/g")[0] == 200
    assert api("GET", f"/apis/{GROUP}/v1/namespaces/default/gadgets/g")[0] == 404


@pytest.mark.parametrize(
    "path",
    ["/api/v1/namespaces/default/events", "/apis/events.k8s.io/v1/namespaces/default/events"],
)
def test_events_can_be_posted(api: Api, path: str) -> None:
    event = {"metadata": {"generateName": "w-"}, "reason": "Logging", "type": "Normal"}
    status, body = api("POST", path, event)
    assert status == 201 and body["metadata"]["name"].startswith("w-")
    assert len(api("GET", path)[1]["items"]) == 1


def test_discovery(api: Api) -> None:
    _, apis = api("GET", "/apis")
    group = next(g for g in apis["groups"] if g["name"] == GROUP)
    assert [v["version"] for v in group["versions"]] == ["v2", "v1"]  # priority order
    assert group["preferredVersion"]["version"] == "v2"  # the highest priority
    _, resources = api("GET", f"/apis/{GROUP}/v2")
    by_name = {r["name"]: r for r in resources["resources"]}
    assert by_name["widgets"]["kind"] == "Widget" and by_name["widgets"]["namespaced"] is True
    assert "watch" in by_name["widgets"]["verbs"] and by_name["widgets"]["shortNames"] == ["wi"]
    assert "widgets/status" in by_name
    assert "gadgets/status" not in {
        r["name"] for r in api("GET", f"/apis/{GROUP}/v1")[1]["resources"]
    }
    _, core = api("GET", "/api/v1")
    assert {"namespaces", "secrets", "events", "configmaps"} <= {
        r["name"] for r in core["resources"]
    }
    assert api("GET", "/api")[1]["versions"] == ["v1"]
    assert api("GET", "/apis/unknown.example.com/v1")[0] == 404


def test_unknown_resource_is_404(api: Api) -> None:
    assert api("GET", f"/apis/{GROUP}/v1/namespaces/default/nothings")[0] == 404


def test_declare_crd_at_runtime(kube: EmulatedKubernetes, api: Api) -> None:
    from emulator_helpers import make_crd

    defn = kube.declare_crd(make_crd("sprockets", "Sprocket"))
    assert (defn.group, defn.kind, defn.status_subresource) == (GROUP, "Sprocket", True)
    assert api("GET", f"/apis/{GROUP}/v1/namespaces/default/sprockets")[0] == 200


def test_declare_crd_from_yaml_file(kube: EmulatedKubernetes, tmp_path: object) -> None:
    import pathlib

    import yaml
    from emulator_helpers import make_crd

    path = pathlib.Path(str(tmp_path)) / "crd.yaml"
    path.write_text(yaml.safe_dump_all([{"kind": "Namespace"}, make_crd("cogs", "Cog")]))
    defn = kube.declare_crd(path)
    assert (defn.plural, defn.singular, defn.versions) == ("cogs", "cog", ("v1",))


def test_secret_string_data_is_stored_as_base64_data(api: Api) -> None:
    import base64

    path = "/api/v1/namespaces/default/secrets"
    body = {"metadata": {"name": "s"}, "data": {"a": "QQ=="}, "stringData": {"token": "t0k"}}
    _, created = api("POST", path, body)
    assert "stringData" not in created
    assert created["data"] == {"a": "QQ==", "token": base64.b64encode(b"t0k").decode()}
    _, patched = api("PATCH", f"{path}/s", {"stringData": {"a": "B"}}, content_type=MERGE)
    assert base64.b64decode(patched["data"]["a"]) == b"B" and "stringData" not in patched


def test_discovery_with_trailing_slash_as_the_kubernetes_client_asks() -> None:
    import kubernetes.client

    from mock_kubernetes import EmulatedKubernetes

    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [
                {"name": "v2", "served": True, "storage": True},
                {"name": "v1", "served": True, "storage": False},
            ],
        },
    }
    with EmulatedKubernetes(crds=[crd]) as kube:
        client = kube.api_client()
        groups = kubernetes.client.ApisApi(client).get_api_versions().groups
        (widgets,) = [g for g in groups if g.name == "example.com"]
        assert widgets.preferred_version.version == "v2"
        assert {v.version for v in widgets.versions} == {"v1", "v2"}
        assert kubernetes.client.CoreApi(client).get_api_versions().versions == ["v1"]


def test_group_preferred_version_follows_kubernetes_priority_across_crds() -> None:
    import kubernetes.client

    from mock_kubernetes import EmulatedKubernetes
    from mock_kubernetes.emulator import kube_version_priority

    versions = ["v1alpha1", "v1beta1", "v2", "v1", "v1beta2", "foo"]
    assert sorted(versions, key=kube_version_priority) == [
        "v2",
        "v1",
        "v1beta2",
        "v1beta1",
        "v1alpha1",
        "foo",
    ]

    def crd(kind, versions):
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{kind.lower()}s.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": f"{kind.lower()}s"},
                "versions": [
                    {"name": v, "served": True, "storage": i == 0} for i, v in enumerate(versions)
                ],
            },
        }

    # The first CRD of the group is alpha-only; the group still prefers v1beta2 (as CAPI's
    # IPAM group does with our v1alpha1 pools in it).
    with EmulatedKubernetes(
        crds=[crd("Pool", ["v1alpha1"]), crd("Claim", ["v1beta2", "v1beta1"])]
    ) as kube:
        groups = kubernetes.client.ApisApi(kube.api_client()).get_api_versions().groups
        (group,) = [g for g in groups if g.name == "example.com"]
        assert group.preferred_version.version == "v1beta2"
        assert [v.version for v in group.versions] == ["v1beta2", "v1beta1", "v1alpha1"]
