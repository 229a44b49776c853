"""Status patches guarded by resourceVersion, against the in-memory Kubernetes API."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest
from fakes import phpipam_pool

from bridge.models import IPPool
from bridge.objects.client import ObjectClient, claim_resource, pool_resource
from bridge.runtime.gateway import Outcome, api_client
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.sandbox import crd_documents

NS = "default"


@pytest.fixture
def kube() -> Iterator[ObjectClient]:
    with EmulatedKubernetes(crds=crd_documents()) as emulator:
        config = kubernetes.client.Configuration()
        config.host = emulator.url
        config.retries = False
        client = ObjectClient(api_client(config))
        yield client
        client.close()


def claim_body(name: str) -> dict[str, object]:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"poolRef": {"apiGroup": "ipam.example.com", "kind": "P", "name": "p"}},
    }


def test_a_claim_status_patch_on_a_stale_resource_version_is_a_conflict_and_writes_nothing(
    kube: ObjectClient,
) -> None:
    created = kube.create(claim_resource("v1beta2"), claim_body("c1"))
    assert created.obj is not None
    read = created.obj["metadata"]["resourceVersion"]
    other = {
        "type": "Audited",
        "status": "True",
        "reason": "Checked",
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    first = kube.patch_claim_status("v1beta2", NS, "c1", {"conditions": [other]})
    assert first.outcome is Outcome.WRITTEN and first.obj is not None
    ready = {**other, "type": "Ready"}
    stale = kube.patch_claim_status(
        "v1beta2", NS, "c1", {"conditions": [ready]}, resource_version=read
    )
    assert stale.outcome is Outcome.CONFLICT
    stored = kube.get_claim("v1beta2", NS, "c1")
    assert stored is not None and stored["status"]["conditions"] == [other]
    current = first.obj["metadata"]["resourceVersion"]
    fresh = kube.patch_claim_status(
        "v1beta2", NS, "c1", {"conditions": [other, ready]}, resource_version=current
    )
    assert fresh.outcome is Outcome.WRITTEN and fresh.obj is not None
    assert [c["type"] for c in fresh.obj["status"]["conditions"]] == ["Audited", "Ready"]


def test_a_merge_patch_answers_a_write_conflict_on_a_stale_version_and_gone_when_absent(
    kube: ObjectClient,
) -> None:
    resource = claim_resource("v1beta2")
    created = kube.create(resource, claim_body("c1"))
    assert created.obj is not None
    read = created.obj["metadata"]["resourceVersion"]
    labelled = kube.patch(resource, NS, "c1", {"metadata": {"labels": {"a": "1"}}})
    assert labelled.outcome is Outcome.WRITTEN and labelled.obj is not None
    assert labelled.obj["metadata"]["labels"] == {"a": "1"}
    stale = {"metadata": {"resourceVersion": read, "labels": {"a": "2"}}}
    assert kube.patch(resource, NS, "c1", stale).outcome is Outcome.CONFLICT
    assert kube.patch(resource, NS, "absent", {"metadata": {"labels": {}}}).outcome is (
        Outcome.GONE
    )


def test_pool_writes_answer_a_conflict_on_a_stale_version_and_gone_when_absent(
    kube: ObjectClient,
) -> None:
    body = phpipam_pool()
    body["metadata"]["namespace"] = NS
    created = kube.create(pool_resource("PHPIPAMIPPool"), body)
    assert created.obj is not None
    read = created.obj["metadata"]["resourceVersion"]
    pool = IPPool.from_body(created.obj, "PHPIPAMIPPool")
    assert kube.annotate_pool(pool, "a", "1").outcome is Outcome.WRITTEN
    assert kube.annotate_pool(pool, "a", None).outcome is Outcome.UNCHANGED  # as read: none
    stale = kube.patch_pool_status(
        NS, "PHPIPAMIPPool", "pool", {"observedGeneration": 1}, resource_version=read
    )
    assert stale.outcome is Outcome.CONFLICT  # answered, not raised
    stored = kube.get_pool(NS, "PHPIPAMIPPool", "pool")
    assert stored is not None and "observedGeneration" not in stored.get("status", {})
    absent = kube.patch_pool_status(NS, "PHPIPAMIPPool", "absent", {"observedGeneration": 1})
    assert absent.outcome is Outcome.GONE
    gone = IPPool.from_body({**created.obj, "metadata": {"name": "absent", "namespace": NS}})
    assert kube.annotate_pool(gone, "a", "1").outcome is Outcome.GONE
