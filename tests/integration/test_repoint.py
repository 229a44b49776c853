"""Re-pointing a pool (issue 9, item 5): its IPAM location is immutable once it exists.

Editing a pool's subnet or endpoint while claims hold addresses used to be accepted, and the
later releases then searched the new location and left the old entries in the IPAM for good.
The CRDs' CEL transition rules now refuse it (``422 Invalid``, "... is immutable"), enforced by
the in-memory API server as by a real one (real-cluster.md item 12), with the real operator
running: the pool keeps its spec, and deleting the claims releases their entries.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from integration_env import CREDENTIALS, NAMESPACE

from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer

GROUP = "ipam.cluster.x-k8s.io"
CLAIMS = ("m1", "m2", "m3")


def entries(phpipam: MockPhpipamServer, subnet_id: int) -> set[str]:
    """Hostnames registered in a subnet (the gateway row aside)."""
    return {str(a.hostname) for a in phpipam.store.subnet_addresses(subnet_id) if not a.is_gateway}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"subnetId": 10}, "spec"),  # a spec-level rule (has() on both sides)
        ({"subnetId": None, "subnet": "10.20.2.0/28"}, "spec"),
        ({"endpoint": "http://127.0.0.1:9/api"}, "spec.endpoint"),  # a field-level rule
    ],
    ids=["subnet-id", "subnet-id-to-cidr", "endpoint"],
)
def test_repointing_a_pool_with_bound_claims_is_refused(
    sandbox: Sandbox, phpipam: MockPhpipamServer, change: dict[str, Any], field: str
) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    for name in CLAIMS:
        sandbox.claim(NAMESPACE, name, "pool")
    sandbox.wait_claims_bound(NAMESPACE, len(CLAIMS))
    assert entries(phpipam, 7) == {f"{name}.{NAMESPACE}" for name in CLAIMS}
    before = sandbox.wait_pool_ready(NAMESPACE, "pool")

    # As kubectl would send it: a merge patch through the HTTP API.
    with sandbox.kube.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(kubernetes.client.ApiException) as caught:
            custom.patch_namespaced_custom_object(
                GROUP, "v1alpha1", NAMESPACE, "phpipamippools", "pool", {"spec": change}
            )
    assert caught.value.status == 422
    status = json.loads(caught.value.body)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(f'PHPIPAMIPPool.{GROUP} "pool" is invalid: ')
    assert f"{field}: Invalid value: " in status["message"]
    assert "immutable" in status["message"]
    assert {cause["field"] for cause in status["details"]["causes"]} == {field}

    # The pool keeps its spec (and generation), and stays Ready.
    after = sandbox.wait_pool_ready(NAMESPACE, "pool")
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]

    # Releases go where the allocations went: nothing is left in the IPAM.
    for name in CLAIMS:
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE)
    assert entries(phpipam, 7) == set()
    assert entries(phpipam, 10) == set()
