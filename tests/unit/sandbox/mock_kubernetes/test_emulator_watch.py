"""List/watch of the in-memory Kubernetes API: selectors, resume, snapshots, shutdown."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from emulator_helpers import GROUP, WIDGETS, WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes

ALL_WIDGETS = f"/apis/{GROUP}/v2/widgets"
MERGE = "application/merge-patch+json"


def watch(url: str, **params: Any) -> Iterator[dict[str, Any]]:
    """Yield watch events until the server ends the stream (timeoutSeconds) or one is enough."""
    params = {"watch": "true", "timeoutSeconds": "2", **params}
    with requests.get(url, params=params, stream=True, timeout=5) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                yield json.loads(line)


def take(url: str, count: int, **params: Any) -> list[tuple[str, str]]:
    events = []
    for event in watch(url, **params):
        events.append((event["type"], event["object"]["metadata"]["name"]))
        if len(events) == count:
            break
    return events


LABELS = {
    "a": {"tier": "web", "env": "prod"},
    "b": {"tier": "db", "env": "prod"},
    "c": {"tier": "web"},
    "d": {},
}


@pytest.fixture
def labelled(api: Api) -> Api:
    for name, labels in LABELS.items():
        api("POST", WIDGETS_PATH, widget(name, metadata={"name": name, "labels": labels}))
    return api


@pytest.mark.parametrize(
    "selector",
    [
        "tier=web",
        "tier==web",
        "tier!=web",
        "tier in (web,db)",
        "tier notin (web)",
        "env",
        "!env",
        "tier=web,env=prod",
        "tier in (web, db),!env",
    ],
)
def test_label_selectors_on_list_and_watch(
    labelled: Api, kube: EmulatedKubernetes, selector: str
) -> None:
    from mock_kubernetes import LabelSelector

    parsed = LabelSelector.parse(selector)
    expected = sorted(
        n for n, labels in LABELS.items() if parsed.matches({"metadata": {"labels": labels}})
    )
    _, listed = labelled("GET", WIDGETS_PATH, labelSelector=selector)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == expected
    events = list(watch(kube.url + ALL_WIDGETS, labelSelector=selector, timeoutSeconds="0.05"))
    assert sorted(e["object"]["metadata"]["name"] for e in events) == expected


def test_label_selector_semantics_table() -> None:
    from mock_kubernetes import LabelSelector

    def sel(s: str, labels: dict[str, str]) -> bool:
        return LabelSelector.parse(s).matches({"metadata": {"labels": labels}})

    assert sel("tier=web", {"tier": "web"}) and not sel("tier=web", {})
    assert sel("tier!=web", {}) and not sel("tier!=web", {"tier": "web"})
    assert sel("tier notin (a,b)", {}) and not sel("tier notin (a,b)", {"tier": "b"})
    assert not sel("tier in (a,b)", {}) and sel("tier in (a,b)", {"tier": "a"})
    assert sel("!tier", {}) and not sel("tier", {})


def test_bad_selectors_are_400(api: Api) -> None:
    assert api("GET", WIDGETS_PATH, labelSelector="tier in web")[0] == 400
    assert api("GET", WIDGETS_PATH, fieldSelector="spec.x=1")[0] == 400


def test_field_selectors(labelled: Api) -> None:
    labelled("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    labelled("POST", f"/apis/{GROUP}/v2/namespaces/other/widgets", widget("a"))
    _, body = labelled("GET", ALL_WIDGETS, fieldSelector="metadata.name=a")
    assert sorted(i["metadata"]["namespace"] for i in body["items"]) == ["default", "other"]
    _, body = labelled(
        "GET", ALL_WIDGETS, fieldSelector="metadata.name=a,metadata.namespace!=other"
    )
    assert [i["metadata"]["namespace"] for i in body["items"]] == ["default"]


def test_namespaced_and_cluster_wide_list_and_watch(api: Api, kube: EmulatedKubernetes) -> None:
    api("POST", WIDGETS_PATH, widget("a"))
    api("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    api("POST", f"/apis/{GROUP}/v2/namespaces/other/widgets", widget("b"))
    assert len(api("GET", ALL_WIDGETS)[1]["items"]) == 2
    assert [i["metadata"]["name"] for i in api("GET", WIDGETS_PATH)[1]["items"]] == ["a"]
    events = list(watch(kube.url + WIDGETS_PATH, timeoutSeconds="0.05"))
    assert [e["object"]["metadata"]["name"] for e in events] == ["a"]


def test_fresh_watch_sends_current_state_then_changes(api: Api, kube: EmulatedKubernetes) -> None:
    api("POST", WIDGETS_PATH, widget("a"))
    stream = watch(kube.url + ALL_WIDGETS)
    first = next(stream)
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
    api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 1}}, content_type=MERGE)
    api("DELETE", f"{WIDGETS_PATH}/a")
    changes = [(e["type"], e["object"].get("spec")) for e in (next(stream), next(stream))]
    assert changes == [("MODIFIED", {"x": 1}), ("DELETED", {"x": 1})]
    stream.close()


def test_watch_resumes_from_resource_version(api: Api, kube: EmulatedKubernetes) -> None:
    api("POST", WIDGETS_PATH, widget("a"))
    _, listed = api("GET", WIDGETS_PATH)
    since = listed["metadata"]["resourceVersion"]
    api("POST", WIDGETS_PATH, widget("b"))
    api("PATCH", f"{WIDGETS_PATH}/a", {"spec": {"x": 1}}, content_type=MERGE)
    events = take(kube.url + ALL_WIDGETS, 2, resourceVersion=since)
    assert events == [("ADDED", "b"), ("MODIFIED", "a")]  # "a" is not replayed as ADDED


def test_label_transitions_become_added_and_deleted(api: Api, kube: EmulatedKubernetes) -> None:
    api("POST", WIDGETS_PATH, widget("a"))
    since = api("GET", WIDGETS_PATH)[1]["metadata"]["resourceVersion"]
    path = f"{WIDGETS_PATH}/a"
    api("PATCH", path, {"metadata": {"labels": {"on": "yes"}}}, content_type=MERGE)
    api("PATCH", path, {"spec": {"x": 1}}, content_type=MERGE)
    api("PATCH", path, {"metadata": {"labels": None}}, content_type=MERGE)
    events = take(kube.url + ALL_WIDGETS, 3, resourceVersion=since, labelSelector="on=yes")
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_expired_resource_version_gets_410() -> None:
    with EmulatedKubernetes(crds=[WIDGETS], history_limit=3) as kube:
        api = Api(kube.url)
        since = api("GET", WIDGETS_PATH)[1]["metadata"]["resourceVersion"]
        for i in range(5):
            api("POST", WIDGETS_PATH, widget(f"w{i}"))
        event = next(watch(kube.url + ALL_WIDGETS, resourceVersion=since))
        assert event["type"] == "ERROR" and event["object"]["code"] == 410
        recent = api("GET", WIDGETS_PATH)[1]["metadata"]["resourceVersion"]
        api("POST", WIDGETS_PATH, widget("late"))
        assert take(kube.url + ALL_WIDGETS, 1, resourceVersion=recent) == [("ADDED", "late")]


def test_watch_timeout_seconds_ends_stream(kube: EmulatedKubernetes) -> None:
    started = time.monotonic()
    assert list(watch(kube.url + ALL_WIDGETS, timeoutSeconds="0.2")) == []
    assert 0.2 <= time.monotonic() - started < 2


def test_shutdown_with_open_watch_is_fast() -> None:
    kube = EmulatedKubernetes(crds=[WIDGETS]).__enter__()
    opened = threading.Event()
    ended = threading.Event()

    def consume() -> None:
        try:
            with requests.get(
                kube.url + ALL_WIDGETS, params={"watch": "true"}, stream=True, timeout=10
            ) as response:
                opened.set()
                for _ in response.iter_lines():
                    pass
        except requests.RequestException:
            pass
        ended.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert opened.wait(5)
    started = time.monotonic()
    kube.close()
    assert time.monotonic() - started < 1.0
    assert ended.wait(2)


def test_watches_started_during_writes_miss_nothing(kube: EmulatedKubernetes) -> None:
    """Snapshot and subscription are one step: each watch sees every object exactly once."""
    count = 80
    results: list[list[str]] = []

    def watcher() -> None:
        names = [name for kind, name in take(kube.url + ALL_WIDGETS, count) if kind == "ADDED"]
        results.append(names)

    watchers = []
    writer = Api(kube.url)
    for i in range(count):
        writer("POST", WIDGETS_PATH, widget(f"w{i:02}"))
        if i % 16 == 5:  # open watches in the middle of the burst, concurrently with writes
            watchers.append(threading.Thread(target=watcher))
            watchers[-1].start()
    for thread in watchers:
        thread.join(10)
    assert len(results) == len(watchers) == 5
    for names in results:
        assert sorted(names) == [f"w{i:02}" for i in range(count)]
