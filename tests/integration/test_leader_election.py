"""Two replicas with leader election on a Lease (issue 11), as real processes.

Each replica is ``python -m bridge.cli run`` with ``IPAM_BRIDGE_LEADER_ELECTION=true`` and an
identity of its own (its bearer token: the emulator's access log tells them apart), against one
emulated API server and one mock phpIPAM.

- Only the leader works: claims created while both run are each allocated exactly once (one
  ``first_free`` POST per claim, no DELETE), the standby writes nothing and calls no IPAM.
- SIGTERM of the leader: it finishes, empties the Lease's holder and exits 0; the standby
  takes over within 3 s (default timings: the standby tries every 2 s).
- SIGKILL of the leader: the standby serves a new claim within 30 s (default timings: the
  lease of 15 s runs out first).
- A standby serves ``/metrics`` with ``ipam_bridge_leader 0`` from its start, even while none
  of its API requests is answered (the leader shows 1).
- A leader whose API server stops answering (its connection goes through a proxy that is
  cut) notices it in the official election code (renews time out), stops handling and exits
  1 with a last line saying why; the standby takes over.

Takeover times are printed (``pytest -s``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from integration_env import CREDENTIALS, NAMESPACE
from prometheus_client.parser import text_string_to_metric_families

from mock_kubernetes.auth import Identity, User
from mock_kubernetes.sandbox import FAST_SETTINGS, Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

LEASES = "coordination.k8s.io/v1"
LEASE_NAMESPACE = "default"
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Quick election timings for the test that does not measure the issue's numbers.
QUICK = {
    "IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS": "5",
    "IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "3",
    "IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS": "1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Blackhole:
    """A TCP proxy to the emulator that can be cut: then nothing is answered any more.

    After `cut`, bytes on open connections are dropped and new connections are accepted and
    left unanswered (a network partition: requests time out, nothing is refused).
    """

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self._target = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._cut = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._keep(client)
            if self._cut.is_set():
                continue  # accepted, never answered
            upstream = socket.create_connection(self._target)
            self._keep(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._cut.is_set():
                    dst.sendall(data)
            if not self._cut.is_set():
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Replica:
    """One operator process (``python -m bridge.cli run``) with its own identity and metrics."""

    def __init__(
        self, sandbox: Sandbox, name: str, workdir: Path, *, server: str | None = None, **env: str
    ) -> None:
        self.name = name
        self.identity = sandbox.kube.add_identity(Identity(User(f"replica-{name}")))
        config = sandbox.kube.kubeconfig(self.identity)
        if server is not None:
            config["clusters"][0]["cluster"]["server"] = server
        kubeconfig = workdir / f"kubeconfig-{name}"
        kubeconfig.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.metrics_port = free_port()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("IPAM_BRIDGE_")}
        environment.update(
            {k: v for k, v in FAST_SETTINGS.items() if k != "IPAM_BRIDGE_STANDALONE"},
            KUBECONFIG=str(kubeconfig),
            PYTHONUNBUFFERED="1",
            POD_NAME=f"replica-{name}",
            IPAM_BRIDGE_LEADER_ELECTION="true",
            IPAM_BRIDGE_METRICS_PORT=str(self.metrics_port),
            IPAM_BRIDGE_HEALTH_PORT="0",
            **env,
        )
        self.log_path = workdir / f"replica-{name}.log"
        self.err_path = workdir / f"replica-{name}.err"
        with self.log_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bridge.cli", "run"], env=environment, stdout=out, stderr=err
            )

    @property
    def pod(self) -> str:
        return f"replica-{self.name}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def stderr_lines(self) -> list[str]:
        return self.err_path.read_text(errors="replace").splitlines()

    def metrics(self) -> dict[str, float] | None:
        """Unlabelled samples (and summed counts) of ``/metrics``; None until it answers."""
        try:
            text = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except requests.RequestException:
            return None
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
        return samples

    def wait_started(self) -> dict[str, float]:
        """Wait until its start-up handler ran (metrics served); return the metrics."""
        return dict(wait_for(self.metrics, timeout=30, message=f"{self.pod} started"))

    def writes(self, sandbox: Sandbox) -> list[str]:
        return [
            f"{r.verb} {r.resource} {r.namespace}/{r.name}"
            for r in sandbox.kube.access_log.records(self.identity)
            if r.verb in WRITES
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextmanager
def lease_cluster(tmp_path: Path, phpipam: MockPhpipamServer) -> Iterator[Sandbox]:
    """Yield the emulated API (in ``tmp_path``) with a phpIPAM pool and no operator in it.

    The pool ``pool`` (subnet 7 of ``phpipam``) in `NAMESPACE` is created, not waited for:
    the replicas started against the sandbox serve it.
    """
    with Sandbox(tmp_path, start_operator=False) as sandbox:
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        yield sandbox


@contextmanager
def running_replicas(
    make: Callable[..., Replica], *, tail: int = 40
) -> Iterator[Callable[..., Replica]]:
    """Yield a function that starts a replica with ``make`` and keeps it for the end.

    Every replica started is killed on leaving, then the last ``tail`` lines of each one's
    output are written to stderr (pytest shows them when the test failed).
    """
    started: list[Replica] = []

    def start(*args: Any, **kwargs: Any) -> Replica:
        replica = make(*args, **kwargs)
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for replica in started:
            replica.stop()
        for replica in started:
            output = "\n".join(replica.output().splitlines()[-tail:])
            sys.stderr.write(f"--- {replica.pod}\n{output}\n")


@pytest.fixture
def cluster(tmp_path: Path, phpipam: MockPhpipamServer) -> Iterator[Sandbox]:
    """The emulated API with a phpIPAM pool; no operator in this process."""
    with lease_cluster(tmp_path, phpipam) as sandbox:
        yield sandbox


@pytest.fixture
def replicas(cluster: Sandbox, tmp_path: Path) -> Iterator[Callable[..., Replica]]:
    """Start replicas (``replicas("a", **env)``); every one is killed after the test."""

    def make(name: str, **env: Any) -> Replica:
        return Replica(cluster, name, tmp_path, **env)

    with running_replicas(make) as start:
        yield start


def lease(sandbox: Sandbox) -> dict[str, Any]:
    return sandbox.kube.get(LEASES, "leases", "ipam-bridge", LEASE_NAMESPACE) or {}


def holder(sandbox: Sandbox) -> str | None:
    return (lease(sandbox).get("spec") or {}).get("holderIdentity")


def wait_leader(sandbox: Sandbox, replica: Replica, timeout: float = 30) -> str:
    """Wait until ``replica`` holds the Lease; return its holder identity."""

    def held() -> str | None:
        who = holder(sandbox)
        return who if who and who.startswith(f"{replica.pod}_") else None

    return str(wait_for(held, timeout=timeout, interval=0.02, message=f"{replica.pod} leads"))


class HolderLog:
    """Every holder the Lease shows, polled every 10 ms in a thread."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.seen: list[str | None] = []
        self._stop = threading.Event()
        self._sandbox = sandbox
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            who = holder(self._sandbox)
            if not self.seen or self.seen[-1] != who:
                self.seen.append(who)
            time.sleep(0.01)

    def stop(self) -> list[str | None]:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def first_free_posts(phpipam: MockPhpipamServer) -> int:
    return sum(
        1
        for e in phpipam.store.requests(writes_only=True)
        if e.method == "POST" and "first_free" in e.path
    )


