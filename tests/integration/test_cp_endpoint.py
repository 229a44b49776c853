"""Control-plane endpoints from the IPAM written into the Cluster (issue 13, DESIGN section 11).

The real operator against the in-memory API serving CAPI's own Cluster CRDs (v1.14: v1beta2;
v1.10: v1beta1 with IPAM v1beta1 too, from ``crds/capi/`` and ``tests/data/capi-crds/``) and
the IPAM mocks over HTTP. The operator's writes to Clusters are counted in the emulator's
access log (the tests' own writes do not go through HTTP).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE
from kubernetes.client import ApiException
from moving import PHPIPAM_MOVE, assert_only_owners_rewritten, clusterctl_move

from bridge.capi import CLUSTER_NAME_LABEL, GROUP
from bridge.objects.client import ObjectClient
from bridge.reconcilers.control_plane import (
    ENDPOINT_LABEL,
    HOST_ANNOTATION,
    POOL_ANNOTATION,
    UNPAUSE_ANNOTATION,
    VARIABLES_ANNOTATION,
)
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

REPO = Path(__file__).resolve().parents[2]
CLUSTER_CRDS = {
    "v1.14": [REPO / "crds" / "capi" / "cluster.x-k8s.io_clusters.yaml"],
    "v1.10": [
        REPO / "crds" / "capi" / "v1_10" / "cluster.x-k8s.io_clusters.yaml",
        *sorted((REPO / "tests" / "data" / "capi-crds" / "v1.10.10").glob("ipam.*.yaml")),
    ],
}
#: The version of Clusters (and claims) each CAPI release serves.
SERVED = {"v1.14": "v1beta2", "v1.10": "v1beta1"}
CLAIM = "wl1-control-plane-endpoint"


@pytest.fixture(params=["v1.14", "v1.10"])
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def capi_sandbox(
    make_sandbox: Callable[..., Sandbox], release: str, *crds: Path, **kwargs: Any
) -> Sandbox:
    """Return a sandbox serving ``release``'s Cluster CRD (and IPAM CRDs), plus ``crds``.

    ``kwargs`` go to ``make_sandbox`` as they are.
    """
    return make_sandbox(
        capi_versions=(SERVED[release],), capi_crds=[*CLUSTER_CRDS[release], *crds], **kwargs
    )


def new_cluster(
    sandbox: Sandbox,
    name: str = "wl1",
    *,
    annotations: dict[str, str],
    topology: bool = True,
    **spec: Any,
) -> dict[str, Any]:
    """Create a Cluster in the served version: with ClusterClass topology unless told not."""
    version = sandbox.version
    if topology:
        spec["topology"] = (
            {"classRef": {"name": "vsphere-class"}, "version": "v1.33.0"}
            if version == "v1beta2"
            else {"class": "vsphere-class", "version": "v1.33.0"}
        )
    return sandbox.create(
        {
            "apiVersion": f"cluster.x-k8s.io/{version}",
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "spec": spec,
        }
    )


def get_cluster(sandbox: Sandbox, name: str = "wl1") -> dict[str, Any] | None:
    return sandbox.get_object(f"cluster.x-k8s.io/{sandbox.version}", "clusters", name, NAMESPACE)


def host_of(sandbox: Sandbox, name: str = "wl1") -> str:
    body = get_cluster(sandbox, name) or {}
    return str(((body.get("spec") or {}).get("controlPlaneEndpoint") or {}).get("host") or "")


def cluster_writes(sandbox: Sandbox) -> list[Any]:
    """The operator's allowed writes to Clusters (patch, update), from the access log."""
    return [
        r
        for r in sandbox.kube.access_log.records(sandbox.identity, allowed=True)
        if r.resource == "clusters" and r.verb in ("patch", "update", "create")
    ]


def events(sandbox: Sandbox, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sandbox.events(NAMESPACE)
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("kind") == "Cluster"
    ]


def addresses(sandbox: Sandbox) -> dict[str, str]:
    return {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}


