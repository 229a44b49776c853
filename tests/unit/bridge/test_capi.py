import json
import re

import pytest
from kubernetes.client import ApiClient

from bridge import capi, models
from bridge.capi import Claim, Reason


def claim_body(version="v1beta2", **overrides):
    body = {
        "apiVersion": f"ipam.cluster.x-k8s.io/{version}",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": "m1-eth0-0",
            "namespace": "team-a",
            "uid": "uid-1",
            "generation": 3,
            "labels": {},
        },
        "spec": {
            "poolRef": {
                "apiGroup": "ipam.cluster.x-k8s.io",
                "kind": "PHPIPAMIPPool",
                "name": "pool",
            }
        },
    }
    body["spec"].update(overrides.pop("spec", {}))
    body["metadata"].update(overrides.pop("metadata", {}))
    body.update(overrides)
    return body


def test_claim_cluster_name_prefers_spec_over_label():
    body = claim_body(
        spec={"clusterName": "c-spec"}, metadata={"labels": {capi.CLUSTER_NAME_LABEL: "c-label"}}
    )
    assert Claim.from_body(body).cluster_name == "c-spec"
    body = claim_body(metadata={"labels": {capi.CLUSTER_NAME_LABEL: "c-label"}})
    assert Claim.from_body(body).cluster_name == "c-label"
    assert Claim.from_body(claim_body()).cluster_name is None


def test_claim_without_pool_kind_is_rejected():
    body = claim_body()
    body["spec"]["poolRef"] = {"name": "x"}
    with pytest.raises(ValueError, match="poolRef"):
        Claim.from_body(body)


@pytest.mark.parametrize(
    ("group", "kind", "ours"),
    [
        ("ipam.cluster.x-k8s.io", "PHPIPAMIPPool", True),
        ("ipam.cluster.x-k8s.io", "InfobloxIPPool", True),
        ("ipam.cluster.x-k8s.io", "InClusterIPPool", False),
        ("other.example.com", "PHPIPAMIPPool", False),
        ("", "PHPIPAMIPPool", False),
    ],
)
def test_pool_ref_is_ours(group, kind, ours):
    assert capi.PoolRef(group, kind, "p").is_ours is ours


@pytest.mark.parametrize(
    ("suffix", "expected"),
    [
        (None, "m1-eth0-0.team-a"),
        ("", "m1-eth0-0.team-a"),
        ("mgmt1.example.com", "m1-eth0-0.team-a.mgmt1.example.com"),
        (".mgmt1.example.com.", "m1-eth0-0.team-a.mgmt1.example.com"),
    ],
)
def test_hostname_for(suffix, expected):
    assert capi.hostname_for(Claim.from_body(claim_body()), suffix) == expected


def test_is_paused():
    assert capi.is_paused({capi.PAUSED_ANNOTATION: ""}, {})
    assert capi.is_paused({}, {"paused": True})
    assert not capi.is_paused({}, {"paused": False})
    assert not capi.is_paused(None, None)


def test_build_ip_address_follows_the_contract():
    claim = Claim.from_body(claim_body(spec={"clusterName": "c1"}))
    body = capi.build_ip_address(
        claim,
        version="v1beta2",
        pool_uid="pool-uid",
        address="10.0.0.5",
        prefix=24,
        gateway="10.0.0.1",
        hostname="m1-eth0-0.team-a",
    )
    assert body["apiVersion"] == "ipam.cluster.x-k8s.io/v1beta2"
    assert body["metadata"]["name"] == "m1-eth0-0"
    assert body["metadata"]["namespace"] == "team-a"
    assert body["metadata"]["finalizers"] == [capi.ADDRESS_FINALIZER]
    assert body["metadata"]["labels"] == {capi.CLUSTER_NAME_LABEL: "c1"}
    assert body["metadata"]["annotations"] == {capi.HOSTNAME_ANNOTATION: "m1-eth0-0.team-a"}
    owner, pool = body["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "name": "m1-eth0-0",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pool == {
        "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
        "kind": "PHPIPAMIPPool",
        "name": "pool",
        "uid": "pool-uid",
        "controller": False,
        "blockOwnerDeletion": True,
    }
    assert body["spec"] == {
        "address": "10.0.0.5",
        "prefix": 24,
        "gateway": "10.0.0.1",
        "claimRef": {"name": "m1-eth0-0"},
        "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "PHPIPAMIPPool", "name": "pool"},
    }


def test_build_ip_address_omits_unknown_gateway_and_label():
    claim = Claim.from_body(claim_body())
    body = capi.build_ip_address(
        claim,
        version="v1beta1",
        pool_uid="u",
        address="2001:db8::1",
        prefix=64,
        gateway=None,
        hostname="h",
    )
    assert "gateway" not in body["spec"]
    assert body["metadata"]["labels"] == {}
    assert body["apiVersion"].endswith("/v1beta1")


def test_claim_status_v1beta2_has_every_required_condition_field():
    status = capi.claim_status(
        capi.Claim.from_body(claim_body()),
        ready=True,
        reason="AddressAllocated",
        message="ok",
        address_ref="m1-eth0-0",
        now="2026-01-01T00:00:00Z",
    )
    assert status["addressRef"] == {"name": "m1-eth0-0"}
    (cond,) = status["conditions"]
    assert cond == {
        "type": "Ready",
        "status": "True",
        "reason": "AddressAllocated",
        "message": "ok",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 3,
    }
    assert "v1beta2" not in status


