"""Global (cluster-scoped) pools serve the claims of every namespace (issue 12, item 2).

The real operator against the emulated Kubernetes API and the IPAM mocks over HTTP on
127.0.0.1. A ``GlobalPHPIPAMIPPool`` / ``GlobalInfobloxIPPool`` names the namespace of its
credentials Secret; claims of two namespaces get distinct addresses registered as
``<claim>.<namespace>``, their IPAddresses are owned by the Global pool, and the pool is not
deleted while a claim of any namespace holds an address in it. A namespaced pool naming
another namespace's Secret is refused by the CRD's CEL rules (``422 Invalid``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from integration_env import CREDENTIALS, NAMESPACE

from bridge.capi import GROUP
from bridge.reconcilers.pools import CREDENTIALS_FINALIZER
from mock_infoblox.server import MockInfobloxServer
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []

CREDENTIALS_NAMESPACE = "ipam-credentials"
TEAMS = ("team-a", "team-b")


def global_pool(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": kind,
        "metadata": {"name": "shared"},
        "spec": {
            "credentialsRef": {"name": "ipam", "namespace": CREDENTIALS_NAMESPACE},
            **spec,
        },
    }


def secret(sandbox: Sandbox) -> dict[str, Any]:
    found = sandbox.get_object("v1", "secrets", "ipam", CREDENTIALS_NAMESPACE)
    assert found is not None
    return found


@pytest.mark.parametrize("ipam", ["phpipam", "infoblox"])
def test_a_global_pool_serves_claims_of_two_namespaces(
    request: pytest.FixtureRequest, sandbox: Sandbox, ipam: str
) -> None:
    for namespace in (CREDENTIALS_NAMESPACE, *TEAMS):
        sandbox.namespace(namespace)
    sandbox.secret(CREDENTIALS_NAMESPACE, "ipam", CREDENTIALS)
    if ipam == "phpipam":
        server: MockPhpipamServer | MockInfobloxServer = request.getfixturevalue("phpipam")
        kind = "GlobalPHPIPAMIPPool"
        sandbox.create(global_pool(kind, {"endpoint": server.url, "appId": "capi", "subnetId": 7}))
    else:
        server = request.getfixturevalue("infoblox")
        kind = "GlobalInfobloxIPPool"
        sandbox.create(global_pool(kind, {"endpoint": server.url, "subnet": "10.20.0.0/24"}))
    pool = sandbox.wait_pool_ready(None, "shared", kind)
    assert pool["status"]["subnets"][0]["cidr"] == "10.20.0.0/24"
    wait_for(
        lambda: CREDENTIALS_FINALIZER in (secret(sandbox)["metadata"].get("finalizers") or []),
        timeout=10,
        message="the named Secret is protected",
    )

    for team in TEAMS:
        sandbox.claim(team, "m1", "shared", kind=kind)
    sandbox.wait_claims_bound(None, 2)
    addresses = {a["metadata"]["namespace"]: a for a in sandbox.addresses()}
    assert set(addresses) == set(TEAMS)
    assert len({a["spec"]["address"] for a in addresses.values()}) == 2
    for address in addresses.values():
        owner = address["metadata"]["ownerReferences"][1]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            kind,
            "shared",
            pool["metadata"]["uid"],
        )
        assert address["spec"]["gateway"] == "10.20.0.1"
    if isinstance(server, MockPhpipamServer):
        for team in TEAMS:
            (row,) = server.store.search_hostname(f"m1.{team}")
            assert str(row.ip) == addresses[team]["spec"]["address"]

    # Deletion waits for the claims of every namespace, then the Secret is let go.
    sandbox.delete_pool(None, "shared", kind)
    sandbox.wait_pool_ready(None, "shared", kind, reason="DeletionBlocked")
    for team in TEAMS:
        sandbox.delete_claim(team, "m1")
    wait_for(
        lambda: sandbox.pool(None, "shared", kind) is None,
        timeout=30,
        message="the Global pool goes once its claims are released",
    )
    wait_for(
        lambda: not secret(sandbox)["metadata"].get("finalizers"),
        timeout=10,
        message="the Secret is let go",
    )


def test_a_namespaced_pool_cannot_name_another_namespaces_secret(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    sandbox = make_sandbox(start_operator=False)  # the API server refuses: no operator needed
    body = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "metadata": {"name": "borrowing", "namespace": NAMESPACE},
        "spec": {
            "endpoint": phpipam.url,
            "appId": "capi",
            "subnetId": 7,
            "credentialsRef": {"name": "ipam", "namespace": CREDENTIALS_NAMESPACE},
        },
    }
    with sandbox.kube.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(kubernetes.client.ApiException) as caught:
            custom.create_namespaced_custom_object(
                GROUP, "v1alpha1", NAMESPACE, "phpipamippools", body
            )
        assert caught.value.status == 422
        message = json.loads(caught.value.body)["message"]
        assert "spec.credentialsRef" in message and "only for Global pools" in message
        # A Global pool without the Secret's namespace is refused too.
        glob = global_pool("GlobalPHPIPAMIPPool", {"endpoint": phpipam.url, "appId": "capi"})
        glob["spec"]["subnetId"] = 7
        del glob["spec"]["credentialsRef"]["namespace"]
        with pytest.raises(kubernetes.client.ApiException) as caught:
            custom.create_cluster_custom_object(GROUP, "v1alpha1", "globalphpipamippools", glob)
        assert caught.value.status == 422
        assert "required on a Global pool" in json.loads(caught.value.body)["message"]


def test_global_pools_are_served_when_the_operator_watches_some_namespaces(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    """With ``IPAM_BRIDGE_NAMESPACE`` set, Global pools are still watched (cluster-scoped)."""
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_NAMESPACE": "team-a"})
    for namespace in (CREDENTIALS_NAMESPACE, "team-a"):
        sandbox.namespace(namespace)
    sandbox.secret(CREDENTIALS_NAMESPACE, "ipam", CREDENTIALS)
    kind = "GlobalPHPIPAMIPPool"
    sandbox.create(global_pool(kind, {"endpoint": phpipam.url, "appId": "capi", "subnetId": 10}))
    sandbox.wait_pool_ready(None, "shared", kind)
    sandbox.claim("team-a", "m1", "shared", kind=kind)
    (bound,) = sandbox.wait_claims_bound("team-a", 1)
    assert bound["status"]["addressRef"]["name"] == "m1"
    (row,) = phpipam.store.search_hostname("m1.team-a")
    assert str(row.ip).startswith("10.20.2.")