def phpipam_hosts(server: MockPhpipamServer) -> dict[str, str]:
    return {
        str(a.hostname): str(a.ip)
        for a in server.store.subnet_addresses(7)
        if not a.is_gateway and not str(a.hostname).startswith("ipam-bridge-reserved")
    }


def phpipam_pool(sandbox: Sandbox, server: MockPhpipamServer) -> None:
    """Create the pool ``vips`` on subnet 7 of ``server`` and wait until it is ready."""
    sandbox.phpipam_pool(
        NAMESPACE, "vips", endpoint=server.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "vips")


def infoblox_dns_pool(sandbox: Sandbox, server: MockInfobloxServer) -> None:
    """Create the pool ``ib`` (10.20.0.0/24 of ``server``, DNS zone ``nodes.example.com``).

    Returns once the pool is ready.
    """
    sandbox.infoblox_pool(
        NAMESPACE,
        "ib",
        endpoint=server.url,
        subnet="10.20.0.0/24",
        credentials=CREDENTIALS,
        dnsZone="nodes.example.com",
    )
    sandbox.wait_pool_ready(NAMESPACE, "ib", kind="InfobloxIPPool")


ASK = {
    POOL_ANNOTATION: "PHPIPAMIPPool/vips",
    VARIABLES_ANNOTATION: "controlPlaneIpAddr",
    UNPAUSE_ANNOTATION: "true",
}


# -- the whole flow ----------------------------------------------------------------------------


def test_paused_clusterclass_cluster_gets_its_endpoint_in_one_write_and_gives_it_back(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer, release: str
) -> None:
    sandbox = capi_sandbox(make_sandbox, release)
    phpipam_pool(sandbox, phpipam)
    created = new_cluster(sandbox, annotations=ASK, paused=True)
    wait_for(lambda: host_of(sandbox), timeout=20, message="the control-plane endpoint")

    body = get_cluster(sandbox)
    assert body is not None
    (address,) = addresses(sandbox).values()
    assert body["spec"]["controlPlaneEndpoint"] == {"host": address, "port": 6443}
    assert body["spec"]["topology"]["variables"] == [
        {"name": "controlPlaneIpAddr", "value": address}
    ]
    assert body["spec"]["paused"] is False
    assert body["spec"]["topology"].get("classRef" if sandbox.version == "v1beta2" else "class")
    claim = sandbox.get_claim(NAMESPACE, CLAIM)
    assert claim is not None
    assert claim["metadata"]["labels"] == {CLUSTER_NAME_LABEL: "wl1", ENDPOINT_LABEL: "true"}
    assert claim["spec"]["poolRef"] == {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "vips"}
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Cluster",
        "wl1",
        created["metadata"]["uid"],
    )
    assert phpipam_hosts(phpipam) == {f"{CLAIM}.{NAMESPACE}": address}
    # Events are posted in the background, after the write they tell of.
    wait_for(lambda: events(sandbox, "ControlPlaneEndpointSet"), timeout=20, message="the Event")
    (told,) = events(sandbox, "ControlPlaneEndpointSet")
    assert address in told["message"] and "PHPIPAMIPPool vips" in told["message"]
    assert len(cluster_writes(sandbox)) == 1  # endpoint, variable and unpause in one patch

    # State, not history: a Cluster event and a restart change nothing.
    version = body["metadata"]["resourceVersion"]
    sandbox.kube.patch(
        f"cluster.x-k8s.io/{sandbox.version}",
        "clusters",
        "wl1",
        {"metadata": {"labels": {"touched": "yes"}}},
        NAMESPACE,
    )
    sandbox.stop_operator()
    sandbox.start_operator()
    time.sleep(1.5)  # the operator lists and decides within milliseconds
    after = get_cluster(sandbox)
    assert after is not None and after["metadata"]["resourceVersion"] != version  # the label
    assert after["spec"] == {**body["spec"]}
    assert len(cluster_writes(sandbox)) == 1
    assert len(events(sandbox, "ControlPlaneEndpointSet")) == 1

    # Deleting the Cluster deletes the claim (owner reference), which releases the address.
    sandbox.delete_object(f"cluster.x-k8s.io/{sandbox.version}", "clusters", "wl1", NAMESPACE)
    sandbox.wait_gone(NAMESPACE, timeout=20)
    assert phpipam_hosts(phpipam) == {}