def test_claim_status_keeps_transition_time_and_other_conditions():
    body = claim_body(
        status={
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "PoolExhausted",
                    "message": "full",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                },
                {
                    "type": "Other",
                    "status": "True",
                    "reason": "X",
                    "message": "",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                },
            ]
        }
    )
    status = capi.claim_status(
        capi.Claim.from_body(body),
        ready=False,
        reason="PoolExhausted",
        message="still full",
        now="2026-01-01T00:00:00Z",
    )
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert by_type["Ready"]["message"] == "still full"
    assert by_type["Other"]["reason"] == "X"
    status = capi.claim_status(
        capi.Claim.from_body(body),
        ready=True,
        reason="AddressAllocated",
        message="ok",
        now="2026-01-01T00:00:00Z",
    )
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_claim_status_v1beta1_writes_both_condition_flavours():
    status = capi.claim_status(
        capi.Claim.from_body(claim_body("v1beta1")),
        ready=False,
        reason="PoolNotReady",
        message="pool missing",
        now="2026-01-01T00:00:00Z",
    )
    (legacy,) = status["conditions"]
    assert legacy["severity"] == "Warning"
    assert legacy["reason"] == "PoolNotReady"
    assert "observedGeneration" not in legacy
    (modern,) = status["v1beta2"]["conditions"]
    assert modern["reason"] == "PoolNotReady" and modern["observedGeneration"] == 3
    assert "severity" not in modern


@pytest.mark.parametrize(
    "reason", ["AddressAllocated", "PoolNotReady", "PoolExhausted", "AllocationFailed"]
)
def test_reasons_match_the_v1beta2_schema_pattern(reason):
    import re

    assert re.fullmatch(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", reason)


def test_ready_of_reads_the_served_shape():
    v2 = claim_body(
        status={"conditions": [{"type": "Ready", "status": "True", "reason": "AddressAllocated"}]}
    )
    assert capi.ready_of(v2) == ("True", "AddressAllocated")
    v1 = claim_body(
        "v1beta1",
        status={
            "conditions": [{"type": "Ready", "status": "False", "reason": "Legacy"}],
            "v1beta2": {
                "conditions": [{"type": "Ready", "status": "False", "reason": "PoolExhausted"}]
            },
        },
    )
    assert capi.ready_of(v1) == ("False", "PoolExhausted")
    assert capi.ready_of(claim_body()) == (None, None)


def test_claim_reads_null_fields_as_omitted():
    body = claim_body(
        metadata={"labels": None, "annotations": None, "finalizers": None},
        spec={"clusterName": None},
        status={"addressRef": None, "conditions": None},
    )
    claim = Claim.from_body(body)
    assert (claim.labels, claim.annotations, claim.finalizers) == ({}, {}, ())
    assert claim.cluster_name is None and claim.address_ref is None and not claim.deleting
    bound = Claim.from_body(
        claim_body(
            status={"addressRef": {"name": "m1-eth0-0"}},
            metadata={"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["f"]},
        )
    )
    assert (bound.address_ref, bound.deleting, bound.finalizers) == ("m1-eth0-0", True, ("f",))


def test_ip_address_model_reads_the_served_shape():
    address = models.IPAddress.model_validate(
        {
            "metadata": {"name": "a", "annotations": {capi.HOSTNAME_ANNOTATION: "h"}},
            "spec": {
                "address": "10.0.0.5",
                "prefix": 24,
                "claimRef": {"name": "a"},
                "poolRef": {"apiGroup": capi.GROUP, "kind": "PHPIPAMIPPool", "name": "p"},
                "unknown": "ignored",
            },
        }
    )
    assert (address.spec.address, address.spec.prefix, address.spec.gateway) == (
        "10.0.0.5",
        24,
        None,
    )
    assert address.spec.claim_ref.name == "a" and address.spec.pool_ref.kind == "PHPIPAMIPPool"
    assert address.metadata.annotations == {capi.HOSTNAME_ANNOTATION: "h"}


def test_reasons_are_one_str_enum_written_as_plain_strings():
    assert {r.value for r in Reason} == {
        "AddressAllocated",
        "PoolNotReady",
        "PoolExhausted",
        "AllocationFailed",
        "HostnameTaken",
        "AddressReleased",
        "ReleaseSkipped",
        "PoolReady",
        "InvalidSpec",
        "CredentialsNotFound",
        "AuthenticationFailed",
        "SubnetNotFound",
        "TLSVerificationFailed",
        "BackendUnavailable",
        "DeletionBlocked",
        # The drift audit (bridge.reconcilers.audit): the pool's InSync condition and its Events.
        "NoDrift",
        "DriftFound",
        "AddressRestored",
        "AddressMissing",
        "AddressConflict",
        "OrphanEntry",
    }
    for reason in Reason:
        assert re.fullmatch(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", reason)
    status = capi.claim_status(
        capi.Claim.from_body(claim_body("v1beta1")),
        ready=False,
        reason=Reason.POOL_EXHAUSTED,
        message="m",
    )
    written = json.loads(json.dumps(status))
    assert written["conditions"][0]["reason"] == "PoolExhausted"
    event = ApiClient().sanitize_for_serialization({"reason": Reason.RELEASED})
    assert json.dumps(event) == '{"reason": "AddressReleased"}'
    assert f"{Reason.DELETION_BLOCKED}" == str(Reason.DELETION_BLOCKED) == "DeletionBlocked"
