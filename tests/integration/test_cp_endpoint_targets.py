"""The control-plane VIP in every place a Cluster without a ClusterClass needs it (issue 30).

CAPV v1.16.1's own ``cluster-template.yaml``, rendered as ``clusterctl generate cluster``
does with the VIP left empty (`mock_kubernetes.capv.generate_cluster`), applied to the
in-memory API server serving CAPI's Cluster CRD, CAPI v1.14's KubeadmControlPlane CRD and
CAPV's VSphereCluster CRD (v1beta2; v1beta1 only for the v1.10 runs), with the real operator
and the phpIPAM mock over HTTP. The operator's writes are counted in the emulator's access
log (the tests' own writes do not go through HTTP).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration_env import NAMESPACE, schemaless_crd
from moving import PHPIPAM_MOVE, assert_only_owners_rewritten, clusterctl_move
from test_cp_endpoint import capi_sandbox, infoblox_dns_pool, phpipam_pool

from bridge.reconcilers.control_plane import HOST_ANNOTATION, POOL_ANNOTATION, UNPAUSE_ANNOTATION
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.capv import CRDS, generate_cluster
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

ASK = {POOL_ANNOTATION: "PHPIPAMIPPool/vips", UNPAUSE_ANNOTATION: "true"}
INFRA = "infrastructure.cluster.x-k8s.io"
KCP = "controlplane.cluster.x-k8s.io"
#: ``clusterctl generate cluster``'s variables; CONTROL_PLANE_ENDPOINT_IP left out (empty).
VALUES = {
    "CLUSTER_NAME": "wl1",
    "NAMESPACE": NAMESPACE,
    "CONTROL_PLANE_MACHINE_COUNT": "1",
    "KUBERNETES_VERSION": "v1.33.0",
    "VSPHERE_SERVER": "vcenter.example",
    "VSPHERE_TLS_THUMBPRINT": "01:02:03:04",
    "VSPHERE_SSH_AUTHORIZED_KEY": "ssh-ed25519 AAAAC3Nz test",
}
PLURALS = {"VSphereCluster": "vsphereclusters", "KubeadmControlPlane": "kubeadmcontrolplanes"}


@pytest.fixture(params=["v1.14", "v1.10"])
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def capv_sandbox(make_sandbox: Callable[..., Sandbox], release: str, **kwargs: Any) -> Sandbox:
    """Return a sandbox serving ``release``'s Cluster CRD and CAPV's and CAPI's CRDs."""
    return capi_sandbox(make_sandbox, release, *CRDS, **kwargs)


def _v1beta1(body: dict[str, Any]) -> dict[str, Any]:
    """CAPV's v1beta2 objects as a v1beta1 management cluster takes them (refs by apiVersion)."""
    body = copy.deepcopy(body)
    body["apiVersion"] = body["apiVersion"].rpartition("/")[0] + "/v1beta1"
    spec = body["spec"]
    if body["kind"] == "Cluster":
        for key in ("infrastructureRef", "controlPlaneRef"):
            ref = spec[key]
            spec[key] = {
                "apiVersion": f"{ref.pop('apiGroup')}/v1beta1",
                "kind": ref["kind"],
                "name": ref["name"],
                "namespace": NAMESPACE,
            }
    elif body["kind"] == "KubeadmControlPlane":  # v1beta1 extraArgs are maps: keep the files
        files = spec["kubeadmConfigSpec"]["files"]
        spec["kubeadmConfigSpec"] = {"files": files}
        spec["machineTemplate"] = {
            "infrastructureRef": {
                "apiVersion": f"{INFRA}/v1beta1",
                "kind": "VSphereMachineTemplate",
                "name": body["metadata"]["name"],
            }
        }
    return body


def apply_template(
    sandbox: Sandbox, name: str = "wl1", annotations: dict[str, str] | None = None, **values: str
) -> dict[str, dict[str, Any]]:
    """Create CAPV's Cluster, VSphereCluster and KubeadmControlPlane, the Cluster paused."""
    variables = {**VALUES, "CLUSTER_NAME": name, **values}
    created = {}
    for body in generate_cluster(variables):
        if body["kind"] == "Cluster":
            body["metadata"]["annotations"] = dict(ASK if annotations is None else annotations)
            body["spec"]["paused"] = True
        if sandbox.version == "v1beta1":
            body = _v1beta1(body)
        created[body["kind"]] = sandbox.create(body)
    return created


