"""The management cluster's identity (`bridge.cluster_id.resolve_cluster_id`), read at start-up."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiException

from bridge.cluster_id import ClusterIdError, resolve_cluster_id
from bridge.settings import Settings


class Core:
    """A ``CoreV1Api`` stand-in: ``read_namespace`` answers ``answer`` (raised if an error)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.read: list[str] = []

    def read_namespace(self, name: str) -> Any:
        self.read.append(name)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def namespace(uid: str | None) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name="kube-system", uid=uid))


def test_the_setting_wins_and_costs_no_api_call() -> None:
    core = Core(namespace("uid-of-kube-system"))
    assert resolve_cluster_id(Settings(cluster_id="  mgmt-eu-1 "), core) == "mgmt-eu-1"
    assert core.read == []


def test_without_the_setting_the_uid_of_kube_system_is_the_identity() -> None:
    core = Core(namespace("6a1f2c4e-0d7b-4f4e-9d2b-1c0f3e5a7b9d"))
    assert resolve_cluster_id(Settings(), core) == "6a1f2c4e-0d7b-4f4e-9d2b-1c0f3e5a7b9d"
    assert core.read == ["kube-system"]


@pytest.mark.parametrize(("status", "transient"), [(403, False), (404, False), (503, True)])
def test_a_failed_read_names_the_setting(status: int, transient: bool) -> None:
    core = Core(ApiException(status=status, reason="Forbidden" if status == 403 else "x"))
    with pytest.raises(ClusterIdError) as error:
        resolve_cluster_id(Settings(), core)
    assert "IPAM_BRIDGE_CLUSTER_ID" in str(error.value)
    assert "kube-system" in str(error.value) and str(status) in str(error.value)
    assert error.value.transient is transient


def test_a_namespace_without_a_uid_is_refused() -> None:
    with pytest.raises(ClusterIdError, match="IPAM_BRIDGE_CLUSTER_ID"):
        resolve_cluster_id(Settings(), Core(namespace("")))


def test_no_answer_at_all_is_transient() -> None:
    with pytest.raises(ClusterIdError, match="IPAM_BRIDGE_CLUSTER_ID") as error:
        resolve_cluster_id(Settings(), Core(ConnectionRefusedError()))
    assert error.value.transient and "ConnectionRefusedError" in str(error.value)


@pytest.mark.parametrize(("status", "error"), [(403, "PermanentError"), (503, "TemporaryError")])
def test_start_up_stops_on_a_refusal_and_tries_again_without_an_answer(
    status: int, error: str
) -> None:
    # bridge.handlers.lifecycle: a refusal ends the operator with the message (exit 1, no
    # crash loop of tracebacks); a 5xx makes kopf run the start-up again.
    import asyncio

    import kopf

    from bridge.handlers import lifecycle

    kube = SimpleNamespace(core=Core(ApiException(status=status, reason="x")))
    with pytest.raises(getattr(kopf, error)) as raised:
        asyncio.run(lifecycle._cluster_id(kube, Settings()))  # type: ignore[arg-type]
    assert "IPAM_BRIDGE_CLUSTER_ID" in str(raised.value)


def test_start_up_logs_the_identity_it_uses(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from bridge.handlers import lifecycle

    kube = SimpleNamespace(core=Core(namespace("uid-1")))
    with caplog.at_level("INFO", logger="bridge.handlers.lifecycle"):
        assert asyncio.run(lifecycle._cluster_id(kube, Settings())) == "uid-1"  # type: ignore[arg-type]
    assert "management cluster identity uid-1 (uid of kube-system)" in caplog.text
