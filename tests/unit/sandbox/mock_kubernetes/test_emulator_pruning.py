"""Structural-schema pruning of custom resources (real-cluster.md item 8), per CRD version.

Fields unknown to the ``openAPIV3Schema`` of the version in the request are dropped on every
write of the main resource and of ``/status``, with a ``Warning`` header each; a write of only
such fields is then a no-op (same resourceVersion, no watch event).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import requests

from mock_kubernetes import EmulatedKubernetes, resources_from_crd
from mock_kubernetes.schema import prune

CAPI_CRDS = Path(__file__).resolve().parents[3] / "data" / "capi-crds"
GROUP = "ipam.cluster.x-k8s.io"
MERGE = "application/merge-patch+json"


def claims_crd(release: str) -> Path:
    return CAPI_CRDS / release / "ipam.cluster.x-k8s.io_ipaddressclaims.yaml"


V1BETA1_CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "AddressAllocated",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}
METAV1_CONDITION = {**V1BETA1_CONDITION, "message": ""}
#: A pool reference the schemas of every CAPI release accept (kind and name are required).
POOL_REF = {"kind": "PHPIPAMIPPool", "name": "p"}


def claim(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "labels": {"l": "1"}, "annotations": {"a": "1"}},
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "pool"}},
        **extra,
    }


def events_since(kube: EmulatedKubernetes, path: str, rv: str) -> list[dict[str, Any]]:
    """Watch events of ``path`` after resourceVersion ``rv`` (the history, replayed at once)."""
    params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "0.2"}
    with requests.get(kube.url + path, params=params, stream=True, timeout=5) as response:
        return [json.loads(line) for line in response.iter_lines() if line]


@pytest.fixture
def capi_1_8() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=[claims_crd("v1.8.12")]) as kube:
        yield kube


def test_prune_follows_the_structural_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"x": {"type": "integer"}}},
                    },
                    "byName": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"k": {"type": "string"}},
                        },
                    },
                    "anything": {"type": "object", "additionalProperties": True},
                    "free": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "known": {"type": "object", "properties": {"y": {"type": "string"}}}
                        },
                    },
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "properties": {"spec": {"type": "object"}},
                    },
                },
            },
        },
    }
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Thing",
        "metadata": {"name": "t", "anything": "metadata is not pruned by the CRD schema"},
        "spec": {
            "name": "n",
            "gone": 1,
            "items": [{"x": 1, "y": 2}, {"z": 3}],
            "byName": {"a": {"k": "v", "drop": True}, "b": {}},
            "anything": {"any": {"deep": [1]}},
            "free": {"kept": {"z": 1}, "known": {"y": "1", "drop": 2}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}, "x": 1},
        },
        "status": {"s": 1},
    }
    dropped = prune(obj, schema)
    assert dropped == [
        "spec.gone",
        "spec.items[0].y",
        "spec.items[1].z",
        "spec.byName.a.drop",
        "spec.free.known.drop",
        "spec.template.x",
        "status",
    ]
    assert obj == {
        "apiVersion": "example.com/v1",
        "kind": "Thing",
        "metadata": {"name": "t", "anything": "metadata is not pruned by the CRD schema"},
        "spec": {
            "name": "n",
            "items": [{"x": 1}, {}],
            "byName": {"a": {"k": "v"}, "b": {}},
            "anything": {"any": {"deep": [1]}},
            "free": {"kept": {"z": 1}, "known": {"y": "1"}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}},
        },
    }


def test_resources_from_crd_keeps_each_versions_schema() -> None:
    defn = resources_from_crd(claims_crd("v1.14.0"))
    assert set(defn.schemas) == {"v1alpha1", "v1beta1", "v1beta2"}
    assert "v1beta2" in defn.schema("v1beta1")["properties"]["status"]["properties"]
    assert "v1beta2" not in defn.schema("v1beta2")["properties"]["status"]["properties"]
    assert defn.schema(None) is defn.schemas["v1beta2"]  # the storage version


def test_capi_1_8_claim_status_v1beta2_is_pruned_and_writing_it_again_is_a_noop(
    capi_1_8: EmulatedKubernetes,
) -> None:
    kube = capi_1_8
    with kube.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        created = custom.create_namespaced_custom_object(
            GROUP, "v1beta1", "default", "ipaddressclaims", claim("c", "v1beta1")
        )
        status = {
            "status": {
                "addressRef": {"name": "c"},
                "conditions": [V1BETA1_CONDITION],
                "v1beta2": {"conditions": [METAV1_CONDITION]},
            }
        }
        written = custom.patch_namespaced_custom_object_status(
            GROUP, "v1beta1", "default", "ipaddressclaims", "c", status
        )
        assert written["status"] == {"addressRef": {"name": "c"}, "conditions": [V1BETA1_CONDITION]}
        assert written["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
        rv = written["metadata"]["resourceVersion"]

        # Reading back shows nothing under v1beta2; writing it again changes nothing at all.
        again = custom.patch_namespaced_custom_object_status(
            GROUP, "v1beta1", "default", "ipaddressclaims", "c", status
        )
        only_pruned = custom.patch_namespaced_custom_object_status(
            GROUP,
            "v1beta1",
            "default",
            "ipaddressclaims",
            "c",
            {"status": {"v1beta2": {"conditions": [METAV1_CONDITION]}}},
        )
    assert again == written and only_pruned == written
    assert only_pruned["metadata"]["resourceVersion"] == rv
    assert events_since(kube, f"/apis/{GROUP}/v1beta1/ipaddressclaims", rv) == []


def test_pruned_fields_are_named_in_warning_headers(capi_1_8: EmulatedKubernetes) -> None:
    kube = capi_1_8
    path = f"/apis/{GROUP}/v1beta1/namespaces/default/ipaddressclaims"
    response = requests.post(
        kube.url + path, json=claim("c", "v1beta1", spec={"poolRef": POOL_REF, "x": 1}), timeout=5
    )
    assert response.status_code == 201 and "x" not in response.json()["spec"]
    assert response.headers["Warning"] == '299 - "unknown field \\"spec.x\\""'
    response = requests.patch(
        kube.url + path + "/c/status",
        json={"status": {"kopf": {"progress": {}}, "v1beta2": {}}},
        headers={"Content-Type": MERGE},
        timeout=5,
    )
    assert response.status_code == 200 and response.json()["status"] == {}
    assert response.headers["Warning"] == (
        '299 - "unknown field \\"status.kopf\\"", 299 - "unknown field \\"status.v1beta2\\""'
    )


def test_main_resource_writes_are_pruned_and_a_pruned_only_write_is_a_noop(
    capi_1_8: EmulatedKubernetes,
) -> None:
    with capi_1_8.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        created = custom.create_namespaced_custom_object(
            GROUP,
            "v1beta1",
            "default",
            "ipaddressclaims",
            claim("c", "v1beta1", spec={"poolRef": {**POOL_REF, "extra": 1}, "unknown": "x"}),
        )
        assert created["spec"] == {"poolRef": POOL_REF}
        patched = custom.patch_namespaced_custom_object(
            GROUP, "v1beta1", "default", "ipaddressclaims", "c", {"spec": {"unknown": "y"}}
        )
        replaced = custom.replace_namespaced_custom_object(
            GROUP,
            "v1beta1",
            "default",
            "ipaddressclaims",
            "c",
            {**copy.deepcopy(created), "spec": {"poolRef": POOL_REF, "more": 1}},
        )
    rv = created["metadata"]["resourceVersion"]
    assert patched["metadata"]["resourceVersion"] == rv
    assert replaced["metadata"]["resourceVersion"] == rv
    assert replaced["metadata"]["labels"] == {"l": "1"}  # metadata is never pruned by the schema
    assert events_since(capi_1_8, f"/apis/{GROUP}/v1beta1/ipaddressclaims", rv) == []


@pytest.mark.parametrize(
    ("release", "version", "kept"),
    [
        ("v1.8.12", "v1beta1", False),  # CAPI < 1.9: no status.v1beta2
        ("v1.10.10", "v1beta1", True),
        ("v1.14.0", "v1beta1", True),
        ("v1.14.0", "v1beta2", False),  # the v1beta2 schema has no status.v1beta2 field
    ],
)
def test_pruning_uses_the_schema_of_the_version_in_the_request(
    release: str, version: str, kept: bool
) -> None:
    with EmulatedKubernetes(crds=[claims_crd(release)]) as kube:
        kube.create({**claim("c", version), "metadata": {"name": "c", "namespace": "default"}})
        written = kube.patch(
            f"{GROUP}/{version}",
            "ipaddressclaims",
            "c",
            # addressRef: a status of v1.14's v1beta2 has at least one property
            {
                "status": {
                    "addressRef": {"name": "a"},
                    "v1beta2": {"conditions": [METAV1_CONDITION]},
                }
            },
            "default",
            subresource="status",
        )
    assert ("v1beta2" in written.get("status", {})) is kept


def test_builtin_resources_and_schemaless_crds_are_not_pruned(kube: EmulatedKubernetes) -> None:
    cm = kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "default"},
            "data": {"a": "1"},
            "whatever": 1,
        }
    )
    assert cm["whatever"] == 1
    widget = kube.create(
        {
            "apiVersion": "example.com/v2",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default"},
            "spec": {"anything": {"goes": True}},
        }
    )
    assert widget["spec"] == {"anything": {"goes": True}}  # x-kubernetes-preserve-unknown-fields
