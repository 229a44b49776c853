"""An API server that goes down and comes back: dropped watches, refused connections, 410 Gone."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
import requests
from emulator_helpers import GROUP, WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes

WIDGETS_V2 = f"{GROUP}/v2"


def _events(url: str, **params: Any) -> list[dict[str, Any]]:
    """Every event of one watch until the server ends it (``timeoutSeconds`` 1)."""
    params = {"watch": "true", "timeoutSeconds": "1", **params}
    with requests.get(url + WIDGETS_PATH, params=params, stream=True, timeout=10) as response:
        assert response.status_code == 200
        return [json.loads(line) for line in response.iter_lines() if line]


def test_go_down_ends_watches_refuses_connections_and_come_up_serves_again(
    kube: EmulatedKubernetes, api: Api
) -> None:
    status, created = api("POST", WIDGETS_PATH, widget("a"))
    assert status == 201
    since = created["metadata"]["resourceVersion"]
    params = {"watch": "true", "timeoutSeconds": "60"}
    with requests.get(kube.url + WIDGETS_PATH, params=params, stream=True, timeout=10) as held:
        lines = (line for line in held.iter_lines() if line)
        assert json.loads(next(lines))["type"] == "ADDED"  # the watch is established
        kube.go_down()
        # The stream ends (cleanly or cut) well before its 60 s timeout; a hang fails on
        # the 10 s read timeout.
        with contextlib.suppress(requests.exceptions.ChunkedEncodingError):
            assert list(lines) == []
    assert not kube.serving
    with pytest.raises(requests.ConnectionError):
        requests.get(kube.url + WIDGETS_PATH, timeout=5)
    # The admin still acts on the store while the server refuses connections.
    kube.delete(WIDGETS_V2, "widgets", "a", "default")
    kube.create({**widget("b"), "metadata": {"name": "b", "namespace": "default"}})

    kube.come_up()
    assert kube.serving
    status, listed = Api(kube.url)("GET", WIDGETS_PATH)
    assert status == 200
    assert [item["metadata"]["name"] for item in listed["items"]] == ["b"]
    # Without expiry, a watch resumed from before the outage replays what happened meanwhile.
    replay = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in _events(kube.url, resourceVersion=since)
    ]
    assert replay == [("DELETED", "a"), ("ADDED", "b")]


def test_expired_history_answers_410_gone_to_a_resumed_watch(
    kube: EmulatedKubernetes, api: Api
) -> None:
    _, created = api("POST", WIDGETS_PATH, widget("a"))
    since = created["metadata"]["resourceVersion"]
    kube.go_down(expire=True)
    kube.delete(WIDGETS_V2, "widgets", "a", "default")
    kube.come_up()

    events = _events(kube.url, resourceVersion=since)
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"
    # The client's answer: list again, then watch from the list's resourceVersion.
    status, listed = api("GET", WIDGETS_PATH)
    assert status == 200 and listed["items"] == []
    fresh = listed["metadata"]["resourceVersion"]
    api("POST", WIDGETS_PATH, widget("c"))
    resumed = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in _events(kube.url, resourceVersion=fresh)
    ]
    assert resumed == [("ADDED", "c")]


def test_reset_watches_cuts_each_watch_mid_stream_and_serves_the_resumed_one(
    kube: EmulatedKubernetes, api: Api
) -> None:
    status, created = api("POST", WIDGETS_PATH, widget("a"))
    assert status == 201
    since = created["metadata"]["resourceVersion"]
    params = {"watch": "true", "timeoutSeconds": "60", "resourceVersion": since}
    with requests.get(kube.url + WIDGETS_PATH, params=params, stream=True, timeout=10) as held:
        api("POST", WIDGETS_PATH, widget("b"))
        lines = (line for line in held.iter_lines() if line)
        seen = json.loads(next(lines))["object"]
        assert seen["metadata"]["name"] == "b"  # the watch is established
        assert kube.reset_watches() == 1
        # A reset, not an end: the chunked body never ends, the read fails.
        with pytest.raises(requests.exceptions.ChunkedEncodingError, match=r"reset|aborted"):
            list(lines)
    assert kube.serving
    kube.delete(WIDGETS_V2, "widgets", "a", "default")
    replay = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in _events(kube.url, resourceVersion=seen["metadata"]["resourceVersion"])
    ]
    assert replay == [("DELETED", "a")]
    assert kube.reset_watches() == 0  # the ended watch is forgotten
