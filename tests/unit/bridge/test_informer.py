"""`bridge.runtime.informer.Informer`: list, then watch, against the in-memory API over HTTP."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from bridge.runtime.gateway import Collection, Kube, Resource, api_client
from bridge.runtime.informer import Event, Informer, Listed
from bridge.runtime.store import MISSING_UNKNOWN, Relisted, Store
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.objects import wait_for

GROUP = "example.com"
WIDGETS = Resource(GROUP, "v1", "widgets", "Widget")
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def widget(name: str, namespace: str = "default", *, ours: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ours": ours},
    }


class Recorder:
    """A sink that records what it is told (from the informer's thread)."""

    def __init__(self, fail: bool = False) -> None:
        self.listed: list[Listed] = []
        self.relisted: list[Relisted] = []
        self.events: list[Event] = []
        self.fail = fail
        self.lock = threading.Lock()

    def listed_(self, listed: Listed) -> None:
        with self.lock:
            self.listed.append(listed)

    def relisted_(self, relisted: Relisted) -> None:
        with self.lock:
            self.relisted.append(relisted)

    def event_(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)
        if self.fail:
            raise RuntimeError("a bug in the sink")

    def seen(self) -> list[tuple[str, str, bool]]:
        with self.lock:
            return [(e.type, str(e.key[1]), e.changed) for e in self.events]  # type: ignore[index]


class SinkOf:
    """Adapts a `Recorder` to the `Sink` protocol's method names."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def listed(self, listed: Listed) -> None:
        self.recorder.listed_(listed)

    def relisted(self, relisted: Relisted) -> None:
        self.recorder.relisted_(relisted)

    def event(self, event: Event) -> None:
        self.recorder.event_(event)


def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def wanted(body: Mapping[str, Any]) -> bool:
    return bool((body.get("spec") or {}).get("ours"))


@pytest.fixture
def emulator() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=[CRD]) as kube:
        yield kube


@pytest.fixture
def gateway(emulator: EmulatedKubernetes) -> Iterator[Kube]:
    # The operator's client: one attempt per request.
    with emulator.api_client() as plain, api_client(plain.configuration) as client:
        yield Kube(client)


def informer(
    gateway: Kube,
    cache: Store,
    recorder: Recorder,
    *,
    namespace: str | None = None,
    watch_seconds: int = 60,
    stall: float = 30.0,
    keep: Callable[[Mapping[str, Any]], bool] = wanted,
) -> Informer:
    return Informer(
        "widgets",
        list=lambda: gateway.list_collection(WIDGETS, namespace),
        watch=lambda version, read_timeout: gateway.watch(
            WIDGETS, namespace, version, timeout_seconds=watch_seconds, read_timeout=read_timeout
        ),
        store=cache,
        key=key_of,
        wanted=keep,
        sink=SinkOf(recorder),
        backoff=(0.05, 0.1),
        stall=stall,
    )


def names(items: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    return sorted(str(body["metadata"]["name"]) for _, body in items)


def test_the_first_list_fills_the_cache_then_every_later_change_is_an_event(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    emulator.create(widget("a"))
    emulator.create(widget("theirs", ours=False))
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        assert cache.synced and ("default", "a") in cache
        assert [names(listed.items) for listed in recorder.listed] == [["a"]]
        emulator.create(widget("b"))
        emulator.create(widget("theirs-2", ours=False))
        emulator.delete(f"{GROUP}/v1", "widgets", "a", "default")
        wait_for(lambda: len(recorder.seen()) >= 2, timeout=10)
        # Another's objects are neither cached nor told; the events come in the API's order.
        assert recorder.seen() == [("ADDED", "b", True), ("DELETED", "a", True)]
        assert ("default", "a") not in cache and ("default", "theirs-2") not in cache
        assert (watcher.lists, watcher.watches) == (1, 1)
    finally:
        watcher.stop()
    assert not watcher.alive


def test_our_own_write_reaches_the_store_through_the_watch_only(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        written = gateway.custom.create(GROUP, "v1", "widgets", "default", widget("mine"))
        wait_for(lambda: recorder.seen(), timeout=10)
        assert recorder.seen() == [("ADDED", "mine", True)]
        assert cache.version(("default", "mine")) == written["metadata"]["resourceVersion"]
    finally:
        watcher.stop()


def test_after_an_outage_the_watch_resumes_from_its_version_without_a_list(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    # client-go's reflector: a broken connection or a refused one resumes the watch from
    # the last resourceVersion; the API server replays what happened meanwhile.
    emulator.create(widget("a"))
    emulator.create(widget("b"))
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        wait_for(lambda: watcher.watches == 1, timeout=10)
        emulator.go_down()  # watches end, connections refused
        # The admin acts meanwhile, as through another API server.
        emulator.delete(f"{GROUP}/v1", "widgets", "a", "default")
        emulator.create(widget("c"))
        # The store stays trusted while the watch is down: no lookup reads the API.
        assert not cache.suspected and cache.lookup(("default", "b")) != MISSING_UNKNOWN
        emulator.come_up()
        wait_for(lambda: len(recorder.seen()) >= 2, timeout=20)
        assert recorder.seen() == [("DELETED", "a", True), ("ADDED", "c", True)]
        assert sorted(str(b["metadata"]["name"]) for b in cache.values()) == ["b", "c"]
        assert watcher.lists == 1 and recorder.relisted == [] and not cache.suspected
        assert watcher.watches >= 2
    finally:
        watcher.stop()


def test_a_watch_answered_410_gone_makes_the_scope_suspect_then_lists_it_again(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    emulator.create(widget("a"))
    emulator.create(widget("b"))
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder)
    suspected: list[bool] = []
    relisted = recorder.relisted_

    def relisted_(result: Relisted) -> None:  # the suspicion held until the list came
        suspected.append(cache.suspected)
        relisted(result)

    recorder.relisted_ = relisted_  # type: ignore[method-assign]
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        emulator.go_down(expire=True)  # its watch history is gone when it comes up
        emulator.delete(f"{GROUP}/v1", "widgets", "a", "default")
        emulator.create(widget("c"))
        emulator.come_up()
        wait_for(lambda: recorder.relisted, timeout=20)
        relisted_once = recorder.relisted[0]
        assert names(relisted_once.gone) == ["a"]
        assert names(relisted_once.changed) == ["c"]
        assert suspected == [False] and not cache.suspected  # replace ended the suspicion
        assert sorted(str(b["metadata"]["name"]) for b in cache.values()) == ["b", "c"]
        assert watcher.lists == 2
        # Watching again from the new list's version: later changes still arrive.
        emulator.create(widget("d"))
        wait_for(lambda: ("ADDED", "d", True) in recorder.seen(), timeout=10)
    finally:
        watcher.stop()


class FakeStream:
    """A watch stream that yields ``events``, then ends (or, with ``block``, waits for close)."""

    def __init__(self, events: list[dict[str, Any]], *, block: bool = False) -> None:
        self.events = events
        self.block = block
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self.events
        if self.block:
            self.closed.wait(30)

    def close(self) -> None:
        self.closed.set()


def test_a_watch_that_ends_at_once_is_resumed_after_a_backoff_reset_by_a_healthy_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # client-go's backoff manager: a very short watch (no event) waits, exponentially
    # longer, capped; a watch that brought an event resets it. No list either way.
    caplog.set_level(logging.INFO, logger="bridge.runtime.informer")
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}
    plan = [[], [], [], [], [bookmark], []]
    opened: list[tuple[str, float]] = []

    def watch(version: str, read_timeout: float) -> FakeStream:
        opened.append((version, time.monotonic()))
        return FakeStream(plan.pop(0)) if plan else FakeStream([], block=True)

    cache, recorder = Store("widgets"), Recorder()
    watcher = Informer(
        "widgets",
        list=lambda: Collection([], "5"),
        watch=watch,
        store=cache,
        key=key_of,
        wanted=wanted,
        sink=SinkOf(recorder),
        backoff=(0.05, 0.1, 0.2),
    )
    watcher.start()
    try:
        wait_for(lambda: len(opened) == 7, timeout=20)
    finally:
        watcher.stop()
    delays = [
        float(r.getMessage().rsplit(" in ", 1)[1].split()[0])
        for r in caplog.records
        if "ended at once without an event" in r.getMessage()
    ]
    assert delays == [0.05, 0.1, 0.2, 0.2, 0.05]  # capped, then reset by the bookmark's watch
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(opened)]
    assert all(gap >= delay for gap, delay in zip(gaps[:4], delays[:4], strict=True))  # waited
    assert [version for version, _ in opened] == ["5"] * 5 + ["7", "7"]
    assert watcher.lists == 1 and not cache.suspected


def test_a_watch_the_server_ends_is_resumed_without_a_list(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder, watch_seconds=1)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        wait_for(lambda: watcher.watches >= 3, timeout=20)
        emulator.create(widget("late"))
        wait_for(lambda: recorder.seen(), timeout=10)
        assert recorder.seen() == [("ADDED", "late", True)]
        assert watcher.lists == 1 and recorder.relisted == []
    finally:
        watcher.stop()


def test_a_failing_sink_is_logged_and_the_watch_goes_on(
    emulator: EmulatedKubernetes, gateway: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    cache, recorder = Store("widgets"), Recorder(fail=True)
    watcher = informer(gateway, cache, recorder)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        emulator.create(widget("x"))
        emulator.create(widget("y"))
        wait_for(lambda: len(recorder.seen()) == 2, timeout=10)
        assert ("default", "y") in cache
        assert "the sink of widgets failed" in caplog.text
    finally:
        watcher.stop()


def test_a_first_list_that_fails_is_tried_again(
    emulator: EmulatedKubernetes, gateway: Kube
) -> None:
    emulator.create(widget("a"))
    emulator.go_down()
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        assert not cache.synced and recorder.listed == []
        emulator.come_up()
        wait_for(lambda: recorder.listed, timeout=10)
        assert cache.synced and names(recorder.listed[0].items) == ["a"]
        assert watcher.lists >= 2
    finally:
        watcher.stop()


def test_stop_ends_an_open_watch_at_once(emulator: EmulatedKubernetes, gateway: Kube) -> None:
    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder, watch_seconds=600)
    watcher.start()
    assert watcher.wait_tried(10)
    wait_for(lambda: watcher.watches == 1, timeout=10)
    watcher.stop(timeout=30)
    # The watch asked for 600 s and nothing happens on it: only closing it ends the thread.
    assert not watcher.alive


def test_an_unexpected_error_is_logged_and_the_scope_listed_again(
    emulator: EmulatedKubernetes, gateway: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    raised: list[str] = []

    def keep(body: Mapping[str, Any]) -> bool:
        if body["metadata"]["name"] == "bad" and not raised:
            raised.append("bad")
            raise RuntimeError("a bug on one object")
        return wanted(body)

    cache, recorder = Store("widgets"), Recorder()
    watcher = informer(gateway, cache, recorder, keep=keep)
    watcher.start()
    try:
        assert watcher.wait_tried(10)
        emulator.create(widget("bad"))
        # The thread goes on: the scope is listed again, and the object is cached then.
        wait_for(lambda: recorder.relisted, timeout=10)
        assert names(recorder.relisted[0].changed) == ["bad"]
        assert watcher.alive and ("default", "bad") in cache
        assert "watch of widgets failed: listing again" in caplog.text
        assert "a bug on one object" in caplog.text
        emulator.create(widget("after"))
        wait_for(lambda: ("ADDED", "after", True) in recorder.seen(), timeout=10)
    finally:
        watcher.stop()


def test_a_silent_watch_is_dead_after_the_stall_limit_and_the_scope_is_listed_again() -> None:
    with EmulatedKubernetes(crds=[CRD], bookmark_seconds=0.2) as kube, kube.api_client() as client:
        gateway = Kube(client)  # a list held during the silence is answered at the heal
        cache, recorder = Store("widgets"), Recorder()
        watcher = informer(gateway, cache, recorder, stall=1.0)
        watcher.start()
        try:
            assert watcher.wait_tried(10)
            kube.create(widget("before"))
            wait_for(lambda: ("default", "before") in cache, timeout=10)
            assert watcher.quiet() < 1.0  # bookmarks keep the quiet watch alive
            kube.handler.silence.begin()  # the watch stays open and silent, for good
            kube.create(widget("during"))
            wait_for(lambda: watcher.quiet() > 1.0, timeout=10)
            kube.handler.silence.heal()
            # Its read timeout (the stall limit) ended the watch: listed again, watched anew.
            wait_for(lambda: ("default", "during") in cache and watcher.lists >= 2, timeout=30)
            kube.create(widget("after"))
            wait_for(lambda: ("default", "after") in cache, timeout=10)
            assert watcher.quiet() < 1.0
        finally:
            watcher.stop()
