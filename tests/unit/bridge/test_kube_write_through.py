"""`bridge.kube.Kube`: write-through to the cache, and deleting an IPAddress without a read."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiException

from bridge.capi import ADDRESS_FINALIZER
from bridge.kube import Kube


class FakeCustom:
    """The CustomObjectsApi calls `Kube.delete_ip_address` makes, recorded."""

    def __init__(self, stored_version: str) -> None:
        self.stored_version = stored_version
        self.calls: list[tuple[str, ...]] = []

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("get",))
        meta = {"finalizers": [ADDRESS_FINALIZER], "resourceVersion": self.stored_version}
        return {"metadata": meta}

    def patch_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        version = args[-1]["metadata"]["resourceVersion"]
        self.calls.append(("patch", version))
        if version != self.stored_version:
            raise ApiException(status=409, reason="Conflict")
        return {}

    def delete_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("delete",))
        return {}


def kube_with(custom: FakeCustom) -> tuple[Kube, list[tuple[str, str, str]]]:
    kube = Kube.__new__(Kube)
    kube.custom = custom  # type: ignore[assignment]
    deleted: list[tuple[str, str, str]] = []
    kube.on_stored = None
    kube.on_deleted = lambda *key: deleted.append(key)
    return kube, deleted


def seen(version: str) -> dict[str, Any]:
    return {"metadata": {"finalizers": [ADDRESS_FINALIZER], "resourceVersion": version}}


def test_an_ipaddress_seen_in_the_cache_is_deleted_without_a_read() -> None:
    custom = FakeCustom("7")
    kube, deleted = kube_with(custom)
    kube.delete_ip_address("v1beta2", "ns", "m1", seen("7"))
    assert custom.calls == [("patch", "7"), ("delete",)]
    assert deleted == [("ipaddresses", "ns", "m1")]


def test_a_stale_cache_costs_one_read_on_the_conflict_path_only() -> None:
    custom = FakeCustom("9")
    kube, deleted = kube_with(custom)
    kube.delete_ip_address("v1beta2", "ns", "m1", seen("7"))
    assert custom.calls == [("patch", "7"), ("get",), ("patch", "9"), ("delete",)]
    assert deleted == [("ipaddresses", "ns", "m1")]


def test_writes_of_claims_and_ipaddresses_are_passed_to_the_cache() -> None:
    kube = Kube.__new__(Kube)
    stored: list[tuple[str, Any]] = []
    kube.on_stored = lambda plural, body: stored.append((plural, body))
    assert kube._stored("ipaddresses", {"metadata": {"name": "a"}}) == {"metadata": {"name": "a"}}
    assert kube._stored("ipaddressclaims", None) is None  # nothing written: nothing passed
    assert stored == [("ipaddresses", {"metadata": {"name": "a"}})]