def test_an_endpoint_already_set_is_never_overwritten(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    phpipam_pool(sandbox, phpipam)
    endpoint = {"host": "192.0.2.10", "port": 6443}
    new_cluster(sandbox, annotations=ASK, controlPlaneEndpoint=endpoint)
    new_cluster(sandbox, "moving", annotations=ASK, paused=True, controlPlaneEndpoint=endpoint)
    wait_for(
        lambda: events(sandbox, "ControlPlaneEndpointConflict"), timeout=20, message="conflict"
    )
    (warning,) = events(sandbox, "ControlPlaneEndpointConflict")
    assert warning["type"] == "Warning" and "192.0.2.10" in warning["message"]
    assert warning["involvedObject"]["name"] == "wl1"
    time.sleep(1.0)  # the paused one (a clusterctl move in progress?) waits quietly
    for name in ("wl1", "moving"):
        body = get_cluster(sandbox, name)
        assert body is not None and body["spec"]["controlPlaneEndpoint"] == endpoint
        assert "variables" not in body["spec"]["topology"]
    assert sandbox.claims(NAMESPACE) == []  # no address it could not use
    assert phpipam_hosts(phpipam) == {}
    assert cluster_writes(sandbox) == []
    assert len(events(sandbox, "ControlPlaneEndpointConflict")) == 1


def test_infoblox_dns_host_on_a_cluster_without_topology(
    sandbox: Sandbox, infoblox: MockInfobloxServer
) -> None:
    infoblox_dns_pool(sandbox, infoblox)
    annotations = {
        POOL_ANNOTATION: "InfobloxIPPool/ib",
        VARIABLES_ANNOTATION: "controlPlaneIpAddr",
        HOST_ANNOTATION: "dns",
    }
    new_cluster(sandbox, annotations=annotations, topology=False)
    fqdn = f"{CLAIM}.{NAMESPACE}.nodes.example.com"
    wait_for(lambda: host_of(sandbox) == fqdn, timeout=20, message="the FQDN endpoint")
    body = get_cluster(sandbox)
    assert body is not None
    assert body["spec"] == {"controlPlaneEndpoint": {"host": fqdn, "port": 6443}}
    records = infoblox.store.dump()["objects"].get("record:host", [])
    (record,) = [r for r in records if r["name"] == fqdn]
    assert [a["ipv4addr"] for a in record["ipv4addrs"]] == list(addresses(sandbox).values())
    assert len(cluster_writes(sandbox)) == 1


def test_annotation_errors_give_events_and_nothing_else(sandbox: Sandbox) -> None:
    new_cluster(sandbox, "bad", annotations={POOL_ANNOTATION: "PHPIPAMIPPool"})
    new_cluster(sandbox, "theirs", annotations={POOL_ANNOTATION: "InClusterIPPool/vips"})
    new_cluster(sandbox, "nopool", annotations={POOL_ANNOTATION: "PHPIPAMIPPool/missing"})
    wait_for(
        lambda: events(sandbox, "InvalidControlPlaneEndpointAnnotation"),
        timeout=20,
        message="the malformed annotation's Event",
    )
    pending = wait_for(
        lambda: events(sandbox, "ControlPlaneEndpointPending"),
        timeout=20,
        message="the missing pool's Event",
    )
    assert "PoolNotReady" in pending[0]["message"] and "missing" in pending[0]["message"]
    assert pending[0]["involvedObject"]["name"] == "nopool"
    (invalid,) = events(sandbox, "InvalidControlPlaneEndpointAnnotation")
    assert invalid["involvedObject"]["name"] == "bad" and invalid["type"] == "Warning"
    assert [c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)] == [
        "nopool-control-plane-endpoint"
    ]
    time.sleep(1.0)  # more events of the same Clusters tell nothing twice
    names = [(e["reason"], e["involvedObject"]["name"]) for e in sandbox.events(NAMESPACE)]
    assert not [e for e in names if e[1] == "theirs"]
    assert names.count(("InvalidControlPlaneEndpointAnnotation", "bad")) == 1
    assert names.count(("ControlPlaneEndpointPending", "nopool")) == 1
    assert cluster_writes(sandbox) == []


