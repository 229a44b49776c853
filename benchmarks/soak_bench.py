"""Soak: a compressed day of churn against the operator; its memory at start and end.

Each round (an "hour") uses a namespace of its own: a pool is created and changed, claims
wait for a pool that does not exist yet (parked under its wake token), claims are created
and bound, the missing pool is created (waking the waiting claims), then every claim and
both pools are deleted and the round's Events dropped. The emulated Kubernetes API and
mock_phpipam run on 127.0.0.1 in the benchmark's process.

Figures only, after the first round (the start: imports and first allocations done) and
after the last: the size of every in-memory structure of the operator
(`bridge.operator.Operator.sizes`, the cache's expectations included) with the operator in this
process, and the resident set size (``VmRSS``) of the operator run in a process of its own
(`benchmarks.operator_process`, as in a pod), plus this process's RSS in the first run
(emulator and mock included).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import CREDENTIALS, SUBNET_ID, seed_for, table
from benchmarks.operator_process import OperatorProcess
from bridge.operator import NoQueue, Operator
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["SoakResult", "format_result", "run_soak_bench"]

POOL_VERSION = "v1alpha1"


@dataclass
class SoakResult:
    """Memory and structure sizes after the first and the last round of a soak."""

    rounds: int
    claims_per_round: int
    waiting_per_round: int
    seconds: float = 0.0
    rss_start_kib: int = 0
    rss_end_kib: int = 0
    start: dict[str, int] = field(default_factory=dict)
    end: dict[str, int] = field(default_factory=dict)
    operator_rss_start_mib: float = 0.0
    operator_rss_end_mib: float = 0.0

    @property
    def rss_growth(self) -> float:
        """This process's RSS growth from start to end, as a share of the start (0.05: 5 %)."""
        return (self.rss_end_kib - self.rss_start_kib) / self.rss_start_kib

    @property
    def operator_rss_growth(self) -> float:
        """The operator process's RSS growth from start to end, as a share of the start."""
        return (self.operator_rss_end_mib - self.operator_rss_start_mib) / (
            self.operator_rss_start_mib
        )


