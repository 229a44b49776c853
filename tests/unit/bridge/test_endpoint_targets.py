"""Where the control-plane VIP goes besides the Cluster, on CAPV v1.16.1's own template as data.

``tests/data/capv-v1.16.1/cluster-template.yaml`` rendered as ``clusterctl generate cluster``
does with the VIP left empty (``CONTROL_PLANE_ENDPOINT_IP`` unset): the VSphereCluster's and
the KubeadmControlPlane's edits (`bridge.reconcilers.endpoint_targets`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.reconcilers.endpoint_targets import (
    plan_control_plane,
    plan_infra_cluster,
    set_kube_vip_address,
)

TEMPLATE = Path(__file__).resolve().parents[2] / "data" / "capv-v1.16.1" / "cluster-template.yaml"
VIP = "10.0.0.5"
VARS = {"CLUSTER_NAME": "wl1", "NAMESPACE": "default", "CONTROL_PLANE_MACHINE_COUNT": "1"}


def render(values: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The template's objects by kind, variables replaced as clusterctl does (unset: empty)."""

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3)
        return values.get(name, default if default is not None else "")

    text = re.sub(r"\$\{([A-Z_]+)(:=([^}]*))?\}", value, TEMPLATE.read_text(encoding="utf-8"))
    docs = [d for d in yaml.safe_load_all(text) if d]
    return {d["kind"]: d for d in docs}


def stored(body: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """``body`` as the API server stores it: nulls dropped, a resourceVersion."""

    def prune(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [prune(v) for v in value]
        return value

    out: dict[str, Any] = prune(copy.deepcopy(body))
    out["metadata"]["resourceVersion"] = version
    return out


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def kube_vip(kcp: dict[str, Any]) -> dict[str, Any]:
    files = kcp["spec"]["kubeadmConfigSpec"]["files"]
    item = next(f for f in files if f["path"].endswith("kube-vip.yaml"))
    return dict(yaml.safe_load(item["content"]))


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-vip")
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.fixture
def objects() -> dict[str, dict[str, Any]]:
    return {kind: stored(body) for kind, body in render(VARS).items()}


def test_the_generated_template_lacks_the_vip_in_both_places(
    objects: dict[str, dict[str, Any]],
) -> None:
    assert objects["VSphereCluster"]["spec"]["controlPlaneEndpoint"] == {"port": 6443}
    assert env_of(kube_vip(objects["KubeadmControlPlane"]))["address"] is None


def test_vspherecluster_gets_host_and_keeps_its_port(objects: dict[str, dict[str, Any]]) -> None:
    body = objects["VSphereCluster"]
    plan = plan_infra_cluster(body, host=VIP, cluster_port=0)
    assert plan.patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"controlPlaneEndpoint": {"host": VIP, "port": 6443}},
    }
    after = merge(body, plan.patch)
    assert after["spec"]["controlPlaneEndpoint"] == {"host": VIP, "port": 6443}
    assert {k: v for k, v in after["spec"].items() if k != "controlPlaneEndpoint"} == {
        k: v for k, v in body["spec"].items() if k != "controlPlaneEndpoint"
    }
    assert plan_infra_cluster(after, host=VIP, cluster_port=0).settled  # a second pass: nothing


def test_infra_cluster_port_from_the_cluster_else_6443() -> None:
    body = {"metadata": {"resourceVersion": "1"}, "spec": {}}
    port_of = lambda p: p.patch["spec"]["controlPlaneEndpoint"]["port"]  # noqa: E731
    assert port_of(plan_infra_cluster(body, host=VIP, cluster_port=8443)) == 8443
    assert port_of(plan_infra_cluster(body, host=VIP, cluster_port=0)) == 6443


def test_infra_cluster_host_set_to_another_value_is_a_conflict() -> None:
    body = {"metadata": {}, "spec": {"controlPlaneEndpoint": {"host": "10.9.9.9", "port": 6443}}}
    plan = plan_infra_cluster(body, host=VIP, cluster_port=0)
    assert plan.patch is None
    assert plan.conflict is not None and "10.9.9.9" in plan.conflict and VIP in plan.conflict


def test_kcp_gets_the_kube_vip_address_and_nothing_else_changes(
    objects: dict[str, dict[str, Any]],
) -> None:
    kcp = objects["KubeadmControlPlane"]
    plan = plan_control_plane(kcp, address=VIP)
    assert plan.patch is not None and plan.conflict is None and plan.blocked is None
    assert plan.patch["metadata"] == {"resourceVersion": "7"}
    assert list(plan.patch["spec"]["kubeadmConfigSpec"]) == ["files"]
    after = merge(kcp, plan.patch)
    assert env_of(kube_vip(after))["address"] == VIP
    # every other field of the manifest, parsed, stays equal
    before_pod, after_pod = kube_vip(kcp), kube_vip(after)
    for pod in (before_pod, after_pod):
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-vip")
        container["env"] = [e for e in container["env"] if e["name"] != "address"]
    assert after_pod == before_pod
    # every other file and field of the KubeadmControlPlane stays equal
    old_files = kcp["spec"]["kubeadmConfigSpec"]["files"]
    new_files = after["spec"]["kubeadmConfigSpec"]["files"]
    assert [f["path"] for f in new_files] == [f["path"] for f in old_files]
    for old, new in zip(old_files, new_files, strict=True):
        if not old["path"].endswith("kube-vip.yaml"):
            assert new == old
        else:
            assert {k: v for k, v in new.items() if k != "content"} == {
                k: v for k, v in old.items() if k != "content"
            }
    strip = lambda o: {  # noqa: E731
        **o,
        "spec": {
            **o["spec"],
            "kubeadmConfigSpec": {
                k: v for k, v in o["spec"]["kubeadmConfigSpec"].items() if k != "files"
            },
        },
    }
    assert strip(after) == strip(kcp)
    assert plan_control_plane(after, address=VIP).settled  # a second pass: nothing


