"""A DELETE in flight beats a finalizer added meanwhile (real-cluster.md 13e).

kube-apiserver decides on the object it read; a finalizer PATCH committed between that read
and the DELETE's commit answers 200 with the finalizer, and the object is removed anyway.
`DeletesInFlight` (``kube.handler.deletes``) opens that window; it is closed by default.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from emulator_helpers import GROUP, WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes

FINALIZER = "example.com/keep"
MERGE = "application/merge-patch+json"


def poll(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def delete_in_thread(api: Api, path: str, body: Any = None) -> tuple[threading.Thread, list[Any]]:
    """Send ``DELETE path`` from a thread; the answer lands in the returned list."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(api("DELETE", path, body)))
    thread.start()
    return thread, answer


def add_finalizer(api: Api, name: str, version: str) -> tuple[int, Any]:
    patch = {"metadata": {"finalizers": [FINALIZER], "resourceVersion": version}}
    return api("PATCH", f"{WIDGETS_PATH}/{name}", patch, content_type=MERGE)


def test_a_delete_that_read_no_finalizer_wins_over_a_finalizer_patched_meanwhile(
    kube: EmulatedKubernetes, api: Api
) -> None:
    status, created = api("POST", WIDGETS_PATH, widget("w"))
    assert status == 201
    kube.handler.deletes.open(resource="widgets")  # each DELETE waits for release()
    thread, answer = delete_in_thread(api, f"{WIDGETS_PATH}/w")
    poll(lambda: kube.handler.deletes.waiting == 1)  # the DELETE has read the widget

    # The finalizer PATCH, guarded by the resourceVersion read, is committed: 200 with it.
    status, patched = add_finalizer(api, "w", created["metadata"]["resourceVersion"])
    assert status == 200 and patched["metadata"]["finalizers"] == [FINALIZER]
    status, read = api("GET", f"{WIDGETS_PATH}/w")
    assert status == 200 and read["metadata"]["finalizers"] == [FINALIZER]

    kube.handler.deletes.release()
    thread.join(timeout=10)
    [(status, body)] = answer
    assert status == 200
    assert (body["kind"], body["status"]) == ("Status", "Success")
    assert body["details"]["uid"] == created["metadata"]["uid"]
    status, _ = api("GET", f"{WIDGETS_PATH}/w")
    assert status == 404  # gone, finalizer and all: nothing waits for the finalizer's owner
    assert kube.list(f"{GROUP}/v2", "widgets", "default") == []


def test_the_window_is_closed_by_default_and_a_finalizer_read_is_honoured(
    kube: EmulatedKubernetes, api: Api
) -> None:
    api("POST", WIDGETS_PATH, widget("plain"))
    assert kube.handler.deletes.applies("widgets") is False
    status, body = api("DELETE", f"{WIDGETS_PATH}/plain")
    assert status == 200 and body["kind"] == "Widget"  # the emulator's usual answer, at once

    # With the window open, a DELETE that reads a finalizer marks the object, as ever.
    kube.handler.deletes.open(resource="widgets")
    api("POST", WIDGETS_PATH, widget("held", metadata={"name": "held", "finalizers": [FINALIZER]}))
    status, body = api("DELETE", f"{WIDGETS_PATH}/held")
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    assert kube.handler.deletes.waiting == 0


def test_a_timed_window_applies_to_its_resource_and_to_the_servers_own_delete(
    kube: EmulatedKubernetes, api: Api
) -> None:
    api("POST", WIDGETS_PATH, widget("w"))
    kube.create({"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": "g"}})
    kube.handler.deletes.open(0.3, resource="widgets")
    started = time.monotonic()
    kube.delete(f"{GROUP}/v1", "gadgets", "g")  # another resource: at once
    assert kube.get(f"{GROUP}/v1", "gadgets", "g") is None
    answer: list[Any] = []
    thread = threading.Thread(
        target=lambda: answer.append(kube.delete(f"{GROUP}/v2", "widgets", "w", "default"))
    )
    thread.start()
    poll(lambda: kube.handler.deletes.waiting == 1)
    read = kube.get(f"{GROUP}/v2", "widgets", "w", "default")
    version = read["metadata"]["resourceVersion"]
    patch = {"metadata": {"finalizers": [FINALIZER], "resourceVersion": version}}
    kube.patch(f"{GROUP}/v2", "widgets", "w", patch, "default")
    thread.join(timeout=10)
    assert time.monotonic() - started >= 0.3
    assert answer[0]["status"] == "Success"
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "default") is None


def test_preconditions_are_checked_again_at_the_commit(kube: EmulatedKubernetes, api: Api) -> None:
    _, created = api("POST", WIDGETS_PATH, widget("w"))
    version = created["metadata"]["resourceVersion"]
    kube.handler.deletes.open(resource="widgets")
    options = {"preconditions": {"resourceVersion": version}}
    thread, answer = delete_in_thread(api, f"{WIDGETS_PATH}/w", options)
    poll(lambda: kube.handler.deletes.waiting == 1)
    add_finalizer(api, "w", version)  # the resourceVersion changes
    kube.handler.deletes.close()
    thread.join(timeout=10)
    [(status, body)] = answer
    assert status == 409 and "Precondition failed" in body["message"]
    status, read = api("GET", f"{WIDGETS_PATH}/w")
    assert status == 200 and read["metadata"]["finalizers"] == [FINALIZER]


def test_negative_seconds_are_refused(kube: EmulatedKubernetes) -> None:
    with pytest.raises(ValueError, match="negative"):
        kube.handler.deletes.open(-1.0)
