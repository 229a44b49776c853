"""Leader election (`leader`): settings, identity, the lock wrapper, start/stop of the work.

The lock runs against the in-memory API server (real HTTP, the official client's
``LeaseLock`` and ``LeaderElection``); the start/stop of the handlers' tasks uses a fake
election that calls the official callbacks.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
import yaml
from kubernetes.client import ApiException, CoordinationV1Api
from kubernetes.leaderelection import electionconfig, leaderelection

from bridge.metrics import Metrics
from bridge.runtime import kubeconfig as kube_module
from bridge.runtime import leader
from bridge.runtime.leader import (
    ElectionLock,
    ElectionStoppedError,
    Leadership,
    LeadershipLostError,
    OperatorStop,
    Timings,
    election_client,
    holder_identity,
    lease_namespace,
)
from bridge.runtime.workqueue import Result, WorkQueue
from bridge.settings import Settings
from mock_kubernetes import EmulatedKubernetes

LEASES = "coordination.k8s.io/v1"
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|\+00:00)")
DEFAULT = Timings()
QUICK = Timings(lease_seconds=2, renew_deadline_seconds=1.5, retry_seconds=1.0)


# -- settings, identity, namespace -------------------------------------------------------------


def test_election_settings_default_to_controller_runtimes_and_off() -> None:
    settings = Settings()
    assert settings.leader_election is False
    assert Timings.of(settings) == Timings(15, 10.0, 2.0)
    assert settings.leader_election_namespace == "default"


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "message"),
    [
        ("10", "10", "2", "LEASE_SECONDS (10) must be greater than"),
        ("15", "2.4", "2", "RENEW_DEADLINE_SECONDS (2.4) must be greater than 1.2 x"),
        ("15", "10", "0.5", "greater than or equal to 1"),
        ("15.5", "10", "2", "valid integer"),
    ],
)
def test_election_settings_are_checked(
    monkeypatch: pytest.MonkeyPatch, lease: str, renew: str, retry: str, message: str
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS", lease)
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", renew)
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS", retry)
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        Settings()


def test_quick_timings_pass_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS", "2")
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", "1.5")
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS", "1")
    assert Timings.of(Settings()) == QUICK


def test_holder_identity_is_pod_name_underscore_random_hex(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", "ipam-bridge-7d9f-x2x")
    first, second = holder_identity(), holder_identity()
    assert re.fullmatch(r"ipam-bridge-7d9f-x2x_[0-9a-f]{16}", first)
    assert first != second  # a restarted container is a new candidate
    monkeypatch.delenv("POD_NAME")
    assert re.fullmatch(re.escape(socket.gethostname()) + r"_[0-9a-f]{16}", holder_identity())


def test_lease_namespace_in_a_pod_is_the_service_accounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    monkeypatch.setattr(kube_module, "SERVICE_ACCOUNT_TOKEN", str(token))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE", raising=False)
    assert lease_namespace(Settings()) == "default"  # not in a pod
    token.write_text("t")
    (tmp_path / "namespace").write_text("ipam-bridge-system\n")
    assert lease_namespace(Settings()) == "ipam-bridge-system"
    monkeypatch.setenv("IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE", "elsewhere")
    assert lease_namespace(Settings()) == "elsewhere"  # set explicitly: wins
    monkeypatch.delenv("IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert lease_namespace(Settings()) == "default"  # a kubeconfig: not this pod's cluster


# -- the lock against the in-memory API server ----------------------------------------------


@pytest.fixture
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes() as emulator:
        yield emulator


def make_lock(kube: EmulatedKubernetes, identity: str, timings: Timings = DEFAULT) -> ElectionLock:
    return ElectionLock(
        "ipam-bridge", "default", identity, client=kube.api_client(), timings=timings
    )


def election(lock: ElectionLock, **callbacks: Any) -> leaderelection.LeaderElection:
    """The official election of ``lock`` (its ``try_acquire_or_renew`` is one try)."""
    config = electionconfig.Config(
        lock,
        lease_duration=lock.timings.lease_seconds,
        renew_deadline=lock.timings.renew_deadline_seconds,
        retry_period=lock.timings.retry_seconds,
        onstarted_leading=callbacks.get("started", lambda: None),
        onstopped_leading=callbacks.get("stopped", lambda: None),
    )
    return leaderelection.LeaderElection(config)


def stored(kube: EmulatedKubernetes) -> dict[str, Any]:
    return kube.get(LEASES, "leases", "ipam-bridge", "default") or {}


def test_a_stale_resource_version_on_a_lease_is_409(kube: EmulatedKubernetes) -> None:
    api = CoordinationV1Api(kube.api_client())
    kube.create(
        {
            "apiVersion": LEASES,
            "kind": "Lease",
            "metadata": {"name": "l", "namespace": "default"},
            "spec": {"holderIdentity": "a"},
        }
    )
    first = api.read_namespaced_lease("l", "default")
    second = api.read_namespaced_lease("l", "default")
    first.spec.holder_identity = "b"
    api.replace_namespaced_lease("l", "default", first)
    second.spec.holder_identity = "c"
    with pytest.raises(ApiException) as refused:
        api.replace_namespaced_lease("l", "default", second)
    assert refused.value.status == 409
    assert kube.get(LEASES, "leases", "l", "default")["spec"] == {"holderIdentity": "b"}


def test_one_candidate_wins_and_writes_microtimes_the_other_waits(
    kube: EmulatedKubernetes,
) -> None:
    one, other = make_lock(kube, "one_1"), make_lock(kube, "other_2")
    assert election(one).try_acquire_or_renew() is True
    spec = stored(kube)["spec"]
    assert spec["holderIdentity"] == "one_1"
    assert spec["leaseDurationSeconds"] == 15
    for field in ("acquireTime", "renewTime"):
        assert MICRO_TIME.fullmatch(spec[field]), spec
    assert election(other).try_acquire_or_renew() is False  # held, not expired
    assert election(one).try_acquire_or_renew() is True  # renewed
    assert stored(kube)["spec"]["holderIdentity"] == "one_1"


def test_times_on_a_whole_second_still_carry_six_digits(kube: EmulatedKubernetes) -> None:
    # isoformat() drops ".000000": a real API server's MicroTime refuses that.
    value = make_lock(kube, "x_1").time_str_to_iso("2026-01-02 03:04:05")
    assert value.microsecond == 1
    assert MICRO_TIME.fullmatch(value.astimezone(datetime.UTC).isoformat())


def test_a_stopped_lock_refuses_every_call_and_sends_nothing(kube: EmulatedKubernetes) -> None:
    lock = make_lock(kube, "one_1")
    assert election(lock).try_acquire_or_renew() is True
    before = stored(kube)
    requests = len(kube.access_log.records())
    lock.stop()
    assert lock.stopped
    with pytest.raises(ElectionStoppedError):
        lock.get("ipam-bridge", "default")
    with pytest.raises(ElectionStoppedError):
        election(lock).try_acquire_or_renew()  # ends the official loop
    with pytest.raises(ElectionStoppedError):
        lock.update("ipam-bridge", "default", object())
    with pytest.raises(ElectionStoppedError):
        lock.create("ipam-bridge", "default", object())
    assert len(kube.access_log.records()) == requests
    assert stored(kube) == before


def test_release_empties_the_holder_and_a_standby_takes_over_at_its_next_try(
    kube: EmulatedKubernetes,
) -> None:
    one, other = make_lock(kube, "one_1"), make_lock(kube, "other_2")
    assert election(one).try_acquire_or_renew() is True
    standby = election(other)
    assert standby.try_acquire_or_renew() is False
    assert other.release() is False  # not the holder: nothing written
    assert stored(kube)["spec"]["holderIdentity"] == "one_1"
    version = stored(kube)["metadata"]["resourceVersion"]

    assert one.release() is True
    spec = stored(kube)["spec"]
    assert stored(kube)["metadata"]["resourceVersion"] != version
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    renewed = datetime.datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    assert abs((datetime.datetime.now(datetime.UTC) - renewed).total_seconds()) < 5
    assert one.stopped  # a released lock writes nothing more
    with pytest.raises(ElectionStoppedError):
        election(one).try_acquire_or_renew()

    third = election(make_lock(kube, "third_3"))
    assert third.try_acquire_or_renew() is True  # no lease duration to wait out
    assert stored(kube)["spec"]["holderIdentity"] == "third_3"


def test_release_with_a_stale_lease_writes_nothing(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = make_lock(kube, "one_1")
    assert election(lock).try_acquire_or_renew() is True
    api = lock.api_instance
    read = api.read_namespaced_lease

    def read_then_someone_writes(name: str, namespace: str) -> Any:
        lease = read(name, namespace)
        kube.patch(LEASES, "leases", "ipam-bridge", {"spec": {"holderIdentity": "b_2"}}, "default")
        return lease

    monkeypatch.setattr(api, "read_namespaced_lease", read_then_someone_writes)
    assert lock.release() is False  # 409: the Lease changed since it was read
    assert stored(kube)["spec"]["holderIdentity"] == "b_2"


def test_an_unreachable_api_server_is_a_failed_try_not_a_dead_election_thread() -> None:
    with EmulatedKubernetes() as gone:
        client = gone.api_client()
    lock = ElectionLock("ipam-bridge", "default", "one_1", client=client, timings=Timings())
    ok, error = lock.get("ipam-bridge", "default")
    assert ok is False and isinstance(error, ApiException) and error.status == 0
    assert election(lock).try_acquire_or_renew() is False  # the official code: try again


def test_request_timeout_is_the_retry_period_cut_at_the_renew_deadline(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = make_lock(kube, "one_1")
    assert lock.request_timeout() == 2.0  # not leading: the retry period
    assert election(lock).try_acquire_or_renew() is True
    assert lock.request_timeout() == 2.0  # just renewed
    now = time.monotonic()
    monkeypatch.setattr(leader.time, "monotonic", lambda: now + 11.0)
    assert 0.9 < lock.request_timeout() <= 1.0  # 2 s retry + 10 s deadline: 1 s left
    monkeypatch.setattr(leader.time, "monotonic", lambda: now + 30.0)
    assert lock.request_timeout() == leader.MIN_REQUEST_TIMEOUT  # past the deadline


class _Silent:
    """A TCP server that accepts connections and never answers (an API server that hangs)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        for sock in self.held:
            sock.close()