def rss_kib() -> int:
    """Return this process's resident set size in KiB (Linux ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def operator_context() -> Operator:
    """Return the running `Operator` (kept in kopf's memo, found by the GC)."""
    found = [
        o for o in gc.get_objects() if isinstance(o, Operator) and not isinstance(o.queue, NoQueue)
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one running operator context, found {len(found)}")
    return found[0]


def settled(ctx: Operator, timeout: float = 30.0) -> dict[str, int]:
    """Return `sizes` once the queue is idle and the caches hold no claim or address.

    The watches report the round's deletions a little after the API server made them; a
    structure still not empty after ``timeout`` seconds is reported as it is.
    """

    def quiet() -> dict[str, int] | None:
        found = sizes(ctx)
        busy = ("queue.processing", "queue.queued", "cache.claims", "cache.addresses")
        return None if any(found[k] for k in busy) else found

    try:
        return dict(wait_for(quiet, timeout=timeout, interval=0.1, message="a quiet operator"))
    except TimeoutError:
        return sizes(ctx)


def sizes(ctx: Operator) -> dict[str, int]:
    """Return `Operator.sizes` (every structure, the cache's expectations included)."""
    return ctx.sizes()


def _pool(sandbox: Sandbox, phpipam: MockPhpipamServer, namespace: str, name: str) -> None:
    sandbox.phpipam_pool(
        namespace, name, endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )


def _round(
    sandbox: Sandbox, phpipam: MockPhpipamServer, index: int, claims: int, waiting: int
) -> None:
    """One hour of churn in namespace ``soak-<index>`` (see the module docstring)."""
    ns = f"soak-{index}"
    sandbox.namespace(ns)
    _pool(sandbox, phpipam, ns, "pool")
    for i in range(waiting):
        sandbox.claim(ns, f"w-{i}", "later")
    sandbox.wait_pool_ready(ns, "pool")
    for i in range(claims):
        sandbox.claim(ns, f"m-{i}", "pool")
    sandbox.kube.patch(
        f"ipam.cluster.x-k8s.io/{POOL_VERSION}",
        "phpipamippools",
        "pool",
        {"metadata": {"labels": {"changed": str(index)}}},
        ns,
    )
    sandbox.wait_claims_bound(ns, claims)
    _pool(sandbox, phpipam, ns, "later")
    sandbox.wait_claims_bound(ns, claims + waiting)
    for claim in sandbox.claims(ns):
        sandbox.delete_claim(ns, claim["metadata"]["name"])
    sandbox.wait_gone(ns)
    for name in ("pool", "later"):
        sandbox.delete_pool(ns, name)
    wait_for(
        lambda: sandbox.pool(ns, "pool") is None and sandbox.pool(ns, "later") is None,
        timeout=sandbox.wait_timeout,
        message="the round's pools gone",
    )
    for event in sandbox.events(ns):
        sandbox.delete_object("v1", "events", event["metadata"]["name"], ns)
    phpipam.store.clear_journal()


def run_soak_bench(rounds: int = 24, claims: int = 20, waiting: int = 5) -> SoakResult:
    """Run the churn twice: structures in process, then the operator's RSS in a process.

    First with the operator in this process (`mock_kubernetes.sandbox.Sandbox`), for the
    size of its structures (and this process's RSS, emulator and mock included); then with
    the operator in a process of its own (`benchmarks.operator_process`), as in a pod, for
    its own RSS. Each after the first round and after the last.

    Raises
    ------
    TimeoutError
        When a round does not converge (claims bound, released, pools gone) in time.
    """
    result = SoakResult(rounds, claims, waiting)
    started = time.monotonic()
    seed = seed_for(2 * (claims + waiting))
    with MockPhpipamServer(Store(seed)) as phpipam, Sandbox() as sandbox:
        ctx = operator_context()
        for index in range(rounds):
            _round(sandbox, phpipam, index, claims, waiting)
            if index == 0:
                result.start = settled(ctx)
                gc.collect()
                result.rss_start_kib = rss_kib()
        result.end = settled(ctx)
        gc.collect()
        result.rss_end_kib = rss_kib()
    with (
        MockPhpipamServer(Store(seed)) as phpipam,
        Sandbox(start_operator=False) as sandbox,
        OperatorProcess() as operator,
    ):
        for index in range(rounds):
            _round(sandbox, phpipam, index, claims, waiting)
            if index == 0:
                result.operator_rss_start_mib = operator.memory_mib()["VmRSS"]
        result.operator_rss_end_mib = operator.memory_mib()["VmRSS"]
    result.seconds = time.monotonic() - started
    return result


def format_result(result: SoakResult) -> str:
    """Return the soak's figures as text: RSS at start and end, and each structure's size."""
    rows = [
        [name, str(result.start.get(name, "")), str(result.end.get(name, ""))]
        for name in sorted(set(result.start) | set(result.end))
    ]
    return (
        f"soak: {result.rounds} rounds of {result.claims_per_round} claims + "
        f"{result.waiting_per_round} waiting for a pool created later, 2 pools per round "
        f"(created, changed, deleted), in {result.seconds:.0f} s\n"
        f"operator process RSS after round 1: {result.operator_rss_start_mib:.1f} MiB; after "
        f"round {result.rounds}: {result.operator_rss_end_mib:.1f} MiB "
        f"({result.operator_rss_growth:+.1%})\n"
        f"operator in the benchmark's process (emulator and mock included): RSS "
        f"{result.rss_start_kib / 1024:.1f} MiB, then {result.rss_end_kib / 1024:.1f} MiB "
        f"({result.rss_growth:+.1%})\n\n"
        + table(["structure", "after round 1", f"after round {result.rounds}"], rows)
    )
