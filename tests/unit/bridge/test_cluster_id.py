"""`bridge.cluster_id.resolve_cluster_id`: the setting, else the uid of namespace kube-system."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes.client import ApiException

from bridge.cluster_id import ClusterIdError, resolve_cluster_id
from bridge.settings import Settings

UID = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"


class Core:
    """A CoreV1Api's read_namespace: the answer (or the error), and the names asked."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def read_namespace(self, name: str) -> object:
        self.asked.append(name)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def namespace(uid: str | None) -> object:
    return SimpleNamespace(metadata=SimpleNamespace(uid=uid))


def test_the_setting_wins_and_nothing_is_read() -> None:
    core = Core(namespace(UID))
    assert resolve_cluster_id(Settings(cluster_id=" mgmt-eu-1 "), core) == "mgmt-eu-1"
    assert core.asked == []


def test_empty_setting_reads_the_uid_of_kube_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_CLUSTER_ID", "")
    core = Core(namespace(UID))
    assert resolve_cluster_id(Settings(), core) == UID
    assert core.asked == ["kube-system"]


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (ApiException(status=403, reason="Forbidden"), "HTTP 403 Forbidden"),
        (ConnectionRefusedError(), "ConnectionRefusedError"),
        (namespace(None), "no metadata.uid"),
    ],
)
def test_a_failure_names_the_setting(answer: object, shown: str) -> None:
    with pytest.raises(ClusterIdError) as raised:
        resolve_cluster_id(Settings(cluster_id=""), Core(answer))
    assert shown in str(raised.value) and "IPAM_BRIDGE_CLUSTER_ID" in str(raised.value)
