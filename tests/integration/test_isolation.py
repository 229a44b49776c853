"""Per-endpoint isolation (issue 10): one broken IPAM endpoint must not starve the others.

(a) A hung endpoint (accepts connections, never answers) beside a healthy one, with 4
    workers: the healthy pool's claims are bound within seconds; the hung pool and its claims
    say why.
(b) Three pools with wrong passwords beside a healthy pool on one mock phpIPAM with its
    lock-out on (more than 10 failed logins within 5 minutes block the source address, good
    credentials included): the operator never gets locked out, and the healthy pool keeps
    serving, also after the wrong Secrets are re-created with other wrong passwords.

Figures are printed (``pytest -s``) for the release note.
"""

from __future__ import annotations

import base64
import copy
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from fault_audit import (
    FailureLog,
    is_bound,
    pools,
    print_figures,
    ready_condition,
)
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

from mock_kubernetes.objects import wait_for
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

#: Namespace of the broken pools (the healthy ones live in `NAMESPACE`).
BROKEN = "broken"

#: The subnet both mocks serve (a /24 of `PHPIPAM_SEED`).
SUBNET_ID = 7

#: The most a healthy claim may take to be bound while another endpoint misbehaves.
HEALTHY_SECONDS = 8.0

#: The login budget the issue asks for: refused logins per endpoint per 5 minutes.
LOGIN_BUDGET = 5

#: Claim Ready False reasons that say why the backend cannot serve.
HUNG_CLAIM_REASONS = frozenset({"PoolNotReady", "AllocationFailed", "BackendUnavailable"})


@pytest.fixture
def hung() -> Iterator[MockPhpipamServer]:
    """A second mock phpIPAM; the test makes it hang (accept connections, never answer)."""
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield server
        server.faults.reset()  # let the hung requests go before the operator stops


def ready(body: Mapping[str, Any] | None) -> tuple[str | None, str | None, str]:
    """(status, reason, message) of an object's Ready condition."""
    condition = ready_condition(body or {})
    return condition.get("status"), condition.get("reason"), str(condition.get("message") or "")


def claims_of(sandbox: Sandbox, namespace: str, names: list[str]) -> list[dict[str, Any]]:
    wanted = set(names)
    return [c for c in sandbox.claims(namespace) if c["metadata"]["name"] in wanted]


def time_to_bind(
    sandbox: Sandbox, names: list[str], *, since: float, timeout: float, each: Callable[[], Any]
) -> float:
    """Wait until every named claim of `NAMESPACE` is bound; return the seconds since
    ``since`` (fails the test with what is unbound on timeout)."""

    def all_bound() -> bool:
        each()
        claims = claims_of(sandbox, NAMESPACE, names)
        return len(claims) == len(names) and all(is_bound(c) for c in claims)

    try:
        wait_for(all_bound, timeout=timeout, interval=0.1, message=f"{len(names)} claims bound")
    except TimeoutError:
        unbound = {
            c["metadata"]["name"]: ready(c)
            for c in claims_of(sandbox, NAMESPACE, names)
            if not is_bound(c)
        }
        pytest.fail(f"healthy claims not bound within {timeout}s: {unbound}")
    return time.monotonic() - since


def distinct_addresses(sandbox: Sandbox, store: Store, names: list[str]) -> None:
    """The named claims hold distinct addresses, each registered in the healthy phpIPAM."""
    addresses = {
        a["spec"]["claimRef"]["name"]: a["spec"]["address"]
        for a in sandbox.addresses(NAMESPACE)
        if a["spec"]["claimRef"]["name"] in set(names)
    }
    assert sorted(addresses) == sorted(names)
    assert len(set(addresses.values())) == len(names)
    rows = {a.ip.compressed for a in store.subnet_addresses(SUBNET_ID)}
    assert set(addresses.values()) <= rows


# ------------------------------------------------------------------------------ (a)


