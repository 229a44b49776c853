"""The operator under a real cluster's constraints: old CAPI schemas, and the deploy/ RBAC.

Issue 9, items 7 and 8: a v1beta1 claim on CAPI 1.8 (whose schema has no ``status.v1beta2``)
does not churn; the operator works with exactly the verbs ``deploy/`` grants, and uses every
one of them (the rules are derived from what it does, not hand-listed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from integration_env import CREDENTIALS, NAMESPACE

from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.capv import CRDS as CAPV_CRDS
from mock_kubernetes.capv import generate_cluster
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

CAPI_CRDS = Path(__file__).resolve().parents[1] / "data" / "capi-crds"
DEPLOY_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "manager" / "rbac.yaml"
CLUSTERS = "cluster.x-k8s.io/v1beta2"


def test_v1beta1_claim_on_capi_1_8_does_not_churn(phpipam: MockPhpipamServer) -> None:
    files = sorted((CAPI_CRDS / "v1.8.12").glob("ipam.cluster.x-k8s.io_*.yaml"))
    with Sandbox(capi_versions=("v1beta1",), capi_crds=files) as sandbox:
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        for name in ("m1", "m2"):
            sandbox.claim(NAMESPACE, name, "pool")
        bound = sandbox.wait_claims_bound(NAMESPACE, 2)
        assert all("v1beta2" not in c["status"] for c in bound)  # pruned by the 1.8 schema
        assert all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in claim["status"]["conditions"]
            )
            for claim in bound
        )
        versions = {c["metadata"]["name"]: c["metadata"]["resourceVersion"] for c in bound}
        time.sleep(3)  # several resync-free seconds: nothing may be written again
        after = {c["metadata"]["name"]: c["metadata"]["resourceVersion"] for c in sandbox.claims()}
        assert after == versions
        # No churn in Events either: AddressAllocated at most once per claim, and only as the
        # end of a wait that was told (a claim allocated at once posts none).
        events = sandbox.events(NAMESPACE)
        for name in ("m1", "m2"):
            reasons = [e["reason"] for e in events if e["involvedObject"].get("name") == name]
            assert reasons.count("AddressAllocated") <= 1, reasons
            if "AddressAllocated" in reasons:  # Events are posted in the background: any order
                assert {"PoolNotReady", "PoolExhausted", "AllocationFailed"} & set(reasons), reasons


def _granted() -> set[tuple[str, str, str]]:
    """Return (group, resource, verb) of every rule of deploy/'s ClusterRole."""
    granted: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all(DEPLOY_RBAC.read_text(encoding="utf-8")):
        if not doc or doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        granted.add((group, resource, verb))
    return granted


def _used(sandbox: Sandbox, *, allowed: bool) -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for entry in sandbox.kube.access_log.permissions(sandbox.identity, allowed=allowed):
        found.add(_triple(entry))
    return found


def _triple(entry: Any) -> tuple[str, str, str]:
    if isinstance(entry, tuple) and len(entry) == 3:
        return (str(entry[0]), str(entry[1]), str(entry[2]))
    return (str(entry.group), str(entry.resource), str(entry.verb))


def global_pools(phpipam_url: str, infoblox_url: str) -> dict[str, dict[str, Any]]:
    """The spec (without credentials) of a Global pool of each kind, on small subnets."""
    return {
        "GlobalPHPIPAMIPPool": {"endpoint": phpipam_url, "appId": "capi", "subnetId": 10},
        "GlobalInfobloxIPPool": {"endpoint": infoblox_url, "subnet": "10.20.1.0/30"},
    }


