"""`Kube` creates and patches core/v1 Events against the in-memory Kubernetes API."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import kubernetes.client
import pytest

from bridge.runtime.events import EventCorrelator, EventRecorder
from bridge.runtime.gateway import Kube, api_client
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.sandbox import crd_documents

CLAIM = {
    "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
    "kind": "IPAddressClaim",
    "metadata": {"name": "c1", "namespace": "default", "uid": "u-1"},
}


@pytest.fixture
def kube() -> Iterator[Kube]:
    with EmulatedKubernetes(crds=crd_documents()) as emulator:
        config = kubernetes.client.Configuration()
        config.host = emulator.url
        config.retries = False
        client = Kube(api_client(config))
        yield client
        client.close()


def test_an_event_told_twice_is_created_once_then_counted(kube: Kube) -> None:
    times = iter([1_700_000_000.0, 1_700_000_060.0])
    clock = EventCorrelator(clock=lambda: next(times))
    recorder = EventRecorder(kube, background=False, correlator=clock)
    recorder.post(CLAIM, "Warning", "NoPool", "pool p is missing")
    recorder.post(CLAIM, "Warning", "NoPool", "pool p is missing")
    [event] = kube.core.list_namespaced_event("default").items
    assert (event.type, event.reason, event.message, event.count) == (
        "Warning",
        "NoPool",
        "pool p is missing",
        2,
    )
    assert (event.involved_object.kind, event.involved_object.uid) == ("IPAddressClaim", "u-1")
    assert (event.source.component, event.reporting_component) == ("ipam-bridge", "ipam-bridge")
    start = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert event.first_timestamp == start
    assert event.last_timestamp == start + datetime.timedelta(minutes=1)
