"""What a watch connection reset costs: LIST requests, API reads, time to the next claim bound.

The real operator (in this process, `mock_kubernetes.sandbox.Sandbox`, as the RBAC of
``deploy/`` allows it) serves one pool with ``claims`` bound claims. Then, ``rounds`` times,
the API server cuts every open watch connection with a TCP reset
(`mock_kubernetes.EmulatedKubernetes.reset_watches`: a load balancer, a proxy or a NAT
dropping long-lived connections), a claim is created at once and timed until bound, and the
operator is left ``settle`` seconds for whatever the reset set off. Counted from the
emulator's request log, the operator's requests only: LISTs (by resource) and GETs per
reset. client-go's reflector resumes a watch from its last resourceVersion after a broken
connection and lists only on 410 Gone: 0 LISTs per reset expected. Figures only.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.common import CREDENTIALS, SUBNET_ID, seed_for
from bridge import capi
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["ResetResult", "format_result", "run_watch_reset_bench"]

NAMESPACE = "reset"


@dataclass
class ResetResult:
    """Figures of ``rounds`` watch resets with ``claims`` bound claims (see the module)."""

    claims: int
    rounds: int
    watches: list[int] = field(default_factory=list)
    lists: Counter[str] = field(default_factory=Counter)
    gets: Counter[str] = field(default_factory=Counter)
    bound_seconds: list[float] = field(default_factory=list)


def _requests(sandbox: Sandbox, since: int) -> tuple[Counter[str], int]:
    """Return the operator's requests after record ``since`` as ``verb resource``; the end."""
    records = sandbox.kube.access_log.records()
    user = sandbox.identity.user.name
    counts: Counter[str] = Counter(
        f"{r.verb} {r.resource}" for r in records[since:] if r.via == "request" and r.user == user
    )
    return counts, len(records)


def _bound(sandbox: Sandbox, name: str) -> bool:
    claim = sandbox.get_claim(NAMESPACE, name) or {}
    return bool((claim.get("status") or {}).get("addressRef")) and (
        capi.ready_of(claim)[0] == "True"
    )


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout} s")
        time.sleep(0.02)


def run_watch_reset_bench(
    claims: int = 20, rounds: int = 5, *, settle: float = 3.0, timeout: float = 120.0
) -> ResetResult:
    """Reset the operator's watch connections ``rounds`` times; see the module docstring.

    Raises
    ------
    TimeoutError
        When the pool, the first claims or a claim made after a reset are not ready within
        ``timeout`` seconds.
    """
    result = ResetResult(claims, rounds)
    with (
        MockPhpipamServer(Store(seed_for(claims + rounds + 16))) as phpipam,
        Sandbox(settings={"IPAM_BRIDGE_WORKERS": "4"}, identity="operator") as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=timeout)
        for i in range(claims):
            sandbox.claim(NAMESPACE, f"c-{i}", "pool")
        sandbox.wait_claims_bound(NAMESPACE, claims, timeout=timeout)
        time.sleep(settle)  # every informer watching
        _, mark = _requests(sandbox, 0)
        for n in range(rounds):
            result.watches.append(sandbox.kube.reset_watches())
            reset = time.monotonic()
            sandbox.claim(NAMESPACE, f"r-{n}", "pool")
            _wait(lambda n=n: _bound(sandbox, f"r-{n}"), timeout, f"claim r-{n} bound")
            result.bound_seconds.append(time.monotonic() - reset)
            time.sleep(settle)
        counts, _ = _requests(sandbox, mark)
    result.lists = Counter(
        {k.split(" ", 1)[1]: v for k, v in counts.items() if k.startswith("list ")}
    )
    result.gets = Counter(
        {k.split(" ", 1)[1]: v for k, v in counts.items() if k.startswith("get ")}
    )
    return result


def format_result(result: ResetResult) -> str:
    """Return the figures as text."""
    lists = sum(result.lists.values())
    gets = sum(result.gets.values())
    seconds = sorted(result.bound_seconds)
    return (
        f"(i) watch connections reset (TCP RST) {result.rounds} times, {result.claims} bound "
        f"claims; watches cut per reset: {', '.join(map(str, result.watches))}\n"
        f"  LIST requests: {lists} in all, {lists / result.rounds:.1f} per reset "
        f"({_by_resource(result.lists)})\n"
        f"  GET requests: {gets} in all, {gets / result.rounds:.1f} per reset, one claim "
        f"allocated per reset ({_by_resource(result.gets)})\n"
        f"  reset -> a claim created then bound: median {seconds[len(seconds) // 2]:.2f} s, "
        f"max {seconds[-1]:.2f} s"
    )


def _by_resource(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
