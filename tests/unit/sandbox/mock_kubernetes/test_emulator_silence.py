"""The emulated API server sends BOOKMARKs, and models a silent network (a blackhole)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import requests
from emulator_helpers import GROUP, WIDGETS, widget

from mock_kubernetes import EmulatedKubernetes

#: Seconds between the emulator's bookmarks in these tests (a real API server: about 60).
BOOKMARK = 0.2
WATCH = f"/apis/{GROUP}/v2/namespaces/default/widgets?watch=true&resourceVersion=1"


@pytest.fixture
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=[WIDGETS], bookmark_seconds=BOOKMARK) as emulator:
        yield emulator


def lines(response: requests.Response) -> Iterator[dict[str, object]]:
    for line in response.iter_lines():
        if line:
            yield json.loads(line)


def test_a_watch_asking_for_bookmarks_gets_them_with_the_current_resource_version(
    kube: EmulatedKubernetes,
) -> None:
    url = f"{kube.url}{WATCH}&allowWatchBookmarks=true&timeoutSeconds=30"
    with requests.get(url, stream=True, timeout=10) as response:
        events = lines(response)
        first = next(events)
        assert first["type"] == "BOOKMARK"
        assert first["object"] == {  # kind, apiVersion and resourceVersion only
            "apiVersion": f"{GROUP}/v2",
            "kind": "Widget",
            "metadata": {"resourceVersion": str(kube.store.resource_version)},
        }
        created = kube.create({**widget("w1"), "metadata": {"name": "w1", "namespace": "default"}})
        added = next(events)
        assert added["type"] == "ADDED"
        after = next(events)
        assert after["type"] == "BOOKMARK"
        assert (
            after["object"]["metadata"]["resourceVersion"]
            == (  # type: ignore[index]
                created["metadata"]["resourceVersion"]
            )
        )


def test_a_watch_without_allow_watch_bookmarks_gets_none(kube: EmulatedKubernetes) -> None:
    # The server ends this watch after 1 s: five bookmark periods, and not one line.
    url = f"{kube.url}{WATCH}&timeoutSeconds=1"
    with requests.get(url, stream=True, timeout=10) as response:
        assert list(lines(response)) == []


def _open_watch(kube: EmulatedKubernetes) -> socket.socket:
    """Open a watch with bookmarks on a raw socket; return it once a bookmark came."""
    host, _, port = kube.url.removeprefix("http://").rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    path = f"{WATCH}&allowWatchBookmarks=true&timeoutSeconds=60"
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    received = b""
    while b"BOOKMARK" not in received:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the watch"
        received += chunk
    return sock


def test_a_silent_network_holds_watches_open_without_a_byte_and_new_requests_hang(
    kube: EmulatedKubernetes,
) -> None:
    sock = _open_watch(kube)
    try:
        kube.handler.silence.begin()
        kube.create(
            {**widget("w1"), "metadata": {"name": "w1", "namespace": "default"}}
        )  # an event, and bookmarks due every 0.2 s: none is sent
        sock.settimeout(1.5)
        with pytest.raises(TimeoutError):  # not b"" (closed), not a byte: silent and open
            sock.recv(65536)
        with pytest.raises(requests.ReadTimeout):  # a new request is held
            requests.get(f"{kube.url}/api/v1/namespaces", timeout=0.5)

        kube.handler.silence.heal()
        assert requests.get(f"{kube.url}/api/v1/namespaces", timeout=10).status_code == 200
        # The connection silenced stays silent (its state is lost): only a new one works.
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(65536)
        fresh = _open_watch(kube)
        fresh.close()
    finally:
        sock.close()
