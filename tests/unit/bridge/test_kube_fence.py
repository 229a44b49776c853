"""OperatorApiClient: a timeout on every Kubernetes request, the fence before every write."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import kubernetes.client
import pytest
import urllib3

from bridge.runtime.fence import Fence, LeadershipLostError
from bridge.runtime.gateway import OperatorApiClient, api_client
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.auth import Identity, User

WRITES = {"create", "update", "patch", "delete"}


@pytest.fixture
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes() as emulator:
        yield emulator


def configuration(kube: EmulatedKubernetes, identity: Identity) -> kubernetes.client.Configuration:
    config = kubernetes.client.Configuration()
    config.host = kube.url
    config.api_key = {"BearerToken": f"Bearer {identity.token}"}
    config.retries = False
    return config


class Gate:
    def __init__(self) -> None:
        self.open = True
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if not self.open:
            raise LeadershipLostError("not the leader")


def test_a_closed_fence_keeps_writes_from_being_sent_reads_and_events_go_on(
    kube: EmulatedKubernetes,
) -> None:
    me = kube.add_identity(Identity(User("replica-a")))
    gate = Gate()
    client = api_client(configuration(kube, me), fence=gate)
    assert isinstance(client, OperatorApiClient)
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": "one"}})
    assert gate.calls == 1

    gate.open = False
    with pytest.raises(LeadershipLostError):
        core.create_namespace({"metadata": {"name": "two"}})
    with pytest.raises(LeadershipLostError):
        core.patch_namespace("one", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(LeadershipLostError):
        core.delete_namespace("one")
    assert [n.metadata.name for n in core.list_namespace().items if n.metadata.name == "one"]
    core.create_namespaced_event(
        "default",
        {"metadata": {"generateName": "x-"}, "involvedObject": {"kind": "Lease", "name": "l"}},
    )
    writes = [(r.verb, r.resource) for r in kube.access_log.records(me) if r.verb in WRITES]
    assert writes == [("create", "namespaces"), ("create", "events")]
    client.close()


def test_every_request_has_the_default_timeout_a_hung_server_is_an_error(
    kube: EmulatedKubernetes,
) -> None:
    me = kube.add_identity(Identity(User("replica-a")))
    client = api_client(configuration(kube, me), timeout=(1.0, 0.5))
    core = kubernetes.client.CoreV1Api(client)
    core.list_namespace()
    kube.handler.partition.cut(me)  # requests hang: no answer, ever
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.list_namespace()
    assert time.monotonic() - started < 5
    # a call's own timeout still wins
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.list_namespace(_request_timeout=0.2)
    assert time.monotonic() - started < 0.45
    kube.handler.partition.heal()
    client.close()


def test_a_write_gets_no_longer_than_the_lease_left_and_none_when_nothing_is_left(
    kube: EmulatedKubernetes,
) -> None:
    me = kube.add_identity(Identity(User("replica-a")))
    left = [0.3]
    asked: list[float] = []

    def lease_left(seconds: float) -> float:
        asked.append(seconds)
        if left[0] < 0.05:
            raise LeadershipLostError("the Lease ends now")
        return min(seconds, left[0])

    client = api_client(configuration(kube, me), timeout=(30.0, 30.0), write_timeout=lease_left)
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": "one"}})
    assert asked == [30.0]
    kube.handler.partition.cut(me)  # requests hang: no answer, ever
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):  # a timeout of 0.3 s, not 30 s
        core.patch_namespace("one", {"metadata": {"labels": {"a": "b"}}})
    assert time.monotonic() - started < 10
    kube.handler.partition.heal()
    left[0] = 0.0
    with pytest.raises(LeadershipLostError):
        core.create_namespace({"metadata": {"name": "two"}})
    core.create_namespaced_event(  # Events are not cut nor refused
        "default",
        {"metadata": {"generateName": "x-"}, "involvedObject": {"kind": "Lease", "name": "l"}},
    )
    writes = [(r.verb, r.resource) for r in kube.access_log.records(me) if r.verb in WRITES]
    assert ("create", "namespaces") in writes and ("create", "events") in writes
    assert writes.count(("create", "namespaces")) == 1  # "two" was not sent
    assert len(asked) == 3
    client.close()


class Blackhole:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers; counts them."""

    def __init__(self, *, accept: bool = True) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True) if accept else None
        if self._thread is not None:
            self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)  # open, silent: a blackholed or frozen API server

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        for conn in self._held:
            conn.close()
        if self._thread is not None:
            self._thread.join(5)


def fenced_client(host: str, left: float) -> tuple[OperatorApiClient, Fence]:
    """A client as the operator builds it (no ``retries`` set), ``left`` seconds of Lease."""
    config = kubernetes.client.Configuration()
    config.host = host
    renewed = time.monotonic()
    fence = Fence(lambda: renewed, left)
    client = api_client(config, timeout=(30.0, 30.0), fence=fence.check, write_timeout=fence.bound)
    return client, fence


def new_connections(caplog: pytest.LogCaptureFixture) -> int:
    """How many connections urllib3 opened (its DEBUG log line for each new one)."""
    return sum("Starting new HTTP connection" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("method", ["PATCH", "DELETE", "PUT"])
def test_a_write_to_a_blackholed_server_makes_one_attempt_within_the_lease_left(
    method: str,
) -> None:
    # urllib3 retries a request 3 times by default, each with the whole timeout again: a
    # replica would still be writing long after its Lease ran out (issue 37, item 1).
    server = Blackhole()
    client, _ = fenced_client(f"http://127.0.0.1:{server.port}", left=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(urllib3.exceptions.HTTPError):
            client.call_api(method, f"http://127.0.0.1:{server.port}/api/v1/namespaces/x", {})
        elapsed = time.monotonic() - started
    finally:
        client.close()
        server.close()
    assert server.accepted == 1
    assert elapsed < 3.0  # the Lease's 1 s (4 attempts would take 4 s)


def test_a_write_to_a_server_that_refuses_or_drops_connections_makes_one_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    # A port bound but not listening refuses; a listener whose accept queue is full drops
    # the SYN (Linux), as an unreachable host does: the connect waits for its timeout.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    full = Blackhole(accept=False)
    filler = socket.create_connection(("127.0.0.1", full.port))  # fills the queue (backlog 0)
    try:
        for port in (closed.getsockname()[1], full.port):
            caplog.clear()
            client, _ = fenced_client(f"http://127.0.0.1:{port}", left=1.0)
            try:
                started = time.monotonic()
                with pytest.raises(urllib3.exceptions.HTTPError):
                    client.call_api("PATCH", f"http://127.0.0.1:{port}/api/v1/namespaces/x", {})
                elapsed = time.monotonic() - started
            finally:
                client.close()
            assert new_connections(caplog) == 1, port
            assert elapsed < 3.0, port  # 4 attempts of 1 s would take 4 s
    finally:
        filler.close()
        full.close()
        closed.close()
