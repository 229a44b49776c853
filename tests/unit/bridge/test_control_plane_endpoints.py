"""control_plane: a Cluster's control-plane endpoint from the IPAM, decided with fakes.

The annotations (`parse_request`), the claim's name and body, the one Cluster patch
(`plan_patch`), `reconcile_cluster` over a `FakeKube` (what it writes, and that it writes
nothing twice), and the pause exception of `bridge.reconcilers.claims` for endpoint claims.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fakes import (
    FakeBackend,
    FakeIPAM,
    FakeKube,
    FakeQueue,
    install_backend,
    phpipam_pool,
    pool_condition,
)
from kubernetes.client import ApiException

from bridge import capi
from bridge.capi import CLAIM_FINALIZER, CLUSTER_NAME_LABEL, GROUP, Claim, Cluster, PoolRef
from bridge.handlers.resync import _queue_clusters
from bridge.objects.cache import Cache
from bridge.objects.client import ObjectClient
from bridge.objects.keys import cluster_key
from bridge.operator import Operator
from bridge.reconcilers.claims import reconcile_claim
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.control_plane import (
    ENDPOINT_LABEL,
    HOST_ANNOTATION,
    POOL_ANNOTATION,
    UNPAUSE_ANNOTATION,
    VARIABLES_ANNOTATION,
    AnnotationError,
    EndpointReason,
    EndpointRequest,
    allocates_while_paused,
    build_claim,
    endpoint_claim_name,
    parse_request,
    plan_patch,
    reconcile_cluster,
)
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

NS = "ns"
REPO = Path(__file__).resolve().parents[3]
POOL = PoolRef(GROUP, "PHPIPAMIPPool", "pool")


# -- annotations -----------------------------------------------------------------------------


def test_parse_request_reads_every_annotation() -> None:
    assert parse_request({}) is None
    assert parse_request({POOL_ANNOTATION: "PHPIPAMIPPool/pool"}) == EndpointRequest(POOL)
    request = parse_request(
        {
            POOL_ANNOTATION: " GlobalInfobloxIPPool/vips.dc1 ",
            VARIABLES_ANNOTATION: "controlPlaneIpAddr, kubeVipAddress,controlPlaneIpAddr",
            UNPAUSE_ANNOTATION: "true",
            HOST_ANNOTATION: "dns",
        }
    )
    assert request == EndpointRequest(
        PoolRef(GROUP, "GlobalInfobloxIPPool", "vips.dc1"),
        variables=("controlPlaneIpAddr", "kubeVipAddress"),
        unpause=True,
        host_dns=True,
    )


def test_a_kind_not_ours_is_ignored_silently() -> None:
    assert parse_request({POOL_ANNOTATION: "InClusterIPPool/vips"}) is None
    # ... even with other annotations that would be malformed for us.
    assert parse_request({POOL_ANNOTATION: "InClusterIPPool/x", UNPAUSE_ANNOTATION: "?"}) is None


@pytest.mark.parametrize(
    "annotations",
    [
        {POOL_ANNOTATION: "PHPIPAMIPPool"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/"},
        {POOL_ANNOTATION: "/pool"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/Pool_1"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/a/b"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/pool", VARIABLES_ANNOTATION: "a,,b"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/pool", VARIABLES_ANNOTATION: "a b"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/pool", UNPAUSE_ANNOTATION: "yes"},
        {POOL_ANNOTATION: "PHPIPAMIPPool/pool", HOST_ANNOTATION: "fqdn"},
    ],
)
def test_malformed_annotations_are_errors(annotations: dict[str, str]) -> None:
    with pytest.raises(AnnotationError, match=r"ipam\.cluster\.x-k8s\.io/control-plane-endpoint"):
        parse_request(annotations)


# -- the claim -------------------------------------------------------------------------------


def test_claim_name_is_shortened_deterministically() -> None:
    assert endpoint_claim_name("wl1") == "wl1-control-plane-endpoint"
    exact = "c" * (63 - len("-control-plane-endpoint"))
    assert endpoint_claim_name(exact) == f"{exact}-control-plane-endpoint"
    long_a, long_b = "a" * 50 + "-x", "a" * 50 + "-y"
    name_a = endpoint_claim_name(long_a)
    assert len(name_a) == 63 and name_a.endswith("-control-plane-endpoint")
    assert name_a == endpoint_claim_name(long_a)
    assert name_a != endpoint_claim_name(long_b)
    assert name_a.startswith("a" * 31 + "-")


def cluster(
    name: str = "wl1",
    *,
    annotations: dict[str, str] | None = None,
    version: str = "v1beta2",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": f"cluster.x-k8s.io/{version}",
        "kind": "Cluster",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def test_claim_body_is_owned_by_the_cluster_and_recognised() -> None:
    body = build_claim(Cluster.from_body(cluster()), POOL, "v1beta2")
    assert body["metadata"]["name"] == "wl1-control-plane-endpoint"
    assert body["metadata"]["labels"] == {CLUSTER_NAME_LABEL: "wl1", ENDPOINT_LABEL: "true"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "name": "wl1",
            "uid": "uid-wl1",
        }
    ]
    assert body["spec"] == {"clusterName": "wl1", "poolRef": POOL.as_dict()}
    body["metadata"]["uid"] = "uid-claim"
    claim = Claim.from_body(body)
    assert allocates_while_paused(claim, Cluster.from_body(cluster(paused=True)))
    # A moved Cluster (its endpoint set) and a claim being deleted follow the contract.
    moved = cluster(paused=True, controlPlaneEndpoint={"host": "10.0.0.2", "port": 6443})
    assert not allocates_while_paused(claim, Cluster.from_body(moved))
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not allocates_while_paused(
        Claim.from_body(body), Cluster.from_body(cluster(paused=True))
    )
    # Without the label, or without the owner reference, it is any claim.
    for drop in ("labels", "ownerReferences"):
        other = build_claim(Cluster.from_body(cluster()), POOL, "v1beta2")
        other["metadata"]["uid"] = "u"
        other["metadata"][drop] = {CLUSTER_NAME_LABEL: "wl1"} if drop == "labels" else []
        assert not allocates_while_paused(
            Claim.from_body(other), Cluster.from_body(cluster(paused=True))
        )


# -- the patch -------------------------------------------------------------------------------


def test_plan_sets_endpoint_variables_and_unpause_in_one_patch() -> None:
    body = cluster(
        paused=True,
        topology={
            "classRef": {"name": "vsphere"},
            "version": "v1.33.0",
            "variables": [
                {"name": "controlPlaneIpAddr", "value": "old"},
                {"name": "other", "value": {"x": 1}},
            ],
        },
    )
    plan = plan_patch(
        Cluster.from_body(body),
        host="10.0.0.5",
        address="10.0.0.5",
        variables=("controlPlaneIpAddr", "kubeVip"),
        unpause=True,
    )
    assert plan.conflict is None
    assert plan.patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {
            "controlPlaneEndpoint": {"host": "10.0.0.5", "port": 6443},
            "topology": {
                "variables": [
                    {"name": "controlPlaneIpAddr", "value": "10.0.0.5"},
                    {"name": "other", "value": {"x": 1}},
                    {"name": "kubeVip", "value": "10.0.0.5"},
                ]
            },
            "paused": False,
        },
    }
    assert plan.changes == (
        "endpoint 10.0.0.5:6443",
        "variables controlPlaneIpAddr, kubeVip",
        "unpaused",
    )


def test_plan_keeps_the_port_and_writes_nothing_when_all_is_set() -> None:
    body = cluster(controlPlaneEndpoint={"host": "", "port": 443})
    plan = plan_patch(Cluster.from_body(body), host="10.0.0.5", address="10.0.0.5")
    assert plan.patch is not None
    assert plan.patch["spec"] == {"controlPlaneEndpoint": {"host": "10.0.0.5", "port": 443}}
    done = cluster(controlPlaneEndpoint={"host": "10.0.0.5", "port": 443}, paused=True)
    assert (
        plan_patch(Cluster.from_body(done), host="10.0.0.5", address="10.0.0.5", unpause=True).patch
        is None
    )


def test_plan_never_overwrites_another_endpoint() -> None:
    body = cluster(controlPlaneEndpoint={"host": "192.0.2.1", "port": 6443}, paused=True)
    plan = plan_patch(
        Cluster.from_body(body), host="10.0.0.5", address="10.0.0.5", variables=("v",), unpause=True
    )
    assert plan.patch is None
    assert plan.conflict is not None and "192.0.2.1" in plan.conflict


def test_plan_without_topology_sets_only_the_endpoint_and_v1beta1_items_keep_fields() -> None:
    plan = plan_patch(
        Cluster.from_body(cluster()), host="10.0.0.5", address="10.0.0.5", variables=("v",)
    )
    assert plan.patch is not None and set(plan.patch["spec"]) == {"controlPlaneEndpoint"}
    v1beta1 = cluster(
        version="v1beta1",
        controlPlaneEndpoint={"host": "10.0.0.5", "port": 6443},
        topology={"class": "c", "variables": [{"name": "v", "value": "x", "definitionFrom": "p"}]},
    )
    plan = plan_patch(
        Cluster.from_body(v1beta1),
        host="10.0.0.5",
        address="10.0.0.5",
        variables=("v",),
        unpause=True,
    )
    assert plan.patch is not None
    assert plan.patch["spec"] == {
        "topology": {"variables": [{"name": "v", "value": "10.0.0.5", "definitionFrom": "p"}]}
    }  # the endpoint was set already: a paused Cluster is not unpaused now


# -- reconcile_cluster -------------------------------------------------------------------------


class World:
    """`reconcile_cluster` and `reconcile_claim` over a `FakeKube` and a `FakeIPAM`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kube = FakeKube()
        self.ipam = FakeIPAM(cidr="10.0.0.0/29")
        install_backend(monkeypatch, self.ipam)
        original = FakeBackend.allocate
        if "address" not in inspect.signature(original).parameters:
            # The fake of a backend without requested addresses (issue 12 in progress).
            def allocate(backend: FakeBackend, hostname: str, description: str, **_: Any) -> Any:
                return original(backend, hostname, description)

            monkeypatch.setattr(FakeBackend, "allocate", allocate)
        self.ctx = Operator(
            settings=Settings(),
            kube=cast(ObjectClient, self.kube),
            versions=ServedVersions("v1beta2", "v1beta2"),
            queue=FakeQueue(),
        )
        self.kube.add_secret(NS, "creds", {"username": "u", "password": "p"})
        self.kube.add_pool(phpipam_pool(status=pool_condition()))

    def add_cluster(self, **spec: Any) -> None:
        annotations = spec.pop("annotations", {POOL_ANNOTATION: "PHPIPAMIPPool/pool"})
        body = cluster(annotations=annotations, **spec)
        meta = body.pop("metadata")
        self.kube.add_cluster(NS, "wl1", metadata=meta, **body)

    def cluster(self) -> dict[str, Any]:
        return self.kube.clusters[(NS, "wl1")]

    def reconcile(self) -> Result:
        return reconcile_cluster(self.ctx.clusters, NS, "wl1")

    def bind(self) -> None:
        assert reconcile_claim(self.ctx.claims, NS, "wl1-control-plane-endpoint") == Result.done()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    return World(monkeypatch)