def test_kcp_with_machines_is_never_changed(objects: dict[str, dict[str, Any]]) -> None:
    kcp = objects["KubeadmControlPlane"]
    kcp["status"] = {"replicas": 1}
    plan = plan_control_plane(kcp, address=VIP)
    assert plan.patch is None
    assert plan.blocked is not None and "1 Machine" in plan.blocked
    kcp["status"] = {"replicas": 0}
    assert plan_control_plane(kcp, address=VIP).patch is not None


def test_kube_vip_address_set_to_another_value_is_a_conflict() -> None:
    objects = {
        kind: stored(body)
        for kind, body in render({**VARS, "CONTROL_PLANE_ENDPOINT_IP": "10.9.9.9"}).items()
    }
    plan = plan_control_plane(objects["KubeadmControlPlane"], address=VIP)
    assert plan.patch is None
    assert plan.conflict is not None and "10.9.9.9" in plan.conflict and VIP in plan.conflict


def test_older_manifests_use_vip_address() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "containers": [
                {"name": "kube-vip", "env": [{"name": "vip_address", "value": ""}]},
                {"name": "other", "env": [{"name": "address", "value": ""}]},
            ]
        },
    }
    content, conflict = set_kube_vip_address(yaml.safe_dump(pod), VIP)
    assert conflict is None and content is not None
    parsed = yaml.safe_load(content)
    assert parsed["spec"]["containers"][0]["env"] == [{"name": "vip_address", "value": VIP}]
    assert parsed["spec"]["containers"][1] == pod["spec"]["containers"][1]  # type: ignore[index]
    assert set_kube_vip_address(content, VIP) == (None, None)


def test_no_kube_vip_file_is_settled() -> None:
    kcp = {"metadata": {"resourceVersion": "1"}, "spec": {"kubeadmConfigSpec": {"files": []}}}
    assert plan_control_plane(kcp, address=VIP).settled


def test_dns_endpoint_adds_name_and_address_to_cert_sans(
    objects: dict[str, dict[str, Any]],
) -> None:
    kcp = objects["KubeadmControlPlane"]
    kcp["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]["apiServer"] = {
        "certSANs": ["keep.example"]
    }
    name = "wl1-control-plane-endpoint.default.lab.example"
    plan = plan_control_plane(kcp, address=VIP, dns_name=name)
    assert plan.patch is not None
    after = merge(kcp, plan.patch)
    config = after["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]
    assert config["apiServer"]["certSANs"] == ["keep.example", name, VIP]
    assert (
        config["controllerManager"]
        == kcp["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]["controllerManager"]
    )
    assert plan_control_plane(after, address=VIP, dns_name=name).settled


def test_an_address_endpoint_writes_no_cert_sans(objects: dict[str, dict[str, Any]]) -> None:
    plan = plan_control_plane(objects["KubeadmControlPlane"], address=VIP)
    assert plan.patch is not None
    assert "clusterConfiguration" not in plan.patch["spec"]["kubeadmConfigSpec"]


def test_the_sandbox_carries_the_same_template() -> None:
    from mock_kubernetes.capv import TEMPLATE as SANDBOX_TEMPLATE

    assert SANDBOX_TEMPLATE.read_bytes() == TEMPLATE.read_bytes()


def test_cluster_refs_in_v1beta2_and_v1beta1() -> None:
    from bridge.capi import Cluster, ObjectRef

    (v1beta2,) = [b for b in render(VARS).values() if b["kind"] == "Cluster"]
    cluster = Cluster.from_body(v1beta2)
    assert cluster.infrastructure_ref == ObjectRef(
        "infrastructure.cluster.x-k8s.io", "", "VSphereCluster", "wl1"
    )
    assert cluster.control_plane_ref == ObjectRef(
        "controlplane.cluster.x-k8s.io", "", "KubeadmControlPlane", "wl1"
    )
    v1beta1 = {
        "spec": {
            "controlPlaneRef": {
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "KubeadmControlPlane",
                "name": "cp",
            }
        }
    }
    assert Cluster.from_body(v1beta1).control_plane_ref == ObjectRef(
        "controlplane.cluster.x-k8s.io", "v1beta1", "KubeadmControlPlane", "cp"
    )
    assert Cluster.from_body({"spec": {}}).infrastructure_ref is None


def test_a_kube_vip_container_without_the_var_gets_address() -> None:
    pod = {
        "spec": {"containers": [{"name": "kube-vip", "env": [{"name": "port", "value": "6443"}]}]}
    }
    content, conflict = set_kube_vip_address(yaml.safe_dump(pod), VIP)
    assert conflict is None and content is not None
    assert yaml.safe_load(content)["spec"]["containers"][0]["env"] == [
        {"name": "port", "value": "6443"},
        {"name": "address", "value": VIP},
    ]
