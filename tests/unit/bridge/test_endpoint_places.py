"""control_plane: the objects a Cluster names get the endpoint before the Cluster, with fakes.

`reconcile_cluster` over the fakes of test_control_plane_endpoints.py, with a fake of the
referenced objects (`FakeTargets`): the order of writes, a conflict (409) on a named object,
a kind that is not served, an object not created yet.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from test_control_plane_endpoints import World

from bridge.capi import ObjectRef
from bridge.reconcilers.control_plane import POOL_ANNOTATION, UNPAUSE_ANNOTATION, EndpointReason
from bridge.runtime.gateway import NotServedError, Outcome, Resource, Write
from bridge.runtime.workqueue import Result

INFRA = "infrastructure.cluster.x-k8s.io"
KCP = "controlplane.cluster.x-k8s.io"
KUBE_VIP = """\
apiVersion: v1
kind: Pod
spec:
  containers:
  - name: kube-vip
    env:
    - name: address
"""


class FakeTargets:
    """The objects a Cluster names, by kind; merge patches guarded by resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {
            "VSphereCluster": {
                "metadata": {"resourceVersion": "1"},
                "spec": {"controlPlaneEndpoint": {"port": 6443}},
            },
            "KubeadmControlPlane": {
                "metadata": {"resourceVersion": "1"},
                "spec": {
                    "kubeadmConfigSpec": {
                        "files": [
                            {"path": "/etc/kubernetes/manifests/kube-vip.yaml", "content": KUBE_VIP}
                        ]
                    }
                },
            },
        }
        self.patches: list[str] = []
        self.conflict_once: set[str] = set()
        self.not_served: set[str] = set()

    def referenced_resource(self, ref: ObjectRef) -> Resource:
        if ref.kind in self.not_served:
            raise NotServedError(f"{ref.kind}.{ref.group} is not served")
        return Resource(ref.group, "v1beta2", ref.kind.lower() + "s", ref.kind)

    def get_referenced(self, namespace: str, ref: ObjectRef) -> dict[str, Any] | None:
        self.referenced_resource(ref)
        found = self.objects.get(ref.kind)
        return copy.deepcopy(found) if found is not None else None

    def patch_referenced(self, namespace: str, ref: ObjectRef, patch: Mapping[str, Any]) -> Write:
        stored = self.objects[ref.kind]
        if ref.kind in self.conflict_once:
            self.conflict_once.discard(ref.kind)
            stored["metadata"]["resourceVersion"] += "0"  # changed meanwhile
        if patch["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            return Write(Outcome.CONFLICT)
        self.patches.append(ref.kind)
        for key, value in patch["spec"].items():
            stored["spec"][key] = {**stored["spec"].get(key, {}), **value}
        stored["metadata"]["resourceVersion"] += "1"
        return Write(Outcome.WRITTEN, copy.deepcopy(stored))


REFS = {
    "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": "wl1"},
    "controlPlaneRef": {"apiGroup": KCP, "kind": "KubeadmControlPlane", "name": "wl1"},
}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[World, FakeTargets]:
    world = World(monkeypatch)
    targets = FakeTargets()
    world.ctx.clusters.targets = targets
    world.add_cluster(
        paused=True,
        annotations={POOL_ANNOTATION: "PHPIPAMIPPool/pool", UNPAUSE_ANNOTATION: "true"},
        **copy.deepcopy(REFS),
    )
    assert world.reconcile() == Result.done()  # the claim
    world.bind()
    return world, targets


def test_named_objects_first_the_cluster_last_each_once(world: tuple[World, FakeTargets]) -> None:
    w, targets = world
    assert w.reconcile() == Result.done()
    assert targets.patches == ["VSphereCluster", "KubeadmControlPlane"]
    (patch,) = w.kube.of("cluster.patch")
    assert patch.detail["spec"]["paused"] is False
    host = targets.objects["VSphereCluster"]["spec"]["controlPlaneEndpoint"]["host"]
    assert patch.detail["spec"]["controlPlaneEndpoint"]["host"] == host
    copied = [e for e in w.kube.events if e[1] == EndpointReason.COPIED]
    assert [e[2].split(" ")[0] for e in copied] == ["VSphereCluster", "KubeadmControlPlane"]
    assert w.reconcile() == Result.done()  # a second pass writes nothing
    assert targets.patches == ["VSphereCluster", "KubeadmControlPlane"]
    assert len(w.kube.of("cluster.patch")) == 1


def test_a_conflict_on_a_named_object_decides_again_before_the_cluster(
    world: tuple[World, FakeTargets],
) -> None:
    w, targets = world
    targets.conflict_once.add("KubeadmControlPlane")
    assert w.reconcile() == Result.requeue_after(1.0)
    assert targets.patches == ["VSphereCluster"]
    assert w.kube.of("cluster.patch") == []  # not unpaused before kube-vip has the address
    assert w.reconcile() == Result.done()
    assert targets.patches == ["VSphereCluster", "KubeadmControlPlane"]
    assert len(w.kube.of("cluster.patch")) == 1


def test_a_kind_not_served_is_told_and_the_cluster_stays_paused(
    world: tuple[World, FakeTargets],
) -> None:
    w, targets = world
    targets.not_served.add("VSphereCluster")
    assert w.reconcile() == Result.done()
    assert targets.patches == ["KubeadmControlPlane"]  # the rest goes on
    assert w.kube.of("cluster.patch") == []
    reasons = [e[1] for e in w.kube.events if e[0] == "Warning"]
    assert reasons == [EndpointReason.REFUSED, EndpointReason.WAITING]
    assert w.reconcile() == Result.done()  # told once
    assert [e[1] for e in w.kube.events if e[0] == "Warning"] == reasons


def test_an_object_not_created_yet_is_read_again_later(world: tuple[World, FakeTargets]) -> None:
    w, targets = world
    kcp = targets.objects.pop("KubeadmControlPlane")
    assert w.reconcile() == Result.requeue_after(5.0)
    assert targets.patches == ["VSphereCluster"]
    assert w.kube.of("cluster.patch") == []
    targets.objects["KubeadmControlPlane"] = kcp
    assert w.reconcile() == Result.done()
    assert targets.patches == ["VSphereCluster", "KubeadmControlPlane"]
    assert len(w.kube.of("cluster.patch")) == 1


def test_a_cluster_not_to_unpause_gets_its_endpoint_while_an_object_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World(monkeypatch)
    targets = FakeTargets()
    w.ctx.clusters.targets = targets
    w.add_cluster(**copy.deepcopy(REFS))
    assert w.reconcile() == Result.done()
    w.bind()
    del targets.objects["VSphereCluster"]
    assert w.reconcile() == Result.requeue_after(5.0)  # read again later
    assert targets.patches == ["KubeadmControlPlane"]
    assert len(w.kube.of("cluster.patch")) == 1