def test_paused_cluster_gets_claim_address_and_one_patch(world: World) -> None:
    world.add_cluster(
        paused=True,
        annotations={
            POOL_ANNOTATION: "PHPIPAMIPPool/pool",
            VARIABLES_ANNOTATION: "controlPlaneIpAddr",
            UNPAUSE_ANNOTATION: "true",
        },
        topology={"classRef": {"name": "c"}, "version": "v1.33.0"},
    )
    assert world.reconcile() == Result.done()
    (create,) = world.kube.of("claim.create")
    assert create.target == f"{NS}/wl1-control-plane-endpoint"
    assert world.reconcile() == Result.done()  # the claim exists, unbound: nothing more
    assert world.kube.ops() == ["claim.create", "event"]

    world.bind()  # allocated although the Cluster is paused
    assert world.ipam.entries == {"wl1-control-plane-endpoint.ns": "10.0.0.2"}
    assert world.reconcile() == Result.done()
    (patch,) = world.kube.of("cluster.patch")
    assert patch.detail["spec"] == {
        "controlPlaneEndpoint": {"host": "10.0.0.2", "port": 6443},
        "topology": {"variables": [{"name": "controlPlaneIpAddr", "value": "10.0.0.2"}]},
        "paused": False,
    }
    assert world.kube.events[-1][:2] == ("Normal", EndpointReason.SET)
    assert "10.0.0.2 from PHPIPAMIPPool pool" in world.kube.events[-1][2]
    writes = len(world.kube.writes)
    assert world.reconcile() == Result.done()  # a resync: the same state, no write
    assert len(world.kube.writes) == writes


