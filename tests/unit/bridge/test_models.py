"""models: the typed views of Kubernetes objects (null handling, pools, pool status)."""

from __future__ import annotations

from bridge.models import IPAddress, ObjectMeta


def test_a_body_without_nulls_is_validated_as_it_is_not_copied() -> None:
    body = {"name": "a", "namespace": "ns", "labels": {"k": "v"}}
    assert ObjectMeta._null_is_omitted(body) is body


def test_a_null_reads_as_an_omitted_field() -> None:
    assert ObjectMeta._null_is_omitted({"name": "a", "uid": None}) == {"name": "a"}
    address = IPAddress.model_validate(
        {"metadata": {"name": "a", "deletionTimestamp": None}, "spec": {"gateway": None}}
    )
    assert address.metadata.deletion_timestamp is None and address.spec.gateway is None


# --- pools: the kind decides Global, never a missing namespace ----------------------------

_SPEC = {
    "endpoint": "https://phpipam.example.com/api",
    "appId": "capi",
    "subnet": "10.0.0.0/24",
    "credentialsRef": {"name": "creds"},
}


def _pool(kind: str, **metadata: str) -> dict[str, object]:
    return {"kind": kind, "metadata": {"name": "p", **metadata}, "spec": dict(_SPEC)}


def test_a_namespaced_pool_without_namespace_is_not_a_global_pool() -> None:
    from bridge.models import IPPool

    pool = IPPool.from_body(_pool("PHPIPAMIPPool"))
    assert (pool.problem, pool.is_global) == ("", False)
    assert pool.spec is not None


def test_a_global_pool_with_a_namespace_in_its_metadata_is_still_global() -> None:
    from bridge.models import IPPool

    for metadata in ({}, {"namespace": "team-a"}):
        pool = IPPool.from_body(_pool("GlobalPHPIPAMIPPool", **metadata))
        assert pool.problem == "spec.credentialsRef.namespace is required on a Global pool"
        assert pool.namespace == ""