def deletes(phpipam: MockPhpipamServer) -> list[str]:
    return [e.path for e in phpipam.store.requests(writes_only=True) if e.method == "DELETE"]


def hostnames(phpipam: MockPhpipamServer) -> list[str]:
    return sorted(str(a.hostname) for a in phpipam.store.subnet_addresses(7) if not a.is_gateway)


def test_only_the_leader_works_and_sigterm_hands_the_lease_over_at_once(
    cluster: Sandbox, replicas: Callable[..., Replica], phpipam: MockPhpipamServer
) -> None:
    a = replicas("a")
    a.wait_started()
    wait_leader(cluster, a)
    b = replicas("b")
    assert b.wait_started()["ipam_bridge_leader"] == 0
    assert wait_for(lambda: (a.metrics() or {}).get("ipam_bridge_leader") == 1)

    for i in range(8):
        cluster.claim(NAMESPACE, f"m{i}", "pool")
    cluster.wait_claims_bound(NAMESPACE, 8, timeout=30)
    assert hostnames(phpipam) == sorted(f"m{i}.test" for i in range(8))
    assert first_free_posts(phpipam) == 8
    # the standby: no IPAM call, no write (it only reads the Lease), still standing by
    standby = b.metrics() or {}
    assert standby["ipam_bridge_leader"] == 0
    assert standby.get("ipam_bridge_backend_request_duration_seconds_count", 0) == 0
    assert b.writes(cluster) == []

    # More claims, and the leader is stopped while it handles them.
    log = HolderLog(cluster)
    for i in range(8, 12):
        cluster.claim(NAMESPACE, f"m{i}", "pool")
    old = holder(cluster)
    start = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    new = wait_leader(cluster, b, timeout=10)
    takeover = time.monotonic() - start
    print(f"\ntakeover after SIGTERM of the leader: {takeover:.2f} s")
    assert a.proc.wait(15) == 0, a.output()
    seen = log.stop()
    # the leader emptied the holder before the standby took the Lease
    assert seen[seen.index(old) :][:3] == [old, "", new], seen
    assert takeover < 3  # the standby's next try (every 2 s) after the release

    cluster.claim(NAMESPACE, "m12", "pool")
    cluster.wait_claims_bound(NAMESPACE, 13, timeout=30)
    # each claim allocated exactly once across the takeover, nothing released
    assert hostnames(phpipam) == sorted(f"m{i}.test" for i in range(13))
    assert first_free_posts(phpipam) == 13
    assert deletes(phpipam) == []
    assert wait_for(lambda: (b.metrics() or {}).get("ipam_bridge_leader") == 1)
    assert "became the leader" in b.output()