# -- restart in the middle ---------------------------------------------------------------------


@pytest.fixture
def refused_cluster_patches(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Make every Cluster patch of the operator fail (as a crash before it would)."""
    reached = threading.Event()

    def refuse(self: ObjectClient, *args: Any, **kwargs: Any) -> Any:
        reached.set()
        raise ApiException(status=503, reason="stopped before the Cluster patch")

    monkeypatch.setattr(ObjectClient, "patch_cluster", refuse)
    yield reached


def test_a_restart_between_bound_claim_and_cluster_patch_ends_in_the_same_state(
    sandbox: Sandbox,
    phpipam: MockPhpipamServer,
    refused_cluster_patches: threading.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    phpipam_pool(sandbox, phpipam)
    new_cluster(sandbox, annotations=ASK, paused=True)
    assert refused_cluster_patches.wait(20), "the operator never got to the Cluster patch"
    sandbox.stop_operator()
    (address,) = addresses(sandbox).values()
    assert host_of(sandbox) == "" and cluster_writes(sandbox) == []
    phpipam.store.clear_journal()

    monkeypatch.undo()  # the restarted operator patches for real
    sandbox.start_operator()
    wait_for(lambda: host_of(sandbox) == address, timeout=20, message="the endpoint")
    body = get_cluster(sandbox)
    assert body is not None and body["spec"]["paused"] is False
    assert len(cluster_writes(sandbox)) == 1
    assert phpipam_hosts(phpipam) == {f"{CLAIM}.{NAMESPACE}": address}  # no second address
    assert [e for e in phpipam.store.requests(writes_only=True)] == []


# -- clusterctl move ---------------------------------------------------------------------------


def test_clusterctl_move_allocates_nothing_new(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    source = make_sandbox()
    target = make_sandbox()
    phpipam_pool(source, phpipam)
    new_cluster(source, annotations=ASK, paused=True)
    wait_for(lambda: host_of(source), timeout=20, message="the endpoint in the source")
    before = phpipam_hosts(phpipam)
    clusters = f"cluster.x-k8s.io/{source.version}"
    source.kube.patch(clusters, "clusters", "wl1", {"spec": {"paused": True}}, NAMESPACE)
    phpipam.store.clear_journal()

    # Copy the Cluster, Secret, pool, claim and IPAddress to the target, then annotate,
    # delete and strip them at the source, whose operator is still running.
    assert source.version == "v1beta2"  # the version of PHPIPAM_MOVE's claims
    clusterctl_move(source, target, [(clusters, "clusters"), *PHPIPAM_MOVE])
    source.wait_gone(NAMESPACE, timeout=15)
    target.kube.patch(clusters, "clusters", "wl1", {"spec": {"paused": False}}, NAMESPACE)
    (bound,) = target.wait_claims_bound(NAMESPACE, 1, timeout=20)
    assert bound["metadata"]["name"] == CLAIM
    target.wait_pool_ready(NAMESPACE, "vips")
    time.sleep(1.0)  # the Cluster's events were handled within milliseconds
    assert phpipam_hosts(phpipam) == before
    # Nothing allocated, nothing released: the target wrote itself as the entry's owner.
    assert_only_owners_rewritten(phpipam, target, 1)
    assert cluster_writes(target) == []
    assert host_of(target) == next(iter(before.values()))
    assert [c["metadata"]["name"] for c in target.claims(NAMESPACE)] == [CLAIM]
