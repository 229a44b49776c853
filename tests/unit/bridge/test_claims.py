"""bridge.claims: release decisions that must never free an address another cluster holds."""

from typing import Any, cast

import pytest

from bridge.claims import ClaimPaused, release_address
from bridge.context import Context
from bridge.kube import Kube
from bridge.settings import Settings

GROUP = "ipam.cluster.x-k8s.io"


class FakeKube:
    """Only what `release_address` reads; any backend or pool access fails the test."""

    def __init__(
        self, address: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None
    ) -> None:
        self.address = address
        self.cluster = cluster
        self.deleted: list[str] = []

    def get_ip_address(self, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.address

    def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cluster

    def get_pool(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("the pool must not be looked up")

    def delete_ip_address(self, version: str, namespace: str, name: str) -> None:
        self.deleted.append(name)


def claim(*, bound: bool, cluster: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "pool"}}
    if cluster:
        spec["clusterName"] = cluster
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": "m1",
            "namespace": "ns",
            "uid": "u",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": {"addressRef": {"name": "m1"}} if bound else {},
    }


def context(kube: FakeKube) -> Context:
    return Context(settings=Settings(), kube=cast(Kube, kube), address_version="v1beta2")


def test_bound_claim_whose_address_was_force_removed_is_let_go_without_the_ipam() -> None:
    kube = FakeKube(address=None)
    outcome = release_address(context(kube), claim(bound=True))
    assert outcome.reason == "ReleaseSkipped"
    assert not outcome.backend_calls
    assert "ns/m1" in outcome.message and "left" in outcome.message
    assert kube.deleted == []


def test_force_removed_address_still_waits_while_the_cluster_is_paused() -> None:
    kube = FakeKube(address=None, cluster={"spec": {"paused": True}})
    with pytest.raises(ClaimPaused):
        release_address(context(kube), claim(bound=True, cluster="c1"))


def test_unbound_claim_still_asks_the_pool() -> None:
    kube = FakeKube(address=None)
    with pytest.raises(AssertionError, match="pool must not be looked up"):
        release_address(context(kube), claim(bound=False))