def test_sigkill_of_the_leader_a_standby_serves_a_new_claim_within_30_s(
    cluster: Sandbox, replicas: Callable[..., Replica], phpipam: MockPhpipamServer
) -> None:
    a = replicas("a")
    a.wait_started()
    wait_leader(cluster, a)
    b = replicas("b")
    b.wait_started()
    cluster.claim(NAMESPACE, "m0", "pool")
    cluster.wait_claims_bound(NAMESPACE, 1)

    start = time.monotonic()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    cluster.claim(NAMESPACE, "m1", "pool")
    cluster.wait_claims_bound(NAMESPACE, 2, timeout=30)
    takeover = time.monotonic() - start
    print(f"\nnew claim bound after SIGKILL of the leader: {takeover:.2f} s")
    assert takeover < 30
    assert holder(cluster).startswith("replica-b_")  # type: ignore[union-attr]
    assert hostnames(phpipam) == ["m0.test", "m1.test"]
    assert first_free_posts(phpipam) == 2
    assert deletes(phpipam) == []


def test_a_leader_that_loses_the_api_server_stops_handling_and_exits_1(
    cluster: Sandbox, replicas: Callable[..., Replica], phpipam: MockPhpipamServer
) -> None:
    proxy = Blackhole(cluster.kube.url)
    try:
        a = replicas("a", server=proxy.url, **QUICK)
        a.wait_started()
        wait_leader(cluster, a)
        b = replicas("b", **QUICK)
        b.wait_started()
        cluster.claim(NAMESPACE, "m0", "pool")
        cluster.wait_claims_bound(NAMESPACE, 1)

        start = time.monotonic()
        proxy.cut()
        code = a.proc.wait(20)
        gone = time.monotonic() - start
        print(f"\nleader without its API server exited after {gone:.2f} s")
        assert code == 1, a.output()
        assert a.stderr_lines()[-1] == (
            "ipam-bridge: lost the leader Lease default/ipam-bridge: not renewed within 3 s; "
            "exiting"
        ), a.output()
        assert "stopped handling claims and pools" in a.output()
        # retry 1 s + renew deadline 3 s, then at most the exit grace of 0.5 s
        assert gone < 1 + 3 + 0.5 + 2

        wait_leader(cluster, b, timeout=15)
        cluster.claim(NAMESPACE, "m1", "pool")
        cluster.wait_claims_bound(NAMESPACE, 2, timeout=30)
        assert first_free_posts(phpipam) == 2
        assert deletes(phpipam) == []
    finally:
        proxy.close()


def test_a_standby_shows_leader_0_from_its_start_before_the_api_server_answers_it(
    cluster: Sandbox, replicas: Callable[..., Replica]
) -> None:
    """``/metrics`` is served first: a standby still listing (here: never answered) shows 0."""
    a = replicas("a")
    a.wait_started()
    wait_leader(cluster, a)
    assert wait_for(lambda: (a.metrics() or {}).get("ipam_bridge_leader") == 1)
    proxy = Blackhole(cluster.kube.url)
    proxy.cut()  # b's requests are accepted and never answered
    try:
        b = replicas("b", server=proxy.url)
        assert b.wait_started()["ipam_bridge_leader"] == 0
        assert (a.metrics() or {}).get("ipam_bridge_leader") == 1
        assert b.proc.poll() is None  # still starting, not failed
        assert b.writes(cluster) == []
    finally:
        proxy.close()


def test_the_lease_rbac_of_deploy_is_enough_and_a_clean_stop_releases(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    """In-process, as ``deploy/``'s ServiceAccount with ``deploy/``'s RBAC: nothing refused."""
    namespace = "ipam-bridge-system"  # the ServiceAccount's (the Sandbox creates it)
    sandbox = make_sandbox(
        identity="operator",
        settings={
            "IPAM_BRIDGE_LEADER_ELECTION": "true",
            "IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE": namespace,
        },
    )
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m0", "pool")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    spec = sandbox.kube.get(LEASES, "leases", "ipam-bridge", namespace)["spec"]  # type: ignore[index]
    assert spec["holderIdentity"].startswith(f"{socket.gethostname()}_")
    assert spec["leaseDurationSeconds"] == 15
    events = wait_for(
        lambda: [
            e
            for e in sandbox.kube.list("v1", "events", namespace)
            if e["involvedObject"]["kind"] == "Lease" and e["reason"] == "LeaderElection"
        ]
    )
    assert events[0]["message"] == f"{spec['holderIdentity']} became leader"

    sandbox.stop_operator()
    released = sandbox.kube.get(LEASES, "leases", "ipam-bridge", namespace)["spec"]  # type: ignore[index]
    assert released["holderIdentity"] == ""
    log = sandbox.kube.access_log
    assert log.records(allowed=False) == []
    used = log.permissions(sandbox.identity, allowed=True)
    assert {("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")} <= used
