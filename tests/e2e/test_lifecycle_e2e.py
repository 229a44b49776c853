"""Issue 9's lifecycle scenarios on the session's API server (``KUBECONFIG``'s, else in-memory).

What the in-memory API models (namespace termination, pruning, CEL, finalizers of other
providers) is checked here against the real thing when ``KUBECONFIG`` names one: the
namespace controller, the structural schema, the CRDs' transition rules. The operator runs
in this process for one namespace; the IPAM is mock_phpipam on 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from e2e_support import CREDENTIALS, ClusterKube, IpamTarget, OperatorThread
from kubernetes.client.exceptions import ApiException

from bridge import capi
from bridge.reconcilers.pools import CREDENTIALS_FINALIZER


def _pool(cluster: ClusterKube, namespace: str, target: IpamTarget, name: str = "pool") -> None:
    cluster.phpipam_pool(
        namespace,
        name,
        endpoint=target.endpoint,
        app_id="capi",
        subnet_id=7,
        credentials=CREDENTIALS,
    )
    cluster.wait_pool_ready(namespace, name)


def _hosts(target: IpamTarget) -> dict[str, str]:
    assert target.mock is not None
    return {
        str(a.hostname): str(a.ip)
        for a in target.mock.store.subnet_addresses(7)
        if not a.is_gateway and not str(a.hostname).startswith("ipam-bridge-reserved")
    }


def test_a_foreign_claim_keeps_its_finalizer(
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    mock_phpipam: IpamTarget,
) -> None:
    operator()
    _pool(cluster, namespace, mock_phpipam)
    cluster.create(
        {
            "apiVersion": f"{capi.GROUP}/{cluster.version}",
            "kind": "IPAddressClaim",
            "metadata": {
                "name": "theirs",
                "namespace": namespace,
                "finalizers": [capi.CLAIM_FINALIZER],
            },
            "spec": {"poolRef": {"apiGroup": capi.GROUP, "kind": "InClusterIPPool", "name": "x"}},
        }
    )
    cluster.claim(namespace, "ours", "pool")
    cluster.wait_claims_bound(namespace, 1)
    cluster.delete_claim(namespace, "theirs")
    time.sleep(3)
    theirs = cluster.get_claim(namespace, "theirs")
    assert theirs is not None and theirs["metadata"].get("deletionTimestamp")
    assert theirs["metadata"]["finalizers"] == [capi.CLAIM_FINALIZER]
    assert not theirs.get("status")


def test_repointing_a_pool_is_refused_by_the_api_server(
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    mock_phpipam: IpamTarget,
) -> None:
    operator()
    _pool(cluster, namespace, mock_phpipam)
    with pytest.raises(ApiException) as refused:
        cluster.custom.patch_namespaced_custom_object(
            capi.GROUP,
            "v1alpha1",
            namespace,
            "phpipamippools",
            "pool",
            {"spec": {"subnetId": 9}},
        )
    assert refused.value.status == 422
    assert "immutable" in str(refused.value.body)


def test_namespace_deletion_releases_every_address_then_completes(
    cluster: ClusterKube,
    namespace: str,
    operator: Callable[..., OperatorThread],
    mock_phpipam: IpamTarget,
) -> None:
    operator()
    _pool(cluster, namespace, mock_phpipam)
    for i in range(3):
        cluster.claim(namespace, f"m{i}", "pool")
    cluster.wait_claims_bound(namespace, 3)
    secret = cluster.core.read_namespaced_secret("pool-credentials", namespace)
    assert CREDENTIALS_FINALIZER in (secret.metadata.finalizers or [])
    assert len(_hosts(mock_phpipam)) == 3
    cluster.core.delete_namespace(namespace)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            cluster.core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                break
            raise
        time.sleep(1)
    else:
        pytest.fail(f"namespace {namespace} still there after 120 s")
    assert _hosts(mock_phpipam) == {}