def test_an_ordinary_claim_of_a_paused_cluster_still_waits(world: World) -> None:
    world.add_cluster(paused=True)
    body = build_claim(Cluster.from_body(world.cluster()), POOL, "v1beta2")
    body["metadata"]["labels"].pop(ENDPOINT_LABEL)
    body["metadata"]["uid"] = "u"
    world.kube.add_claim(body)
    decision = reconcile_claim(world.ctx.claims, NS, "wl1-control-plane-endpoint")
    assert decision.wake_on and not world.ipam.entries


def test_endpoint_claim_is_not_released_while_paused(world: World) -> None:
    world.add_cluster(paused=True)
    world.reconcile()
    world.bind()
    world.kube.claims[(NS, "wl1-control-plane-endpoint")]["metadata"]["deletionTimestamp"] = "x"
    decision = reconcile_claim(world.ctx.claims, NS, "wl1-control-plane-endpoint")
    assert decision.wake_on
    assert world.ipam.entries  # still registered
    assert (
        CLAIM_FINALIZER
        in world.kube.claims[(NS, "wl1-control-plane-endpoint")]["metadata"]["finalizers"]
    )


def test_an_endpoint_set_elsewhere_is_left_and_told_once(world: World) -> None:
    world.add_cluster()
    world.reconcile()
    world.bind()
    world.cluster()["spec"]["controlPlaneEndpoint"] = {"host": "192.0.2.1", "port": 6443}
    world.reconcile()
    world.reconcile()
    assert not world.kube.of("cluster.patch")
    conflicts = [e for e in world.kube.events if e[1] == EndpointReason.CONFLICT]
    assert len(conflicts) == 1 and "192.0.2.1" in conflicts[0][2]


