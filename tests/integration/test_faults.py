"""Faults of the IPAM and of the operator itself, with the real operator (issue 4, point 5).

Each test injects one fault with mock_phpipam (`mock_phpipam.faults.FaultInjector`) or by
killing the operator, samples what users see while it lasts (every failing claim and pool
shows Ready False with a reason and message, and a Warning Event), and after the fault
audits the end state (`audit`): no address held by two claims, no address left in phpIPAM
without a live claim, no live claim without its address.

The figures (claims, faults injected, duplicates, leaks, time) are printed: ``pytest -s``.
``IPAM_BRIDGE_TEST_DOWN_SECONDS`` shortens the outage of `test_backend_down_for_a_while`
(default 60); ``IPAM_BRIDGE_TEST_SEED`` replays the kill points of
`test_operator_killed_during_churn` (its seed is printed).
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fault_audit import (
    CLAIM_FAILURE_REASONS,
    SUBNET_ID,
    FailureLog,
    audit,
    bound_names,
    converged,
    create_claims,
    deleting,
    is_bound,
    logins,
    make_pool,
    poll,
    pools,
    print_figures,
    ready_condition,
    registered,
    sampling,
    wait_converged,
)
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import ManualClock, Store

#: How long the backend stays down in `test_backend_down_for_a_while` (seconds). The issue
#: asks for 60 s; set ``IPAM_BRIDGE_TEST_DOWN_SECONDS`` to shorten it on a slow machine.
DOWN_SECONDS = float(os.environ.get("IPAM_BRIDGE_TEST_DOWN_SECONDS", "60"))


# ------------------------------------------------------------------------------ helpers


def test_errors_and_timeouts_while_claims_come_and_go(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    """30% of requests answer 500/503, some hang past the timeout: 200 claims, 100 deleted."""
    sandbox = make_sandbox(
        settings={
            "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "1",
            "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "3",
        }
    )
    make_pool(sandbox, phpipam)
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    phpipam.faults.rng = random.Random(4005)
    phpipam.faults.update(error_rate=0.3, hang_rate=0.03, hang_seconds=3.0)
    log = FailureLog(sandbox)
    names = [f"m{i:03d}" for i in range(200)]
    doomed = names[::2]

    started = time.monotonic()
    create_claims(sandbox, names)
    poll(
        sampling(log, lambda: len(bound_names(sandbox)) >= 100),
        timeout=120,
        message="100 claims bound under faults",
    )
    for name in doomed:
        sandbox.delete_claim(NAMESPACE, name)
    # Under the fault it should still get there; the contract only asks it once it clears.
    try:
        poll(
            sampling(log, lambda: converged(sandbox, phpipam.store, 100)),
            timeout=45,
            message="convergence under faults",
        )
        under_fault = True
    except TimeoutError:
        under_fault = False
    stats = dict(phpipam.faults.stats)
    phpipam.faults.reset()
    result = wait_converged(sandbox, phpipam.store, 100, timeout=60)
    elapsed = time.monotonic() - started

    assert stats["errors"] > 0 and stats["hangs"] > 0
    assert log.failures("IPAddressClaim"), "no claim ever showed a failure under 30% errors"
    for (_, name, reason), message in log.failures("IPAddressClaim").items():
        assert reason in CLAIM_FAILURE_REASONS, (name, reason, message)
    log.assert_events()
    assert {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)} == set(names) - set(doomed)
    print_figures(
        "errors 30% + timeouts",
        claims_created=200,
        claims_deleted=100,
        errors_injected=stats["errors"],
        timeouts_injected=stats["hangs"],
        claims_seen_failing=len({k[1] for k in log.failures("IPAddressClaim")}),
        pool_warnings=sum(
            1
            for e in sandbox.events(NAMESPACE)
            if e.get("type") == "Warning" and e["involvedObject"].get("kind") == "PHPIPAMIPPool"
        ),
        converged_under_fault=under_fault,
        duplicates=len(result.duplicates),
        leaks=len(result.leaks),
        unbound=len(result.unbound),
        seconds=elapsed,
    )


# ------------------------------------------------------------------------------ (b)


def test_backend_down_for_a_while(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    """phpIPAM unreachable for `DOWN_SECONDS` while claims are created and deleted."""
    make_pool(sandbox, phpipam)
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    before = [f"before-{i:02d}" for i in range(20)]
    create_claims(sandbox, before)
    wait_converged(sandbox, phpipam.store, 20, timeout=60)
    rows_before = registered(phpipam.store)
    during = [f"during-{i:02d}" for i in range(10)]
    doomed = before[::2]
    log = FailureLog(sandbox)

    phpipam.faults.update(down=True)
    down_at = time.monotonic()
    create_claims(sandbox, during)
    for name in doomed:
        sandbox.delete_claim(NAMESPACE, name)

    def visible() -> bool:
        claims = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
        (pool,) = pools(sandbox, NAMESPACE)
        # New claims wait for the pool (PoolNotReady) once its check saw the outage, or show
        # their own failed attempt (AllocationFailed) if they tried first; deleting claims
        # show their failed release.
        waiting = {("False", "AllocationFailed"), ("False", "PoolNotReady")}
        return (
            sandbox.ready(pool) == ("False", "BackendUnavailable")
            and all(n in claims and sandbox.ready(claims[n]) in waiting for n in during)
            and all(
                n in claims and sandbox.ready(claims[n]) == ("False", "AllocationFailed")
                for n in doomed
            )
        )

    poll(
        sampling(log, visible),
        timeout=max(DOWN_SECONDS - 5, 5),
        message="the outage visible on the pool, new claims and deleting claims",
    )
    visible_after = time.monotonic() - down_at

    def hold(until: float) -> Callable[[], bool]:
        def check() -> bool:
            # While down: nothing new bound, no deleting claim let go (its address is still
            # registered), phpIPAM untouched.
            claims = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
            assert all(n in claims and deleting(claims[n]) for n in doomed)
            assert not any(is_bound(claims[n]) for n in during)
            assert registered(phpipam.store) == rows_before
            return time.monotonic() - down_at >= until

        return sampling(log, check)

    # First half: connections dropped (a dead server); second half: a proxy answering 503.
    poll(hold(DOWN_SECONDS / 2), timeout=DOWN_SECONDS + 30, message="half the outage")
    phpipam.faults.update(down_mode="503")
    poll(hold(DOWN_SECONDS), timeout=DOWN_SECONDS + 30, message="the end of the outage")
    assert visible(), "the outage stopped being visible before it ended"
    stats = dict(phpipam.faults.stats)
    phpipam.faults.update(down=False)
    up_at = time.monotonic()
    result = wait_converged(sandbox, phpipam.store, 20, timeout=60)
    recovered = time.monotonic() - up_at
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=30)

    assert stats["down"] > 0
    log.assert_events()
    print_figures(
        f"backend down {DOWN_SECONDS:g}s",
        claims_created=30,
        claims_deleted=10,
        requests_refused=stats["down"],
        visible_after_seconds=visible_after,
        recovered_after_seconds=recovered,
        duplicates=len(result.duplicates),
        leaks=len(result.leaks),
        unbound=len(result.unbound),
        seconds=time.monotonic() - down_at,
    )


# ------------------------------------------------------------------------------ (c)


def test_wrong_credentials_fixed_in_the_secret(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    """A wrong password shows on pool and claims, does not get phpIPAM to block us, and
    everything proceeds within seconds of the Secret being fixed."""
    wrong_password = "Wr0ng-pa55word-also-never-logged"
    make_pool(sandbox, phpipam, {"username": CREDENTIALS["username"], "password": wrong_password})
    names = [f"m{i}" for i in range(5)]
    create_claims(sandbox, names)
    log = FailureLog(sandbox)
    started = time.monotonic()

    def refused() -> bool:
        claims = sandbox.claims(NAMESPACE)
        (pool,) = pools(sandbox, NAMESPACE)
        return (
            sandbox.ready(pool) == ("False", "AuthenticationFailed")
            and len(claims) == 5
            and all(sandbox.ready(c) == ("False", "PoolNotReady") for c in claims)
        )

    poll(sampling(log, refused), timeout=30, message="the refusal visible on pool and claims")
    # It stays visible, and the operator does not hammer phpIPAM's login while it lasts
    # (phpIPAM blocks the client address after 10 failures within 5 minutes).
    hold_until = time.monotonic() + 5
    poll(
        sampling(log, lambda: refused() and time.monotonic() >= hold_until),
        timeout=30,
        message="the refusal still visible",
    )
    failed_logins = logins(phpipam.store, ok=False)
    assert 1 <= failed_logins <= phpipam.store.settings.max_login_failures
    assert phpipam.store.requests(writes_only=True) == []

    sandbox.kube.patch(
        "v1",
        "secrets",
        "pool-credentials",
        {"data": {"password": base64.b64encode(CREDENTIALS["password"].encode()).decode()}},
        NAMESPACE,
    )
    fixed_at = time.monotonic()
    result = wait_converged(sandbox, phpipam.store, 5, timeout=30)
    recovered = time.monotonic() - fixed_at
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=30)

    log.assert_events()
    shown = [str(e.get("message")) for e in sandbox.events(NAMESPACE)] + [
        str(ready_condition(b)) for b in sandbox.claims(NAMESPACE) + pools(sandbox, NAMESPACE)
    ]
    assert not [s for s in shown if wrong_password in s or CREDENTIALS["password"] in s]
    print_figures(
        "wrong credentials",
        claims=5,
        failed_logins=failed_logins,
        recovered_after_seconds=recovered,
        duplicates=len(result.duplicates),
        leaks=len(result.leaks),
        unbound=len(result.unbound),
        seconds=time.monotonic() - started,
    )


# ------------------------------------------------------------------------------ (d)


@pytest.fixture
def phpipam_clock() -> Iterator[tuple[MockPhpipamServer, ManualClock]]:
    """A mock phpIPAM whose clock (token expiry) only moves when the test advances it."""
    clock = ManualClock()
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED), clock=clock)) as server:
        yield server, clock


def test_token_expiring_mid_run(
    sandbox: Sandbox, phpipam_clock: tuple[MockPhpipamServer, ManualClock]
) -> None:
    """The user token expires twice while claims are created and deleted: one re-login
    each time, no failure shown, nothing lost."""
    phpipam, clock = phpipam_clock
    store = phpipam.store
    make_pool(sandbox, phpipam)
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    log = FailureLog(sandbox)
    started = time.monotonic()
    names = [f"m{i:02d}" for i in range(40)]
    create_claims(sandbox, names[:15])
    wait_converged(sandbox, store, 15, timeout=60, each=log.sample)
    expected = 15
    relogins = []
    for round_ in range(2):
        logins_before = logins(store, ok=True)
        rejected_before = sum(1 for e in store.requests() if e.status == 401)
        clock.advance(store.settings.token_ttl_seconds + 60)
        new = names[15 + round_ * 10 : 25 + round_ * 10]
        create_claims(sandbox, new)
        for name in names[round_ * 5 : round_ * 5 + 5]:
            sandbox.delete_claim(NAMESPACE, name)
        expected += len(new) - 5
        wait_converged(sandbox, store, expected, timeout=60, each=log.sample)
        rejected = sum(1 for e in store.requests() if e.status == 401) - rejected_before
        relogins.append(logins(store, ok=True) - logins_before)
        assert rejected >= 1, "the expired token was never presented"
        assert relogins[-1] == 1, "one pool, one client: exactly one re-login per expiry"

    assert log.seen == {}, f"token expiry must be invisible: {log.seen}"
    assert [e for e in sandbox.events(NAMESPACE) if e.get("type") == "Warning"] == []
    assert logins(store, ok=False) == 0
    result = audit(sandbox, store)
    assert result.clean and result.claims == expected == 25
    print_figures(
        "token expiry",
        claims_created=35,
        claims_deleted=10,
        expiries=2,
        relogins=sum(relogins),
        duplicates=len(result.duplicates),
        leaks=len(result.leaks),
        unbound=len(result.unbound),
        seconds=time.monotonic() - started,
    )


# ------------------------------------------------------------------------------ (e)

#: SIGKILLs of the operator in `test_operator_killed_during_churn`.
KILLS = 20


class OperatorProcess:
    """``python -m bridge.cli run --standalone`` against a sandbox's emulated API."""

    def __init__(self, sandbox: Sandbox, log_path: Path) -> None:
        self.env = {
            **os.environ,
            **sandbox.settings,
            "KUBECONFIG": str(sandbox.workdir / "kubeconfig"),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = log_path
        self.log_offset = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the operator process (its output goes to ``log_path``)."""
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bridge.cli", "run", "--standalone"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        """SIGTERM it (a clean stop) and return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait until this process has finished its start-up (it logs the CAPI version).

        kopf handles SIGTERM only from then on; a SIGTERM during start-up ends the process
        with the signal's default action (exit code -15), as any program's.
        """

        def started() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(self.log_offset)
                return b"serving CAPI IPAM" in log.read()

        wait_for(started, timeout=timeout, interval=0.05, message="the operator's start-up")

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last lines of its output."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def writes_reached(store: Store, goal: int) -> bool:
    """True once phpIPAM has seen ``goal`` write requests."""
    return len(store.requests(writes_only=True)) >= goal


def half_done(sandbox: Sandbox, store: Store) -> bool:
    """True when phpIPAM holds an address whose claim has no IPAddress yet (a kill landed
    between the backend write and the Kubernetes write)."""
    named = {a["metadata"]["name"] for a in sandbox.addresses(NAMESPACE)}
    return any(
        not a.is_gateway and (a.hostname or "").split(".")[0] not in named
        for a in store.subnet_addresses(SUBNET_ID)
    )


def test_operator_killed_during_churn(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer, tmp_path: Path
) -> None:
    """SIGKILL the operator process `KILLS` times at random points of a churn of claims;
    a final clean run leaves every live claim bound and nothing leaked."""
    sandbox = make_sandbox(start_operator=False)
    store = phpipam.store
    make_pool(sandbox, phpipam)
    seed = int(os.environ.get("IPAM_BRIDGE_TEST_SEED", "0")) or random.randrange(1, 10**6)
    rng = random.Random(seed)
    operator = OperatorProcess(sandbox, tmp_path / "operator.log")
    created = deleted = 0
    live: list[str] = []
    triggers: Counter[str] = Counter()
    started = time.monotonic()
    try:
        for round_ in range(KILLS):
            # Delete 3 claims of earlier rounds (bound or not), create 8: every round leaves
            # at least 8 backend writes to do.
            for name in rng.sample(live, min(3, len(live))):
                sandbox.delete_claim(NAMESPACE, name)
                live.remove(name)
                deleted += 1
            for i in range(8):
                name = f"r{round_:02d}-{i}"
                sandbox.claim(NAMESPACE, name, "pool")
                live.append(name)
                created += 1
            operator.start()
            if rng.random() < 0.3:
                # A random instant, start-up included (this sleep picks the kill time; it
                # synchronises nothing).
                time.sleep(rng.uniform(0.0, 2.5))
                triggers["time"] += 1
            else:
                # Right after the n-th backend write: between phpIPAM and Kubernetes.
                goal = len(store.requests(writes_only=True)) + rng.randint(1, 6)
                try:
                    wait_for(
                        functools.partial(writes_reached, store, goal),
                        timeout=20,
                        interval=0.005,
                        message="backend writes",
                    )
                    triggers["write"] += 1
                except TimeoutError:
                    triggers["idle"] += 1
            assert operator.alive(), f"the operator died by itself:\n{operator.tail()}"
            operator.kill()
            if half_done(sandbox, store):
                triggers["half-done"] += 1

        operator.start()
        result = wait_converged(sandbox, store, len(live), timeout=120)
        operator.wait_started()
        assert operator.terminate() == 0, operator.tail()
    finally:
        if operator.alive():
            operator.kill()
    assert sorted(c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)) == sorted(live)
    print_figures(
        f"SIGKILL x{KILLS} (seed {seed})",
        claims_created=created,
        claims_deleted=deleted,
        kills=KILLS,
        kill_points=dict(triggers),
        backend_writes=len(store.requests(writes_only=True)),
        duplicates=len(result.duplicates),
        leaks=len(result.leaks),
        unbound=len(result.unbound),
        seconds=time.monotonic() - started,
    )
