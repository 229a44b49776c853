"""API writes of the whole operator: per allocation, per release, per waiting claim-minute.

The operator (real kopf, `mock_kubernetes.sandbox.Sandbox`) talks to the emulated Kubernetes
API over HTTP; every request it sends is in the emulator's access log
(``sandbox.kube.access_log``). The benchmark's own objects are written directly into the
store (``kube.call``), never over HTTP, so the log holds the operator's requests only. A write
is a ``create``, ``update`` (PUT), ``patch``, ``delete`` or ``deletecollection`` request,
counted when it is sent (a refused or conflicting write counts too).

Timing settings are the production defaults (requeue of waiting claims, pool refresh,
resync), so that waiting claims cost what they cost in a cluster; only the backend retry
budget is the sandbox's short one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import CREDENTIALS, SUBNET_ID, seed_for
from bridge.capi import Reason
from bridge.settings import Settings
from mock_kubernetes.auth import AccessRecord
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["RESOURCES", "PhaseWrites", "WritesResult", "run_writes_bench"]

#: The columns of the table, in order; ``other`` collects anything else.
RESOURCES = (
    "ipaddressclaims",
    "ipaddressclaims/status",
    "ipaddresses",
    "pools",
    "secrets",
    "events",
    "other",
)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

ALLOC_NAMESPACE = "bench"
EXHAUSTED_NAMESPACE = "wait-exhausted"
PAUSED_NAMESPACE = "wait-paused"
#: A /30 without a gateway row: two usable addresses, taken by two claims before the wait.
TINY_SUBNET: dict[str, Any] = {"id": 9, "cidr": "10.99.0.0/30"}
PAUSED_SUBNET: dict[str, Any] = {"id": 10, "cidr": "10.98.0.0/24", "gateway": "10.98.0.1"}
CLUSTERS = "cluster.x-k8s.io/v1beta2"

#: Production timing for everything that decides how often a claim or pool is looked at.
_PRODUCTION_TIMING = (
    "requeue_seconds",
    "requeue_exhausted_seconds",
    "pool_refresh_seconds",
    "resync_seconds",
)
SETTINGS = {
    f"IPAM_BRIDGE_{name.upper()}": str(Settings.model_fields[name].default)
    for name in _PRODUCTION_TIMING
}


def resource_of(record: AccessRecord) -> str:
    """The table column of one request: ``pools`` for every pool kind and its status."""
    if record.resource.endswith("ippools"):
        return "pools"
    name = f"{record.resource}/{record.subresource}" if record.subresource else record.resource
    return name if name in RESOURCES else "other"


@dataclass
class PhaseWrites:
    """The operator's API writes and the backend's requests of one phase.

    ``units`` is what the figures are divided by: claims for allocation and release,
    claim-minutes for waiting.
    """

    label: str
    units: float
    unit: str
    writes: Counter[str] = field(default_factory=Counter)  # by column
    verbs: Counter[str] = field(default_factory=Counter)  # by "verb resource"
    backend: int = 0
    seconds: float = 0.0

    def per_unit(self, column: str | None = None) -> float:
        """Writes per unit, all of them or one column's."""
        total = sum(self.writes.values()) if column is None else self.writes[column]
        return total / self.units if self.units else float("nan")

    @property
    def backend_per_unit(self) -> float:
        return self.backend / self.units if self.units else float("nan")


@dataclass
class WritesResult:
    """All phases of one run, plus the writes outside the watched namespaces while waiting."""

    claims: int
    waiting: int
    wait_seconds: float
    phases: list[PhaseWrites] = field(default_factory=list)
    outside_while_waiting: Counter[str] = field(default_factory=Counter)