def get(sandbox: Sandbox, kind: str, name: str = "wl1") -> dict[str, Any]:
    group = {"Cluster": "cluster.x-k8s.io", "VSphereCluster": INFRA}.get(kind, KCP)
    plural = PLURALS.get(kind, "clusters")
    found = sandbox.get_object(f"{group}/{sandbox.version}", plural, name, NAMESPACE)
    assert found is not None
    return found


def kube_vip(kcp: dict[str, Any]) -> dict[str, Any]:
    files = kcp["spec"]["kubeadmConfigSpec"]["files"]
    item = next(f for f in files if f["path"].endswith("kube-vip.yaml"))
    return dict(yaml.safe_load(item["content"]))


def vip_of(kcp: dict[str, Any]) -> str | None:
    (container,) = [c for c in kube_vip(kcp)["spec"]["containers"] if c["name"] == "kube-vip"]
    return next((e.get("value") for e in container["env"] if e["name"] == "address"), None)


def writes(sandbox: Sandbox, resource: str | None = None) -> list[tuple[str, str]]:
    """The operator's allowed writes (resource, verb) to Clusters, VSphereClusters, KCPs."""
    kept = ("clusters", *PLURALS.values())
    return [
        (r.resource, r.verb)
        for r in sandbox.kube.access_log.records(sandbox.identity, allowed=True)
        if r.resource in kept
        and r.verb in ("patch", "update", "create")
        and (resource is None or r.resource == resource)
    ]


def reads(sandbox: Sandbox, resource: str) -> int:
    return sum(
        1
        for r in sandbox.kube.access_log.records(sandbox.identity)
        if r.resource == resource and r.verb == "get"
    )


def events(sandbox: Sandbox, reason: str) -> list[dict[str, Any]]:
    return [e for e in sandbox.events(NAMESPACE) if e.get("reason") == reason]


def endpoint_of(cluster: dict[str, Any]) -> dict[str, Any]:
    return dict(cluster["spec"].get("controlPlaneEndpoint") or {})


def test_capv_template_without_vip_gets_it_in_all_three_places_once(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer, release: str
) -> None:
    sandbox = capv_sandbox(make_sandbox, release)
    phpipam_pool(sandbox, phpipam)
    created = apply_template(sandbox)
    assert endpoint_of(created["VSphereCluster"]) == {"port": 6443}
    assert vip_of(created["KubeadmControlPlane"]) is None

    wait_for(
        lambda: get(sandbox, "Cluster")["spec"].get("paused") is False,
        timeout=30,
        message="the Cluster unpaused",
    )
    (address,) = [a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)]
    assert endpoint_of(get(sandbox, "Cluster")) == {"host": address, "port": 6443}
    assert endpoint_of(get(sandbox, "VSphereCluster")) == {"host": address, "port": 6443}
    kcp = get(sandbox, "KubeadmControlPlane")
    assert vip_of(kcp) == address
    # nothing else of the KubeadmControlPlane changed (the manifest compared parsed)
    before, after = created["KubeadmControlPlane"], copy.deepcopy(kcp)
    for body in (before, after):
        for item in body["spec"]["kubeadmConfigSpec"]["files"]:
            if item["path"].endswith("kube-vip.yaml"):
                pod = yaml.safe_load(item["content"])
                for c in pod["spec"]["containers"]:
                    c["env"] = [e for e in c["env"] if e["name"] != "address"]
                item["content"] = json.dumps(pod, sort_keys=True)
    assert after["spec"] == before["spec"]
    # one write each, the Cluster last
    assert writes(sandbox) == [
        ("vsphereclusters", "patch"),
        ("kubeadmcontrolplanes", "patch"),
        ("clusters", "patch"),
    ]
    wait_for(lambda: events(sandbox, "ControlPlaneEndpointSet"), timeout=20, message="Event")
    copied = events(sandbox, "ControlPlaneEndpointCopied")
    assert sorted(e["message"].split(" ")[0] for e in copied) == [
        "KubeadmControlPlane",
        "VSphereCluster",
    ]
    assert all(address in e["message"] for e in copied)

    # State, not history: a restart and a Cluster event write nothing more.
    sandbox.stop_operator()
    seen = reads(sandbox, "kubeadmcontrolplanes")
    sandbox.start_operator()
    sandbox.kube.patch(
        f"cluster.x-k8s.io/{sandbox.version}",
        "clusters",
        "wl1",
        {"metadata": {"labels": {"touched": "yes"}}},
        NAMESPACE,
    )
    wait_for(
        lambda: reads(sandbox, "kubeadmcontrolplanes") > seen,
        timeout=20,
        message="the restarted operator deciding the Cluster again",
    )
    assert len(writes(sandbox)) == 3
    assert len(events(sandbox, "ControlPlaneEndpointCopied")) == 2


