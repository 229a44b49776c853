"""`Kube` lists in pages (limit/continue) against the in-memory Kubernetes API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from bridge.runtime.gateway import Kube, Resource, api_client
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.sandbox import crd_documents

CLAIMS = Resource("ipam.cluster.x-k8s.io", "v1beta2", "ipaddressclaims", "IPAddressClaim")


@pytest.fixture
def emulator() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=crd_documents()) as emulator:
        yield emulator


@pytest.fixture
def kube(emulator: EmulatedKubernetes) -> Iterator[Kube]:
    config = kubernetes.client.Configuration()
    config.host = emulator.url
    config.retries = False
    client = Kube(api_client(config))
    yield client
    client.close()


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"poolRef": {"apiGroup": "ipam.example.com", "kind": "P", "name": "p"}},
    }


def spy(kube: Kube, after_first: Any = None) -> list[tuple[Any, Any]]:
    """Record (limit, continue) of every list request; call ``after_first`` after page 1."""
    calls: list[tuple[Any, Any]] = []
    listed = kube.custom.list

    def recorded(
        group: str, version: str, plural: str, ns: Any, limit: Any = None, token: Any = None
    ) -> Any:
        calls.append((limit, token))
        if len(calls) == 2 and after_first is not None:
            after_first()
        return listed(group, version, plural, ns, limit, token)

    kube.custom.list = recorded  # type: ignore[method-assign]
    return calls


def test_a_list_is_read_in_pages_and_keeps_the_first_pages_resource_version(kube: Kube) -> None:
    for i in range(7):
        assert kube.create(CLAIMS, claim(f"c{i}")).written
    calls = spy(kube)
    listed = kube.list_collection(CLAIMS, None, page_size=3)
    assert [o["metadata"]["name"] for o in listed.items] == [f"c{i}" for i in range(7)]
    assert all(o["kind"] == "IPAddressClaim" for o in listed.items)
    assert [limit for limit, _ in calls] == [3, 3, 3]
    assert calls[0][1] is None and None not in [token for _, token in calls[1:]]
    assert listed.resource_version
    assert len(kube.list(CLAIMS, ["default"])) == 7  # list() pages too (500 a page)
    assert [o["metadata"]["name"] for o in kube.list(CLAIMS, limit=2)] == ["c0", "c1"]


def test_an_expired_continue_token_reads_the_list_again_whole(
    kube: Kube, emulator: EmulatedKubernetes
) -> None:
    for i in range(5):
        kube.create(CLAIMS, claim(f"c{i}"))

    def compacted() -> None:
        kube.create(CLAIMS, claim("c9"))
        emulator.store.expire_history()

    calls = spy(kube, after_first=compacted)
    listed = kube.list_collection(CLAIMS, "default", page_size=2)
    assert [o["metadata"]["name"] for o in listed.items] == [*(f"c{i}" for i in range(5)), "c9"]
    assert [limit for limit, _ in calls] == [2, 2, None]  # the 410, then one whole list
    assert calls[2][1] is None