def test_operator_runs_with_deploy_rbac_and_uses_every_verb_it_grants(
    phpipam: MockPhpipamServer, infoblox: MockInfobloxServer
) -> None:
    with Sandbox(identity="operator", capi_crds=CAPV_CRDS) as sandbox:
        sandbox.namespace(NAMESPACE)
        sandbox.create(
            {
                "apiVersion": CLUSTERS,
                "kind": "Cluster",
                "metadata": {"name": "c1", "namespace": NAMESPACE},
                "spec": {},
            }
        )
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        sandbox.infoblox_pool(
            NAMESPACE, "ib", endpoint=infoblox.url, subnet="10.20.0.0/24", credentials=CREDENTIALS
        )
        # A Cluster asking for its control-plane endpoint: the operator creates its claim and
        # patches the Cluster (bridge/reconcilers/control_plane.py).
        sandbox.create(
            {
                "apiVersion": CLUSTERS,
                "kind": "Cluster",
                "metadata": {
                    "name": "wl",
                    "namespace": NAMESPACE,
                    "annotations": {
                        "ipam.cluster.x-k8s.io/control-plane-endpoint-pool": "PHPIPAMIPPool/pool"
                    },
                },
                "spec": {},
            }
        )
        # CAPV's template without a ClusterClass, the VIP left empty: the operator reads and
        # patches the VSphereCluster and the KubeadmControlPlane it names.
        for body in generate_cluster(
            {
                "CLUSTER_NAME": "capv",
                "NAMESPACE": NAMESPACE,
                "VSPHERE_SERVER": "vcenter.example",
                "VSPHERE_TLS_THUMBPRINT": "01:02:03:04",
                "VSPHERE_SSH_AUTHORIZED_KEY": "ssh-ed25519 AAAAC3Nz test",
                "KUBERNETES_VERSION": "v1.33.0",
                "CONTROL_PLANE_MACHINE_COUNT": "1",
            }
        ):
            if body["kind"] == "Cluster":
                body["metadata"]["annotations"] = {
                    "ipam.cluster.x-k8s.io/control-plane-endpoint-pool": "PHPIPAMIPPool/pool",
                    "ipam.cluster.x-k8s.io/control-plane-endpoint-unpause": "true",
                }
                body["spec"]["paused"] = True
            sandbox.create(body)
        for name in ("m1", "m2"):
            sandbox.claim(NAMESPACE, name, "pool", cluster="c1")
        sandbox.claim(NAMESPACE, "i1", "ib", kind="InfobloxIPPool")
        # Global (cluster-scoped) pools, one of each kind, with a claim each; their Secret is
        # the namespaced pool's (credentialsRef.namespace).
        for kind, spec in global_pools(phpipam.url, infoblox.url).items():
            sandbox.create(
                {
                    "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
                    "kind": kind,
                    "metadata": {"name": "global"},
                    "spec": {
                        "credentialsRef": {"name": "pool-credentials", "namespace": NAMESPACE},
                        **spec,
                    },
                }
            )
            sandbox.claim(NAMESPACE, f"g-{kind.lower()}", "global", kind=kind)
        sandbox.wait_claims_bound(NAMESPACE, 6)  # IPAddresses with blockOwnerDeletion owners
        wait_for(
            lambda: (
                (sandbox.get_object(CLUSTERS, "clusters", "wl", NAMESPACE) or {}).get("spec") or {}
            ).get("controlPlaneEndpoint"),
            message="the control-plane endpoint",
        )
        wait_for(
            lambda: (
                (
                    (
                        sandbox.get_object(
                            "infrastructure.cluster.x-k8s.io/v1beta2",
                            "vsphereclusters",
                            "capv",
                            NAMESPACE,
                        )
                        or {}
                    ).get("spec", {})
                )
                .get("controlPlaneEndpoint", {})
                .get("host")
            ),
            message="the VSphereCluster's control-plane endpoint",
        )
        sandbox.delete_object(CLUSTERS, "clusters", "wl", NAMESPACE)  # its claim goes with it
        sandbox.delete_object(CLUSTERS, "clusters", "capv", NAMESPACE)
        sandbox.delete_pool(NAMESPACE, "ib", kind="InfobloxIPPool")
        sandbox.delete_claim(NAMESPACE, "i1")
        wait_for(
            lambda: sandbox.pool(NAMESPACE, "ib", kind="InfobloxIPPool") is None,
            timeout=15,
            message="the Infoblox pool to go",
        )
        for kind in global_pools("", ""):
            sandbox.delete_pool(None, "global", kind)
            sandbox.delete_claim(NAMESPACE, f"g-{kind.lower()}")
            wait_for(
                lambda kind=kind: sandbox.pool(None, "global", kind) is None,
                timeout=15,
                message=f"the {kind} to go",
            )
        sandbox.delete_claim(NAMESPACE, "m1")
        wait_for(lambda: sandbox.get_claim(NAMESPACE, "m1") is None, message="m1 released")
        sandbox.delete_pool(NAMESPACE, "pool")  # blocked by m2, then let go with its Secret
        sandbox.delete_claim(NAMESPACE, "m2")
        sandbox.wait_gone(NAMESPACE, timeout=20)
        wait_for(lambda: sandbox.pool(NAMESPACE, "pool") is None, timeout=15, message="pool")
        for name in ("pool-credentials", "ib-credentials"):  # let go with their pools
            secret = sandbox.get_object("v1", "secrets", name, NAMESPACE)
            assert secret is not None and not secret["metadata"].get("finalizers")
        denied = _used(sandbox, allowed=False)
        used = _used(sandbox, allowed=True)
    assert denied == set(), f"the operator was refused: {sorted(denied)}"
    granted = _granted()
    assert used <= granted, f"used but not granted: {sorted(used - granted)}"
    # Nothing more than what the operator does: every granted verb was used, but for the
    # InfraCluster kinds of other providers (the same get/patch rule as vsphereclusters',
    # for their users; no CRD of theirs is served here) and the patch of a repeated Event
    # (test_observability's outage test tells one twice under these rules).
    others = {"metal3clusters", "nutanixclusters", "openstackclusters", "proxmoxclusters"}
    unused = {g for g in granted - used if g[1] not in others} - {("", "events", "patch")}
    assert not unused, f"granted but never used: {sorted(unused)}"