def test_a_control_plane_with_machines_and_a_set_host_are_never_written(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    sandbox = capv_sandbox(make_sandbox, "v1.14")
    phpipam_pool(sandbox, phpipam)
    apply_template(sandbox, "wl1")
    sandbox.kube.patch(
        f"{KCP}/v1beta2",
        "kubeadmcontrolplanes",
        "wl1",
        {"status": {"replicas": 1}},
        NAMESPACE,
        subresource="status",
    )
    apply_template(sandbox, "wl2")
    sandbox.kube.patch(
        f"{INFRA}/v1beta2",
        "vsphereclusters",
        "wl2",
        {"spec": {"controlPlaneEndpoint": {"host": "192.0.2.10"}}},
        NAMESPACE,
    )
    rollout = wait_for(
        lambda: events(sandbox, "ControlPlaneEndpointWouldRollOut"), timeout=30, message="rollout"
    )
    conflict = wait_for(
        lambda: [
            e
            for e in events(sandbox, "ControlPlaneEndpointConflict")
            if e["involvedObject"]["name"] == "wl2"
        ],
        timeout=30,
        message="conflict",
    )
    assert rollout[0]["type"] == "Warning"
    assert "KubeadmControlPlane" in rollout[0]["message"] and "1 Machine" in rollout[0]["message"]
    assert "VSphereCluster" in conflict[0]["message"] and "192.0.2.10" in conflict[0]["message"]
    wait_for(
        lambda: len(events(sandbox, "ControlPlaneEndpointWaiting")) == 2,
        timeout=30,
        message="both Clusters waiting",
    )
    # the rest went on: wl1's VSphereCluster and wl2's KubeadmControlPlane got the address
    addresses = {a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}
    assert endpoint_of(get(sandbox, "VSphereCluster", "wl1"))["host"] in addresses
    assert vip_of(get(sandbox, "KubeadmControlPlane", "wl2")) in addresses
    assert vip_of(get(sandbox, "KubeadmControlPlane", "wl1")) is None
    assert endpoint_of(get(sandbox, "VSphereCluster", "wl2"))["host"] == "192.0.2.10"
    for name in ("wl1", "wl2"):
        cluster = get(sandbox, "Cluster", name)
        assert cluster["spec"]["paused"] is True and not endpoint_of(cluster)
    assert sorted(writes(sandbox)) == [
        ("kubeadmcontrolplanes", "patch"),
        ("vsphereclusters", "patch"),
    ]


def test_clusterctl_move_into_a_running_operator_writes_nothing(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    source = capv_sandbox(make_sandbox, "v1.14")
    target = capv_sandbox(make_sandbox, "v1.14")
    phpipam_pool(source, phpipam)
    apply_template(source)
    wait_for(
        lambda: get(source, "Cluster")["spec"].get("paused") is False,
        timeout=30,
        message="the source Cluster unpaused",
    )
    (address,) = source.addresses(NAMESPACE)
    clusters = "cluster.x-k8s.io/v1beta2"
    source.kube.patch(clusters, "clusters", "wl1", {"spec": {"paused": True}}, NAMESPACE)
    phpipam.store.clear_journal()
    # clusterctl move: the Cluster (paused) and its objects, the pool and its Secret, the claim
    # and its IPAddress copied to the target; then annotated, deleted and stripped at the
    # source, whose operator is still running.
    clusterctl_move(
        source,
        target,
        [
            (clusters, "clusters"),
            (f"{INFRA}/v1beta2", "vsphereclusters"),
            (f"{KCP}/v1beta2", "kubeadmcontrolplanes"),
            *PHPIPAM_MOVE,
        ],
    )
    source.wait_gone(NAMESPACE, timeout=15)
    target.kube.patch(clusters, "clusters", "wl1", {"spec": {"paused": False}}, NAMESPACE)
    target.wait_claims_bound(NAMESPACE, 1, timeout=20)
    wait_for(
        lambda: reads(target, "kubeadmcontrolplanes") > 0,
        timeout=20,
        message="the target's operator deciding the moved Cluster",
    )
    assert writes(target) == []
    assert vip_of(get(target, "KubeadmControlPlane")) == address["spec"]["address"]
    assert [a["spec"] for a in target.addresses(NAMESPACE)] == [address["spec"]]
    # Nothing allocated, nothing released: the target wrote itself as the entry's owner.
    assert_only_owners_rewritten(phpipam, target, 1)


DOCKER_CLUSTER_CRD = schemaless_crd(INFRA, "v1beta2", "DockerCluster", "dockerclusters")


def test_a_kind_the_operator_may_not_patch_names_the_rule_and_the_rest_goes_on(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer, tmp_path: Path
) -> None:
    crd = tmp_path / "dockerclusters.yaml"
    crd.write_text(yaml.safe_dump(DOCKER_CLUSTER_CRD))
    sandbox = capi_sandbox(make_sandbox, "v1.14", *CRDS, crd, identity="operator")
    phpipam_pool(sandbox, phpipam)
    objects = {o["kind"]: o for o in generate_cluster(VALUES)}
    sandbox.create(
        {
            "apiVersion": f"{INFRA}/v1beta2",
            "kind": "DockerCluster",
            "metadata": {"name": "wl1", "namespace": NAMESPACE},
            "spec": {},
        }
    )
    sandbox.create(objects["KubeadmControlPlane"])
    cluster = objects["Cluster"]
    cluster["spec"]["infrastructureRef"] = {
        "apiGroup": INFRA,
        "kind": "DockerCluster",
        "name": "wl1",
    }
    cluster["spec"]["paused"] = True
    cluster["metadata"]["annotations"] = dict(ASK)
    sandbox.create(cluster)
    (forbidden,) = wait_for(
        lambda: events(sandbox, "ControlPlaneEndpointForbidden"), timeout=30, message="403"
    )
    assert forbidden["type"] == "Warning"
    assert (
        "DockerCluster" in forbidden["message"]
        and "resources: [dockerclusters]" in forbidden["message"]
    )
    assert (
        f"add the rule {{apiGroups: [{INFRA}], resources: [dockerclusters], verbs: [get, patch]}}"
        " to its ClusterRole" in forbidden["message"]
    )
    (address,) = [a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)]
    wait_for(
        lambda: vip_of(get(sandbox, "KubeadmControlPlane")) == address,
        timeout=30,
        message="the KubeadmControlPlane written all the same",
    )
    wait_for(lambda: events(sandbox, "ControlPlaneEndpointWaiting"), timeout=30, message="waits")
    assert get(sandbox, "Cluster")["spec"]["paused"] is True
    assert writes(sandbox) == [("kubeadmcontrolplanes", "patch")]


def test_a_dns_endpoint_goes_into_cert_sans_with_the_address(
    make_sandbox: Callable[..., Sandbox], infoblox: MockInfobloxServer
) -> None:
    sandbox = capv_sandbox(make_sandbox, "v1.14")
    infoblox_dns_pool(sandbox, infoblox)
    created = apply_template(
        sandbox,
        annotations={
            POOL_ANNOTATION: "InfobloxIPPool/ib",
            UNPAUSE_ANNOTATION: "true",
            HOST_ANNOTATION: "dns",
        },
    )
    wait_for(
        lambda: get(sandbox, "Cluster")["spec"].get("paused") is False,
        timeout=30,
        message="the Cluster unpaused",
    )
    fqdn = f"wl1-control-plane-endpoint.{NAMESPACE}.nodes.example.com"
    (address,) = [a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)]
    assert endpoint_of(get(sandbox, "Cluster"))["host"] == fqdn
    assert endpoint_of(get(sandbox, "VSphereCluster"))["host"] == fqdn
    kcp = get(sandbox, "KubeadmControlPlane")
    assert vip_of(kcp) == address  # kube-vip advertises the address itself
    config = kcp["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]
    assert config["apiServer"]["certSANs"] == [fqdn, address]
    before = created["KubeadmControlPlane"]["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]
    assert {k: v for k, v in config.items() if k != "apiServer"} == before
    assert writes(sandbox, "kubeadmcontrolplanes") == [("kubeadmcontrolplanes", "patch")]