@pytest.mark.parametrize("paused", [False, True])
def test_no_address_is_claimed_for_a_cluster_with_an_endpoint(world: World, paused: bool) -> None:
    world.add_cluster(paused=paused, controlPlaneEndpoint={"host": "192.0.2.1", "port": 6443})
    world.reconcile()
    world.reconcile()
    assert not world.kube.of("claim.create")
    # Paused (a clusterctl move creates the Cluster before its claim): quiet.
    assert world.kube.ops() == ([] if paused else ["event"])


def test_malformed_annotation_is_a_warning_and_nothing_else(world: World) -> None:
    world.add_cluster(annotations={POOL_ANNOTATION: "PHPIPAMIPPool"})
    world.reconcile()
    world.reconcile()
    assert world.kube.ops() == ["event"]
    assert world.kube.events[0][:2] == ("Warning", EndpointReason.INVALID)


def test_a_waiting_claim_is_told_on_the_cluster(world: World) -> None:
    world.add_cluster(annotations={POOL_ANNOTATION: "PHPIPAMIPPool/missing"})
    world.reconcile()
    reconcile_claim(world.ctx.claims, NS, "wl1-control-plane-endpoint")  # PoolNotReady
    world.reconcile()
    world.reconcile()
    pending = [e for e in world.kube.events if e[1] == EndpointReason.PENDING]
    assert len(pending) == 1
    assert "PoolNotReady" in pending[0][2] and "missing" in pending[0][2]


def test_a_foreign_claim_of_that_name_is_not_used(world: World) -> None:
    world.add_cluster()
    world.kube.add_claim(
        {
            "apiVersion": f"{GROUP}/v1beta2",
            "kind": "IPAddressClaim",
            "metadata": {"name": "wl1-control-plane-endpoint", "namespace": NS, "uid": "u"},
            "spec": {"poolRef": POOL.as_dict()},
        }
    )
    world.reconcile()
    assert world.kube.ops() == ["event"]
    assert world.kube.events[0][1] == EndpointReason.CLAIM_MISMATCH


