"""Events correlated as client-go's EventCorrelator does: counted, combined, rate-limited."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client import ApiException

from bridge.metrics import Metrics
from bridge.runtime.events import (
    AGGREGATE_INTERVAL_SECONDS,
    COMBINED_PREFIX,
    MAX_QUEUED_EVENTS,
    SPAM_BURST,
    SPAM_REFILL_SECONDS,
    EventCorrelator,
    EventRecorder,
)
from bridge.runtime.gateway import Kube, api_client
from mock_kubernetes import EmulatedKubernetes


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def thing(name: str = "c1", uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
    }


class Poster:
    """Records creates and patches; a patch of a name never created answers 404."""

    def __init__(self) -> None:
        self.created: dict[str, dict[str, Any]] = {}
        self.sent: list[tuple[str, str]] = []

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        name = event["metadata"]["name"]
        if name in self.created:
            raise ApiException(status=409, reason="AlreadyExists")
        self.sent.append(("create", name))
        self.created[name] = dict(event)

    def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        if name not in self.created:
            raise ApiException(status=404, reason="NotFound")
        self.sent.append(("patch", name))
        self.created[name].update(patch)


def recorder(clock: Clock) -> tuple[EventRecorder, Poster]:
    poster = Poster()
    return EventRecorder(poster, background=False, correlator=EventCorrelator(clock=clock)), poster


def test_a_repeat_patches_the_count_and_last_timestamp_of_the_event_told_before() -> None:
    clock = Clock()
    events, poster = recorder(clock)
    events.post(thing(), "Warning", "PoolNotReady", "pool p not found")
    clock.now += 30
    events.post(thing(), "Warning", "PoolNotReady", "pool p not found")
    events.post(thing(), "Warning", "PoolNotReady", "pool p not found")
    [(verb, name)] = poster.sent[:1]
    assert verb == "create" and poster.sent[1:] == [("patch", name), ("patch", name)]
    (event,) = poster.created.values()
    assert event["count"] == 3
    assert event["firstTimestamp"] == "2027-01-15T08:00:00Z"
    assert event["lastTimestamp"] == "2027-01-15T08:00:30Z"
    assert event["involvedObject"]["uid"] == "u1" and name.startswith("c1.")
    # another object, type, reason or message is another Event
    events.post(thing("c2", "u2"), "Warning", "PoolNotReady", "pool p not found")
    events.post(thing(), "Normal", "PoolNotReady", "pool p not found")
    events.post(thing(), "Warning", "Other", "pool p not found")
    events.post(thing(), "Warning", "PoolNotReady", "pool q not found")
    assert [verb for verb, _ in poster.sent[3:]] == ["create"] * 4


def test_similar_events_beyond_ten_messages_in_ten_minutes_are_combined_into_one() -> None:
    clock = Clock()
    events, poster = recorder(clock)
    for i in range(9):
        events.post(thing(), "Warning", "AllocationFailed", f"attempt {i}")
        clock.now += 60  # within 10 minutes of the previous one
    assert len(poster.created) == 9
    for i in range(9, 14):
        events.post(thing(), "Warning", "AllocationFailed", f"attempt {i}")
    combined = [e for e in poster.created.values() if e["message"].startswith(COMBINED_PREFIX)]
    assert len(poster.created) == 10 and len(combined) == 1
    assert combined[0]["count"] == 5 and combined[0]["message"] == COMBINED_PREFIX + "attempt 13"
    # after a quiet interval, messages are told as they are again
    clock.now += AGGREGATE_INTERVAL_SECONDS + 1
    events.post(thing(), "Warning", "AllocationFailed", "attempt 14")
    assert poster.created[poster.sent[-1][1]]["message"] == "attempt 14"


def test_an_object_gets_a_burst_of_25_events_then_one_per_5_minutes() -> None:
    clock = Clock()
    events, poster = recorder(clock)
    for i in range(SPAM_BURST + 5):
        events.post(thing(), "Normal", f"Reason{i}", "m")  # distinct: no counting
    assert len(poster.sent) == SPAM_BURST
    events.post(thing("c2", "u2"), "Normal", "Reason0", "m")  # another object: its own bucket
    assert len(poster.sent) == SPAM_BURST + 1
    clock.now += SPAM_REFILL_SECONDS
    events.post(thing(), "Normal", "Late1", "m")
    events.post(thing(), "Normal", "Late2", "m")
    assert [poster.created[n]["reason"] for _, n in poster.sent[-1:]] == ["Late1"]


class BlockedPoster(Poster):
    """A poster whose sends wait until `go` is set (an API server that does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.lock = threading.Lock()

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        assert self.go.wait(30)
        with self.lock:
            super().create_event(namespace, event)


def test_at_most_1000_events_wait_to_be_posted_the_rest_are_dropped_and_counted() -> None:
    poster, metrics = BlockedPoster(), Metrics()
    events = EventRecorder(poster, on_drop=metrics.event_dropped)
    total = MAX_QUEUED_EVENTS + 250
    assert MAX_QUEUED_EVENTS == 1000  # client-go's maxQueuedEvents
    for i in range(total):  # one object each: no spam filter
        events.post(thing(f"c{i}", f"u{i}"), "Normal", "Bound", "m")
    assert events.queued == MAX_QUEUED_EVENTS
    assert events.dropped == {"queue_full": 250}
    dropped = metrics.registry.get_sample_value
    assert dropped("ipam_bridge_events_dropped_total", {"reason": "queue_full"}) == 250
    assert dropped("ipam_bridge_events_dropped_total", {"reason": "spam_filter"}) == 0
    poster.go.set()
    events.close()  # posts those queued
    assert len(poster.sent) == MAX_QUEUED_EVENTS and events.queued == 0
    events.post(thing("after"), "Normal", "Bound", "m")  # room again
    events.close()
    assert len(poster.sent) == MAX_QUEUED_EVENTS + 1


def test_an_event_the_spam_filter_drops_is_counted() -> None:
    metrics = Metrics()
    events = EventRecorder(
        Poster(),
        background=False,
        correlator=EventCorrelator(clock=Clock()),
        on_drop=metrics.event_dropped,
    )
    for i in range(SPAM_BURST + 3):
        events.post(thing(), "Normal", f"Reason{i}", "m")
    assert events.dropped == {"spam_filter": 3}
    value = metrics.registry.get_sample_value
    assert value("ipam_bridge_events_dropped_total", {"reason": "spam_filter"}) == 3


def test_a_patch_of_an_event_that_is_gone_creates_it_again() -> None:
    clock = Clock()
    events, poster = recorder(clock)
    events.post(thing(), "Warning", "PoolNotReady", "m")
    poster.created.clear()  # expired on the server
    events.post(thing(), "Warning", "PoolNotReady", "m")
    (event,) = poster.created.values()
    assert event["count"] == 2 and [v for v, _ in poster.sent] == ["create", "create"]


def test_memory_is_bounded_by_the_caches_size() -> None:
    correlator = EventCorrelator(clock=Clock(), entries=50)
    for i in range(500):
        correlator.correlate(thing(f"c{i}", f"u{i}"), "Warning", "R", f"m{i}")
    assert correlator.sizes() == (50, 50, 50)


@pytest.fixture
def kube() -> Iterator[Kube]:
    with EmulatedKubernetes() as emulator:
        config = kubernetes.client.Configuration()
        config.host = emulator.url
        config.retries = False
        client = Kube(api_client(config))
        yield client
        client.close()


def test_against_the_in_memory_api_a_repeat_is_one_event_with_a_count(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    times = iter([1_700_000_000.0, 1_700_000_030.0, 1_700_000_060.0])
    correlator = EventCorrelator(clock=lambda: next(times))
    events = EventRecorder(kube, background=False, correlator=correlator)
    for _ in range(3):
        events.post(thing(), "Warning", "PoolNotReady", "pool p not found")
    [event] = kube.core.list_namespaced_event("ns").items
    assert (event.type, event.reason, event.message, event.count) == (
        "Warning",
        "PoolNotReady",
        "pool p not found",
        3,
    )
    assert (event.involved_object.kind, event.involved_object.uid) == ("IPAddressClaim", "u1")
    assert (event.source.component, event.reporting_component) == ("ipam-bridge", "ipam-bridge")
    start = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert event.first_timestamp == start
    assert event.last_timestamp == start + datetime.timedelta(minutes=1)
