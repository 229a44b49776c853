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