def test_a_leader_whose_api_server_hangs_stops_within_the_renew_deadline(
    kube: EmulatedKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official renew loop, with requests that never get an answer (no timeout upstream)."""
    silent = _Silent()
    config = kube.kubeconfig()
    config["clusters"][0]["cluster"]["server"] = silent.url
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    lock = make_lock(kube, "one_1", QUICK)
    started, stopped = threading.Event(), threading.Event()
    elector = election(lock, started=started.set, stopped=stopped.set)
    thread = threading.Thread(target=elector.run, daemon=True)
    thread.start()
    try:
        assert started.wait(5)
        # the API server stops answering: the election's own client (no urllib3 retries)
        lock.api_instance = leader._LeaseApi(
            CoordinationV1Api(election_client()), lock.request_timeout
        )
        cut = time.monotonic()
        assert stopped.wait(10), "the leader never noticed"
        noticed = time.monotonic() - cut
        # Without timeouts it would never notice. The official loop sleeps a retry period
        # after its last failed try, past the deadline (`Leadership` watches the deadline).
        assert noticed < 2 * QUICK.retry_seconds + QUICK.renew_deadline_seconds + 0.5, noticed
    finally:
        lock.stop()
        thread.join(5)
        silent.close()


# -- the handlers' work started and stopped by the election (fakes) -------------------------


class FakeLock:
    """What `Leadership` uses of an `ElectionLock`."""

    def __init__(self, timings: Timings = DEFAULT) -> None:
        self.name, self.namespace, self.identity = "ipam-bridge", "ns", "pod_0123"
        self.timings = timings
        self.lease_reference = None
        self.renewed: float | None = time.monotonic()
        self.calls: list[str] = []
        self.client = self

    def stop(self) -> None:
        self.calls.append("stop")

    def release(self) -> bool:
        self.calls.append("release")
        return True

    def close(self) -> None:
        self.calls.append("close")


class FakeElection:
    """Plays the official election's callbacks when told to (in its own thread, as it does)."""

    def __init__(self) -> None:
        self.win = threading.Event()
        self.lose = threading.Event()
        self.fail: Exception | None = None

    def __call__(self, config: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.win.wait()
        config.onstarted_leading()
        self.lose.wait()
        config.onstopped_leading()


class Work:
    """`start_work`: two tasks that record when they were cancelled and when they ended."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.starts = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def _run(self, name: str) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # an in-flight reconcile finishing
            self.log.append(f"{name} done")
            raise

    def __call__(self) -> list[asyncio.Task[None]]:
        self.starts += 1
        self.tasks = [asyncio.create_task(self._run(n)) for n in ("queue", "resync")]
        return self.tasks


def leader_gauge(metrics: Metrics) -> float | None:
    value: float | None = metrics.registry.get_sample_value("ipam_bridge_leader")
    return value


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def leadership(
    lock: FakeLock, fake: FakeElection, work: Work, stops: list[tuple[str, float]] | None
) -> tuple[Leadership, Metrics]:
    metrics = Metrics()
    stop = None if stops is None else lambda reason, grace: stops.append((reason, grace))
    return (
        Leadership(
            lock,  # type: ignore[arg-type]
            start_work=work,
            metrics=metrics,
            stop_operator=stop,
            run_election=fake,
        ),
        metrics,
    )


@pytest.mark.asyncio
async def test_the_work_starts_when_leadership_is_won_and_stops_at_once_when_lost() -> None:
    log: list[str] = []
    lock, fake, work, stops = FakeLock(), FakeElection(), Work(log), []
    lead, metrics = leadership(lock, fake, work, stops)
    lead.start()
    await asyncio.sleep(0.05)
    assert work.starts == 0 and not lead.leading  # a standby: nothing runs
    assert leader_gauge(metrics) == 0

    fake.win.set()
    await until(lambda: lead.leading)
    assert work.starts == 1 and leader_gauge(metrics) == 1
    assert not any(task.done() for task in work.tasks)

    fake.lose.set()
    await until(lambda: lead.lost is not None)
    assert all(task.cancelling() or task.done() for task in work.tasks)  # cancelled at once
    assert leader_gauge(metrics) == 0 and not lead.leading
    assert stops == [("lost the leader Lease ns/ipam-bridge: not renewed within 10 s", 1.5)]

    await lead.close()  # kopf's clean-up after the stop
    assert lock.calls == ["stop", "close"]  # lost: nothing to release
    assert sorted(log) == ["queue done", "resync done"]


@pytest.mark.asyncio
async def test_close_lets_the_work_finish_then_releases_the_lease() -> None:
    log: list[str] = []
    lock, fake, work, stops = FakeLock(), FakeElection(), Work(log), []
    lock.release = lambda: (log.append("release"), True)[1]  # type: ignore[method-assign]
    lead, metrics = leadership(lock, fake, work, stops)
    lead.start()
    fake.win.set()
    await until(lambda: lead.leading)

    await lead.close()
    assert log[-1] == "release" and sorted(log[:2]) == ["queue done", "resync done"]
    assert leader_gauge(metrics) == 0 and not lead.leading
    assert stops == []
    fake.lose.set()  # the election thread ends later: nothing happens any more
    await asyncio.sleep(0.05)
    assert stops == [] and work.starts == 1


@pytest.mark.asyncio
async def test_a_standby_that_stops_starts_nothing_and_a_late_win_is_ignored() -> None:
    lock, fake, work, stops = FakeLock(), FakeElection(), Work([]), []
    lead, metrics = leadership(lock, fake, work, stops)
    lead.start()
    await lead.close()
    assert lock.calls == ["release", "close"]  # release checks the holder on the server
    fake.win.set()
    await asyncio.sleep(0.05)
    assert work.starts == 0 and leader_gauge(metrics) == 0


@pytest.mark.asyncio
async def test_a_failed_election_stops_the_operator() -> None:
    lock, fake, work, stops = FakeLock(), FakeElection(), Work([]), []
    fake.fail = RuntimeError("boom")
    lead, _ = leadership(lock, fake, work, stops)
    lead.start()
    await until(lambda: bool(stops))
    assert stops == [("leader election failed: boom", 1.5)]
    assert work.starts == 0


@pytest.mark.asyncio
async def test_without_a_way_to_stop_the_operator_only_the_work_stops() -> None:
    lock, fake, work = FakeLock(), FakeElection(), Work([])
    lead, _ = leadership(lock, fake, work, None)
    lead.start()
    fake.win.set()
    await until(lambda: lead.leading)
    fake.lose.set()
    await until(lambda: lead.lost is not None)
    await asyncio.gather(*work.tasks, return_exceptions=True)
    assert all(task.cancelled() for task in work.tasks)
    await lead.close()


@pytest.mark.asyncio
async def test_leadership_is_lost_at_the_renew_deadline_to_the_moment() -> None:
    # the smallest timings the official Config accepts
    timings = Timings(lease_seconds=3, renew_deadline_seconds=1.3, retry_seconds=1.0)
    lock, fake, work, stops = FakeLock(timings), FakeElection(), Work([]), []
    lead, _ = leadership(lock, fake, work, stops)
    lead.start()
    fake.win.set()
    await until(lambda: lead.leading)
    for _ in range(3):  # renewed in time: still leading
        lock.renewed = time.monotonic()
        await asyncio.sleep(0.3)
    assert lead.leading and stops == []
    renewed = lock.renewed
    await until(lambda: lead.lost is not None)
    late = time.monotonic() - renewed
    # retry + deadline (2.3 s), not a retry period more (3.3 s); half a period of slack for a
    # loaded machine's scheduling
    assert 2.3 <= late < 2.8, late
    assert stops == [("lost the leader Lease ns/ipam-bridge: not renewed within 1.3 s", 0.5)]
    fake.lose.set()  # the official loop notices later: nothing more happens
    await asyncio.sleep(0.05)
    assert len(stops) == 1
    await lead.close()


def test_exit_grace_is_half_the_gap_before_a_takeover() -> None:
    lock = FakeLock()
    assert leadership(lock, FakeElection(), Work([]), [])[0].exit_grace == 1.5
    lock.timings = Timings(5, 3.0, 1.0)
    assert leadership(lock, FakeElection(), Work([]), [])[0].exit_grace == 0.5


def test_operator_stop_sets_kopfs_flag_and_ends_a_process_that_hangs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(leader.os, "_exit", exits.append)
    stop = OperatorStop()
    stop("lost the leader Lease ns/ipam-bridge", 0.01)
    assert stop.flag.is_set() and stop.reason == "lost the leader Lease ns/ipam-bridge"
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exits == [1]
    assert capsys.readouterr().err == "ipam-bridge: lost the leader Lease ns/ipam-bridge; exiting\n"


def test_run_exits_1_with_a_last_line_when_the_lease_was_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import kopf
    from fakes import local_kubeconfig

    from bridge import cli

    monkeypatch.setenv("KUBECONFIG", str(local_kubeconfig(tmp_path / "kubeconfig")))

    def run(**kwargs: Any) -> None:
        stop = kwargs["memo"]["operator_stop"]
        assert kwargs["stop_flag"] is stop.flag
        stop.reason = "lost the leader Lease ns/ipam-bridge: not renewed within 10 s"

    monkeypatch.setattr(kopf, "run", run)
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    assert cli.main(["run"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ipam-bridge: lost the leader Lease ns/ipam-bridge: not renewed within 10 s; exiting"
    )


@pytest.mark.asyncio
async def test_a_blocked_loop_does_not_delay_the_fence_or_the_armed_exit() -> None:
    timings = Timings(lease_seconds=3, renew_deadline_seconds=1.3, retry_seconds=1.0)
    lock, fake, work, stops = FakeLock(timings), FakeElection(), Work([]), []
    armed: list[tuple[str, float, float]] = []
    lead = Leadership(
        lock,  # type: ignore[arg-type]
        start_work=work,
        metrics=Metrics(),
        stop_operator=lambda reason, grace: stops.append((reason, grace)),
        arm_exit=lambda reason, grace: armed.append((reason, grace, time.monotonic())),
        run_election=fake,
    )
    lead.start()
    fake.win.set()
    await until(lambda: lead.leading)
    lock.renewed = time.monotonic()
    lead.fence.check()  # renewed now: writes pass
    renewed = lock.renewed
    time.sleep(2.6)  # the event loop is blocked past retry + renew deadline (2.3 s)
    # The fence closed at the renew deadline and the exit was armed, both off the loop.
    with pytest.raises(LeadershipLostError, match=r"not renewed within 1\.3 s"):
        lead.fence.check()
    assert [(r, g) for r, g, _ in armed] == [
        ("lost the leader Lease ns/ipam-bridge: not renewed within 1.3 s", 0.5)
    ]
    assert 2.3 <= armed[0][2] - renewed < 2.5
    assert stops == []  # the loop has not run yet
    await until(lambda: lead.lost is not None)
    assert len(stops) == 1
    fake.lose.set()
    await lead.close()


def test_operator_stop_arms_the_exit_once_from_any_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(leader.os, "_exit", exits.append)
    stop = OperatorStop()
    threads = [threading.Thread(target=stop.arm, args=(f"reason {i}", 0.05)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stop.reason is not None and not stop.flag.is_set()
    stop("later", 0.05)
    assert stop.flag.is_set() and stop.reason.startswith("reason ")
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert exits == [1]


class InFlight:
    """A pass in a thread of ours that outlives the drain and then tries a write.

    It waits until the fence is revoked (at most 10 s), tries `Fence.check` as every write
    does, and records whether the Lease had been released by then.
    """

    def __init__(self, name: str, lead: Leadership, lock: FakeLock, log: list[str]) -> None:
        self.name, self.lead, self.lock, self.log = name, lead, lock, log
        self.started = threading.Event()

    def __call__(self, *_: Any, **__: Any) -> Any:
        self.started.set()
        deadline = time.monotonic() + 10
        while self.lead.fence.revoked is None and time.monotonic() < deadline:
            time.sleep(0.01)
        released = "release" in self.lock.calls
        try:
            self.lead.fence.check()
            self.log.append(f"{self.name} wrote (released: {released})")
        except LeadershipLostError:
            self.log.append(f"{self.name} refused (released: {released})")
        return Result.done() if self.name == "reconcile" else []


@pytest.mark.asyncio
async def test_a_clean_stop_revokes_the_fence_joins_its_threads_then_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bridge.handlers import resync
    from bridge.reconcilers.audit import service

    log: list[str] = []
    lock, fake = FakeLock(), FakeElection()
    lead = Leadership(
        lock,  # type: ignore[arg-type]
        start_work=lambda: work(),
        metrics=Metrics(),
        run_election=fake,
        drained=lambda: log.append("events posted"),
        drain_seconds=0.2,
        join_seconds=15,
    )
    reconcile = InFlight("reconcile", lead, lock, log)
    purge = InFlight("purge", lead, lock, log)
    audit = InFlight("audit", lead, lock, log)
    monkeypatch.setattr(resync, "_purge", purge)
    monkeypatch.setattr(service, "_held_round", audit)
    queue = WorkQueue(reconcile, workers=2, standby=True)
    op = SimpleNamespace(settings=SimpleNamespace(quarantine_purge_seconds=3600))
    deps = SimpleNamespace(interval=0.01, reads=lambda: None)

    def work() -> list[asyncio.Task[Any]]:
        queue.lead()
        queue.add("claim")
        return [
            asyncio.create_task(queue.run(), name="work queue"),
            asyncio.create_task(resync.purge_forever(op), name="purge"),  # type: ignore[arg-type]
            asyncio.create_task(service.audit_forever(deps), name="audit"),  # type: ignore[arg-type]
        ]

    lead.start()
    fake.win.set()
    await until(lambda: all(p.started.is_set() for p in (reconcile, purge, audit)))
    lead.fence.check()  # leading: writes pass

    await lead.close()
    # each pass outlived the drain: its write after the revoke was refused, the Lease not
    # yet released; nothing was posted meanwhile (the work had not ended)
    assert sorted(log) == [
        "audit refused (released: False)",
        "purge refused (released: False)",
        "reconcile refused (released: False)",
    ]
    assert lock.calls == ["release", "close"]
    with pytest.raises(LeadershipLostError, match="stopping: the leader Lease ns/ipam-bridge"):
        lead.fence.check()
    ours = [t.name for t in threading.enumerate() if t.name.startswith("ipam-bridge-")]
    assert [n for n in ours if not n.startswith("ipam-bridge-leader")] == []


@pytest.mark.asyncio
async def test_a_clean_stop_posts_the_queued_events_before_the_revoke() -> None:
    log: list[str] = []
    lock, fake, work = FakeLock(), FakeElection(), Work(log)
    lead: Leadership

    def drained() -> None:
        lead.fence.check()  # still open
        log.append("events posted")

    lock.release = lambda: (
        log.append(f"release, revoked: {lead.fence.revoked is not None}"),
        True,
    )[1]  # type: ignore[method-assign]
    lead = Leadership(
        lock,  # type: ignore[arg-type]
        start_work=work,
        metrics=Metrics(),
        run_election=fake,
        drained=drained,
    )
    lead.start()
    fake.win.set()
    await until(lambda: lead.leading)
    await lead.close()
    assert sorted(log[:2]) == ["queue done", "resync done"]
    assert log[2:] == ["events posted", "release, revoked: True"]