def test_removed_annotation_leaves_claim_and_endpoint(world: World) -> None:
    world.add_cluster()
    world.reconcile()
    world.bind()
    world.reconcile()
    world.cluster()["metadata"]["annotations"] = {}
    writes = len(world.kube.writes)
    world.reconcile()
    assert len(world.kube.writes) == writes
    assert world.cluster()["spec"]["controlPlaneEndpoint"]["host"] == "10.0.0.2"


def test_a_stale_cluster_is_retried_not_overwritten(world: World) -> None:
    world.add_cluster()
    world.reconcile()
    world.bind()
    original = world.kube.read_cluster

    def stale(version: str, namespace: str, name: str) -> dict[str, Any] | None:
        body = original(version, namespace, name)
        if body is not None:
            body["metadata"]["resourceVersion"] = "1"
        return body

    world.kube.read_cluster = stale  # type: ignore[method-assign]
    assert world.reconcile() == Result.requeue_after(1.0)
    assert not world.kube.of("cluster.patch")


def test_a_refused_patch_is_told_not_retried(world: World) -> None:
    world.add_cluster(
        annotations={POOL_ANNOTATION: "PHPIPAMIPPool/pool", VARIABLES_ANNOTATION: "x"}
    )
    world.reconcile()
    world.bind()

    def refuse(*_: Any) -> None:
        raise ApiException(status=422, reason="Invalid")

    world.kube.patch_cluster = refuse  # type: ignore[method-assign,assignment]
    assert world.reconcile() == Result.done()
    assert world.reconcile() == Result.done()
    refused = [e for e in world.kube.events if e[1] == EndpointReason.REFUSED]
    assert len(refused) == 1 and "the Cluster patch" in refused[0][2]


def test_the_cluster_crd_copies_are_capis_own() -> None:
    pairs = [
        ("crds/capi/cluster.x-k8s.io_clusters.yaml", "v1.14.0"),
        ("crds/capi/v1_10/cluster.x-k8s.io_clusters.yaml", "v1.10.10"),
    ]
    for copy, release in pairs:
        upstream = (
            REPO / "tests" / "data" / "capi-crds" / release / "cluster.x-k8s.io_clusters.yaml"
        )
        assert (REPO / copy).read_bytes() == upstream.read_bytes(), copy
    assert capi.CLUSTER_GROUP == "cluster.x-k8s.io"


# -- the periodic resync --------------------------------------------------------------------


class _ResyncKube:
    def __init__(self, clusters: list[dict[str, Any]] | None) -> None:
        self.clusters = clusters
        self.asked: list[tuple[str, ...]] = []

    def list_clusters(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
        self.asked.append(namespaces)
        return self.clusters


class _ResyncContext:
    def __init__(self, kube: _ResyncKube, cluster_version: str | None) -> None:
        self.kube = kube
        self.cache = Cache()  # never listed: the resync lists the API
        self.versions = ServedVersions("v1beta2", cluster_version)
        self.settings = SimpleNamespace(namespaces=("team-a",))
        self.queue = FakeQueue()

    @property
    def queued(self) -> list[Any]:
        return [key for key, _ in self.queue.added]


def _cluster_body(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "annotations": annotations}}


def test_the_resync_queues_the_clusters_that_ask_for_an_endpoint_and_no_other() -> None:
    kube = _ResyncKube(
        [
            _cluster_body("wants", {POOL_ANNOTATION: "PHPIPAMIPPool/nodes"}),
            _cluster_body("plain", {}),
            _cluster_body("foreign", {"other.example/pool": "x"}),
        ]
    )
    ctx = _ResyncContext(kube, "v1beta2")
    assert _queue_clusters(ctx) == 1  # type: ignore[arg-type]
    assert ctx.queued == [cluster_key("team-a", "wants")]
    assert kube.asked == [("team-a",)]

    off = _ResyncContext(kube, None)  # Clusters not served: endpoints are off
    assert _queue_clusters(off) == 0  # type: ignore[arg-type]
    assert off.queued == [] and kube.asked == [("team-a",)]
