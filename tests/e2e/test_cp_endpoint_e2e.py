"""The control-plane VIP in every place, CAPV's own template (issue 30, DESIGN section 11).

CAPV v1.16.1's own ``cluster-template.yaml``, rendered as ``clusterctl generate cluster`` does
with the VIP left empty (`mock_kubernetes.capv.generate_cluster`), applied in a fresh
namespace of the session's API server (``KUBECONFIG``'s cluster, else the in-memory one);
the real operator in this process, started first as in a management cluster; mock_phpipam
(or ``PHPIPAM_URL``'s phpIPAM). On a real API server its schemas, defaulting and webhooks are
what this checks. The KubeadmControlPlane and VSphereCluster CRDs are applied when the
cluster has none (and deleted afterwards), so it runs on a plain kind cluster as well as a
management cluster (where CAPI's controllers may act on the Cluster once it is unpaused: a
test namespace); the in-memory API server is told to serve them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from e2e_support import (
    ApiServer,
    ClusterKube,
    IpamTarget,
    OperatorThread,
    _crd_client,
    _crd_docs,
)

from bridge.reconcilers.control_plane import POOL_ANNOTATION, UNPAUSE_ANNOTATION
from mock_kubernetes.capv import CRDS, generate_cluster
from mock_kubernetes.sandbox import wait_for

WHERE = {
    "Cluster": ("cluster.x-k8s.io/v1beta2", "clusters"),
    "VSphereCluster": ("infrastructure.cluster.x-k8s.io/v1beta2", "vsphereclusters"),
    "KubeadmControlPlane": ("controlplane.cluster.x-k8s.io/v1beta2", "kubeadmcontrolplanes"),
}


@pytest.fixture(scope="module")
def capv_crds(api_server: ApiServer, cluster_api: Any) -> Iterator[None]:
    """The KubeadmControlPlane and VSphereCluster CRDs, applied when absent, removed after.

    The in-memory API server serves no CRD created through the API: it is told to serve
    them (`mock_kubernetes.EmulatedKubernetes.declare_crd`), for the rest of the session.
    """
    if api_server.emulator is not None:
        for doc in (d for path in CRDS for d in _crd_docs(path)):
            api_server.emulator.declare_crd(doc)
        yield
        return
    from kubernetes.dynamic.exceptions import NotFoundError

    dyn, crds = _crd_client(cluster_api)
    created = []
    for doc in (d for path in CRDS for d in _crd_docs(path)):
        name = doc["metadata"]["name"]
        try:
            dyn.get(crds, name=name)
        except NotFoundError:
            dyn.create(crds, body=doc)
            created.append(name)

    def established(name: str) -> bool:
        status = dyn.get(crds, name=name).to_dict().get("status") or {}
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    for name in created:
        wait_for(lambda n=name: established(n), timeout=60, message=f"CRD {name}")
    yield
    for name in created:
        with contextlib.suppress(NotFoundError):
            dyn.delete(crds, name=name)


def kube_vip_address(kcp: dict[str, Any]) -> str | None:
    for item in kcp["spec"]["kubeadmConfigSpec"]["files"]:
        if item["path"].endswith("kube-vip.yaml"):
            pod = yaml.safe_load(item["content"])
            (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "kube-vip"]
            return next((e.get("value") for e in container["env"] if e["name"] == "address"), None)
    return None


def test_capv_template_without_vip_gets_it_in_all_three_places(
    capv_crds: None,
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    phpipam: IpamTarget,
) -> None:
    operator()  # running first, as in a management cluster: it makes the pool Ready
    cluster.phpipam_pool(
        namespace,
        "vips",
        endpoint=phpipam.endpoint,
        app_id=phpipam.app_id,
        subnet_id=phpipam.subnet_id,
        credentials=phpipam.credentials,
        **phpipam.pool_spec(namespace, cluster),
    )
    cluster.wait_pool_ready(namespace, "vips")
    values = {
        "CLUSTER_NAME": "wl1",
        "NAMESPACE": namespace,
        "CONTROL_PLANE_MACHINE_COUNT": "1",
        "KUBERNETES_VERSION": "v1.33.0",
        "VSPHERE_SERVER": "vcenter.example",
        "VSPHERE_TLS_THUMBPRINT": "01:02:03:04",
        "VSPHERE_SSH_AUTHORIZED_KEY": "ssh-ed25519 AAAAC3Nz e2e",
    }
    created = {}
    for body in generate_cluster(values):
        if body["kind"] == "Cluster":
            body["metadata"]["annotations"] = {
                POOL_ANNOTATION: "PHPIPAMIPPool/vips",
                UNPAUSE_ANNOTATION: "true",
            }
            body["spec"]["paused"] = True
        group, version = WHERE[body["kind"]][0].split("/")
        created[body["kind"]] = cluster.custom.create_namespaced_custom_object(
            group, version, namespace, WHERE[body["kind"]][1], body, field_validation="Strict"
        )

    def read(kind: str) -> dict[str, Any]:
        (api_version, plural), name = WHERE[kind], "wl1"
        group, version = api_version.split("/")
        found = cluster.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        return dict(found)

    wait_for(
        lambda: read("Cluster")["spec"].get("paused") is False,
        timeout=cluster.wait_timeout,
        message="the Cluster unpaused",
    )
    (address,) = [a["spec"]["address"] for a in cluster.addresses(namespace)]
    assert read("Cluster")["spec"]["controlPlaneEndpoint"]["host"] == address
    infra, kcp = read("VSphereCluster"), read("KubeadmControlPlane")
    assert infra["spec"]["controlPlaneEndpoint"] == {"host": address, "port": 6443}
    assert kube_vip_address(kcp) == address
    # one spec write each (metadata.generation counts them)
    for kind, body in (("VSphereCluster", infra), ("KubeadmControlPlane", kcp)):
        before = created[kind]["metadata"]["generation"]
        assert body["metadata"]["generation"] == before + 1, kind