def test_hung_endpoint_does_not_starve_a_healthy_one(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    hung: MockPhpipamServer,
) -> None:
    # The production timeouts (10 s per request, 30 s per call) and 4 workers: without
    # isolation, 8 claims on the hung endpoint hold every worker for minutes.
    sandbox = make_sandbox(
        settings={
            "IPAM_BRIDGE_WORKERS": "4",
            "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "10",
            "IPAM_BRIDGE_RETRY_ATTEMPTS": "5",
            "IPAM_BRIDGE_RETRY_MAX_DELAY_SECONDS": "5",
            "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "30",
        }
    )
    sandbox.namespace(BROKEN)
    sandbox.phpipam_pool(
        BROKEN, "hung", endpoint=hung.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(BROKEN, "hung", timeout=30)
    # The endpoint hangs from now on: it accepts connections and never answers. Claims of
    # a pool that was ready go to it (search, first-free, login).
    hung.faults.update(hang_rate=1.0, hang_seconds=600)
    hung_claims = [f"h{i}" for i in range(10)]
    for name in hung_claims:
        sandbox.claim(BROKEN, name, "hung")
    # The operator is stuck in requests to the hung endpoint before the healthy pool comes.
    wait_for(lambda: hung.faults.stats["hangs"] >= 2, timeout=30, message="hung requests")
    time.sleep(1.0)

    log = FailureLog(sandbox, BROKEN)
    started = time.monotonic()
    sandbox.phpipam_pool(
        NAMESPACE, "healthy", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    first = [f"ok{i}" for i in range(4)]
    for name in first:
        sandbox.claim(NAMESPACE, name, "healthy")
    first_seconds = time_to_bind(
        sandbox, first, since=started, timeout=HEALTHY_SECONDS, each=log.sample
    )

    print_figures(
        "healthy pool created after 10 claims of a hung endpoint, 4 workers",
        healthy_claims=len(first),
        hung_requests=hung.faults.stats["hangs"],
        seconds=first_seconds,
    )

    # The hung pool and its claims say why, with Warning Events.
    endpoint = hung.base_url.split("://", 1)[1]

    def hung_explained() -> bool:
        log.sample()
        status, reason, message = ready(sandbox.pool(BROKEN, "hung"))
        claims = claims_of(sandbox, BROKEN, hung_claims)
        return (
            (status, reason) == ("False", "BackendUnavailable")
            and endpoint in message
            and len(claims) == len(hung_claims)
            and all(
                ready(c)[0] == "False" and ready(c)[1] in HUNG_CLAIM_REASONS and ready(c)[2]
                for c in claims
            )
        )

    explain_started = time.monotonic()
    try:
        wait_for(hung_explained, timeout=90, interval=0.25, message="the hung pool explained")
    except TimeoutError:
        shown = {
            c["metadata"]["name"]: ready(c)
            for c in claims_of(sandbox, BROKEN, hung_claims) + pools(sandbox, BROKEN)
        }
        pytest.fail(f"the hung pool and its claims do not say why: {shown}")
    explained_seconds = time.monotonic() - explain_started
    log.assert_events()
    assert ("PHPIPAMIPPool", "hung", "BackendUnavailable") in log.seen

    # New healthy claims keep being served while the endpoint still hangs.
    second_started = time.monotonic()
    second = [f"ok-late{i}" for i in range(4)]
    for name in second:
        sandbox.claim(NAMESPACE, name, "healthy")
    second_seconds = time_to_bind(
        sandbox, second, since=second_started, timeout=HEALTHY_SECONDS, each=log.sample
    )
    distinct_addresses(sandbox, phpipam.store, first + second)
    assert hung.store.search_hostname(f"h0.{BROKEN}") == []
    assert ready(sandbox.pool(NAMESPACE, "healthy"))[:2] == ("True", "PoolReady")
    print_figures(
        "hung endpoint beside a healthy one, 4 workers",
        hung_claims=len(hung_claims),
        hung_requests=hung.faults.stats["hangs"],
        healthy_first_seconds=first_seconds,
        healthy_later_seconds=second_seconds,
        hung_explained_after_seconds=explained_seconds,
    )


# ------------------------------------------------------------------------------ (b)


WRONG_POOLS = ("wrong-a", "wrong-b", "wrong-c")


def test_wrong_passwords_never_lock_the_operator_out(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    store = phpipam.store
    store.settings.lockout = True  # phpIPAM: > 10 failures in 5 minutes block the source
    store.settings.max_login_failures = 10
    store.settings.login_failure_window_seconds = 300
    store.settings.block_seconds = 300
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_WORKERS": "4"})
    sandbox.namespace(BROKEN)
    test_started = time.monotonic()

    def wrong_credentials(n: int, round_: int) -> dict[str, str]:
        return {"username": CREDENTIALS["username"], "password": f"Wr0ng-{round_}-{n}-never-logged"}

    for n, name in enumerate(WRONG_POOLS):
        sandbox.phpipam_pool(
            BROKEN,
            name,
            endpoint=phpipam.url,
            subnet_id=SUBNET_ID,
            credentials=wrong_credentials(n, 0),
        )
        for i in range(3):
            sandbox.claim(BROKEN, f"{name}-{i}", name)
    sandbox.phpipam_pool(
        NAMESPACE, "healthy", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    log = FailureLog(sandbox, BROKEN)
    held_back: set[str] = set()

    def sample() -> None:
        log.sample()
        assert not store.is_blocked("127.0.0.1"), f"locked out: {store.lockout_stats}"
        for name in WRONG_POOLS:
            _, reason, message = ready(sandbox.pool(BROKEN, name))
            if reason == "AuthenticationFailed" and re.search(
                r"next (try|attempt|login)", message, re.IGNORECASE
            ):
                held_back.add(name)

    served: list[float] = []
    bound: list[str] = []

    def serve(batch: int) -> None:
        names = [f"ok{batch}-{i}" for i in range(2)]
        started = time.monotonic()
        for name in names:
            sandbox.claim(NAMESPACE, name, "healthy")
        served.append(
            time_to_bind(sandbox, names, since=started, timeout=HEALTHY_SECONDS, each=sample)
        )
        bound.extend(names)

    def wrong_pools_refused() -> bool:
        sample()
        return all(
            ready(sandbox.pool(BROKEN, name))[:2] == ("False", "AuthenticationFailed")
            for name in WRONG_POOLS
        ) and all(ready(c)[:2] == ("False", "PoolNotReady") for c in sandbox.claims(BROKEN))

    batches = iter(range(1000))

    def keep_serving(seconds: float) -> None:
        """Two new healthy claims a second, each batch bound within `HEALTHY_SECONDS`."""
        phase_end = time.monotonic() + seconds
        while time.monotonic() < phase_end:
            serve(next(batches))
            time.sleep(1.0)

    serve(next(batches))
    wait_for(wrong_pools_refused, timeout=30, interval=0.25, message="wrong pools refused")
    # The healthy pool keeps serving while the wrong ones keep failing.
    keep_serving(15)
    failed_first = store.lockout_stats["failed_logins"]

    # Other wrong passwords in the same Secrets (each pool's backend is rebuilt).
    for n, name in enumerate(WRONG_POOLS):
        password = wrong_credentials(n, 1)["password"]
        sandbox.kube.patch(
            "v1",
            "secrets",
            f"{name}-credentials",
            {"data": {"password": base64.b64encode(password.encode()).decode()}},
            BROKEN,
        )
    keep_serving(15)

    # The wrong pools and their Secrets are deleted and created again, with other wrong
    # passwords (the Secrets are in use, so they go with their pools).
    for name in WRONG_POOLS:
        sandbox.delete_pool(BROKEN, name)
    for name in WRONG_POOLS:
        sandbox.kube.delete("v1", "secrets", f"{name}-credentials", BROKEN)

    def wrong_pools_gone() -> bool:
        sample()
        return all(
            sandbox.pool(BROKEN, name) is None
            and sandbox.kube.get("v1", "secrets", f"{name}-credentials", BROKEN) is None
            for name in WRONG_POOLS
        )

    wait_for(wrong_pools_gone, timeout=30, interval=0.25, message="the wrong pools gone")
    for n, name in enumerate(WRONG_POOLS):
        sandbox.phpipam_pool(
            BROKEN,
            name,
            endpoint=phpipam.url,
            subnet_id=SUBNET_ID,
            credentials=wrong_credentials(n, 2),
        )
    keep_serving(20)
    wait_for(wrong_pools_refused, timeout=30, interval=0.25, message="wrong pools refused")

    stats = store.lockout_stats
    elapsed = time.monotonic() - test_started
    assert elapsed < 300  # the whole test lies within one lock-out window
    assert stats["lockouts"] == 0 and stats["blocked_requests"] == 0, stats
    assert 1 <= stats["failed_logins"] <= LOGIN_BUDGET, stats
    assert held_back, "no wrong pool said when its next login is"
    distinct_addresses(sandbox, store, bound)
    log.assert_events()
    shown = [str(e.get("message")) for e in sandbox.events()] + [
        str(ready_condition(b)) for b in sandbox.claims(BROKEN) + pools(sandbox, BROKEN)
    ]
    assert not [s for s in shown if "Wr0ng-" in s or CREDENTIALS["password"] in s]
    print_figures(
        "3 wrong-password pools beside a healthy one, lock-out on",
        failed_logins_before_new_secrets=failed_first,
        failed_logins=stats["failed_logins"],
        lockouts=stats["lockouts"],
        healthy_claims=len(bound),
        healthy_max_seconds=max(served),
        healthy_mean_seconds=sum(served) / len(served),
        seconds=elapsed,
    )