class _Log:
    """The operator's write requests, read from the emulator's access log by position."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._log = sandbox.kube.access_log
        self._user = sandbox.identity.user.name

    def mark(self) -> int:
        return len(self._log.records())

    def writes(self, since: int, until: int | None = None) -> list[AccessRecord]:
        records = self._log.records()[since:until]
        return [
            r
            for r in records
            if r.via == "request" and r.user == self._user and r.verb in WRITE_VERBS
        ]

    def settle(self, *, quiet: float = 1.5, cap: float = 30.0) -> None:
        """Wait until no write request came for ``quiet`` seconds (at most ``cap``)."""
        deadline = time.monotonic() + cap
        count, since = len(self.writes(0)), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = len(self.writes(0))
            if now != count:
                count, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return


def _fill(phase: PhaseWrites, records: list[AccessRecord]) -> PhaseWrites:
    for r in records:
        phase.writes[resource_of(r)] += 1
        sub = f"/{r.subresource}" if r.subresource else ""
        phase.verbs[f"{r.verb} {r.resource}{sub}"] += 1
    return phase


def _wait(check: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{message} after {timeout}s")
        time.sleep(0.05)


def _phpipam_pool(sandbox: Sandbox, namespace: str, server: MockPhpipamServer, subnet: int) -> None:
    sandbox.namespace(namespace)
    sandbox.phpipam_pool(
        namespace, "pool", endpoint=server.url, subnet_id=subnet, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(namespace, "pool")


def _seed(subnet: dict[str, Any]) -> dict[str, Any]:
    seed = seed_for(1)
    seed["sections"][0]["subnets"] = [dict(subnet)]
    return seed


def _alloc_and_release(
    sandbox: Sandbox, log: _Log, server: MockPhpipamServer, claims: int, timeout: float
) -> list[PhaseWrites]:
    _phpipam_pool(sandbox, ALLOC_NAMESPACE, server, SUBNET_ID)
    log.settle()
    server.store.clear_journal()
    mark, start = log.mark(), time.monotonic()
    for i in range(claims):
        sandbox.claim(ALLOC_NAMESPACE, f"m-{i:04d}", "pool")
    sandbox.wait_claims_bound(ALLOC_NAMESPACE, claims, timeout=timeout)
    log.settle()
    alloc = _fill(PhaseWrites("allocation", claims, "claim"), log.writes(mark))
    alloc.backend, alloc.seconds = len(server.store.requests()), time.monotonic() - start

    server.store.clear_journal()
    mark, start = log.mark(), time.monotonic()
    for i in range(claims):
        sandbox.delete_claim(ALLOC_NAMESPACE, f"m-{i:04d}")
    sandbox.wait_gone(ALLOC_NAMESPACE, timeout=timeout)
    log.settle()
    release = _fill(PhaseWrites("release", claims, "claim"), log.writes(mark))
    release.backend, release.seconds = len(server.store.requests()), time.monotonic() - start
    return [alloc, release]


def _prepare_waiting(
    sandbox: Sandbox,
    exhausted: MockPhpipamServer,
    paused: MockPhpipamServer,
    waiting: int,
    timeout: float,
) -> None:
    """Claims on a full pool (reason PoolExhausted) and claims of a paused Cluster."""
    _phpipam_pool(sandbox, EXHAUSTED_NAMESPACE, exhausted, TINY_SUBNET["id"])
    for name in ("full-0", "full-1"):
        sandbox.claim(EXHAUSTED_NAMESPACE, name, "pool")
    sandbox.wait_claims_bound(EXHAUSTED_NAMESPACE, 2, timeout=timeout)
    names = [f"w-{i:04d}" for i in range(waiting)]
    for name in names:
        sandbox.claim(EXHAUSTED_NAMESPACE, name, "pool")

    def all_exhausted() -> bool:
        reasons = {
            c["metadata"]["name"]: sandbox.ready(c)[1] for c in sandbox.claims(EXHAUSTED_NAMESPACE)
        }
        return all(reasons.get(n) == Reason.POOL_EXHAUSTED for n in names)

    _wait(all_exhausted, timeout, f"{waiting} claims with reason {Reason.POOL_EXHAUSTED}")

    _phpipam_pool(sandbox, PAUSED_NAMESPACE, paused, PAUSED_SUBNET["id"])
    sandbox.create(
        {
            "apiVersion": CLUSTERS,
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": PAUSED_NAMESPACE},
            "spec": {"paused": True},
        }
    )
    for i in range(waiting):
        sandbox.claim(PAUSED_NAMESPACE, f"p-{i:04d}", "pool", cluster="c1")


def run_writes_bench(
    claims: int, waiting: int, wait_seconds: float, *, timeout: float = 180.0
) -> WritesResult:
    """Count the operator's API writes (and phpIPAM requests) in each phase.

    1. ``claims`` claims created at once, until all are bound and the writes stop;
    2. the same claims deleted at once, until they and their IPAddresses are gone and the
       writes stop;
    3. ``waiting`` claims on an exhausted pool and ``waiting`` claims of a paused Cluster,
       in two namespaces of their own, observed for ``wait_seconds`` once settled; the
       figures are per claim and per minute.

    Raises
    ------
    TimeoutError
        When claims are not bound, gone or waiting within ``timeout`` seconds.
    """
    result = WritesResult(claims, waiting, wait_seconds)
    with (
        MockPhpipamServer(Store(seed_for(claims))) as main,
        MockPhpipamServer(Store(_seed(TINY_SUBNET))) as exhausted,
        MockPhpipamServer(Store(_seed(PAUSED_SUBNET))) as paused,
        Sandbox(settings=SETTINGS) as sandbox,
    ):
        log = _Log(sandbox)
        result.phases += _alloc_and_release(sandbox, log, main, claims, timeout)

        _prepare_waiting(sandbox, exhausted, paused, waiting, timeout)
        time.sleep(2.0)  # the operator sees the paused claims (and writes nothing for them)
        log.settle(cap=10.0)
        for server in (exhausted, paused):
            server.store.clear_journal()
        mark = log.mark()
        time.sleep(wait_seconds)
        records = log.writes(mark)
        claim_minutes = waiting * wait_seconds / 60.0
        for label, namespace, server in (
            ("waiting: exhausted pool", EXHAUSTED_NAMESPACE, exhausted),
            ("waiting: paused Cluster", PAUSED_NAMESPACE, paused),
        ):
            phase = _fill(
                PhaseWrites(label, claim_minutes, "claim-minute"),
                [r for r in records if r.namespace == namespace],
            )
            phase.backend, phase.seconds = len(server.store.requests()), wait_seconds
            result.phases.append(phase)
        for r in records:
            if r.namespace not in (EXHAUSTED_NAMESPACE, PAUSED_NAMESPACE):
                sub = f"/{r.subresource}" if r.subresource else ""
                result.outside_while_waiting[f"{r.verb} {r.resource}{sub}"] += 1
    return result
