"""The hot path of a claim: CPU and requests per allocation and release, against bare clients.

One run, on 127.0.0.1 (the emulated API server and the mock phpIPAM in this process, every
client in a process of its own):

1. **raw IPAM rate**: `backends.phpipam.PHPIPAMBackend` alone against a mock phpIPAM, with
   as many threads as the operator has endpoint slots: allocations/s (search + first-free)
   and releases/s.
2. **bare contract client** (`benchmarks.bare_client`): the same phpIPAM requests plus the
   3 API writes of an allocation (claim finalizer, IPAddress, claim status) and of a release
   (IPAddress finalizer, IPAddress delete, claim finalizer), against the same emulated API
   and mock, same threads: claims/s and its process's CPU seconds per claim. The figure
   the operator is compared with.
3. **the operator**: the real kopf operator in a process of its own
   (`benchmarks.operator_process`, as in a pod, logging at its default level, INFO, to a
   file; ``$BENCH_HOT_LOG_LEVEL`` sets another ``IPAM_BRIDGE_LOG_LEVEL``) with
   ``IPAM_BRIDGE_WORKERS`` workers binds ``claims`` claims created at once, then releases
   them: claims/s, its process's CPU seconds per claim (user + system, from
   ``/proc``, from the first create to the last write settled) and the share of its main
   thread (kopf's event loop: watch events, handlers, the work queue's dispatch; the
   reconciles run in worker threads), API requests by verb (the
   emulator's access log) and IPAM requests (the mock's journal) per claim.
4. **profile**: the same again under yappi (CPU clock, every thread of the operator's
   process): per phase, the functions with the most cumulative and own CPU, and own CPU
   by package. The profiler slows the operator: its run gives no figures but the profile.
   ``$BENCH_HOT_PROFILER=cpu-sampler`` samples stacks weighted by thread CPU instead
   (`benchmarks.sampler.CpuSampler`): no per-call cost, but a thread's CPU goes to where it
   stands when sampled, often a blocking call.

Figures only; nothing passes or fails.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bare_client import BareClient, BarePhase
from benchmarks.client_bench import ClientResult, run_client_bench
from benchmarks.common import CREDENTIALS, SUBNET_ID, classify, seed_for
from benchmarks.operator_process import OperatorProcess
from bridge.capi import GROUP, ready_of
from mock_kubernetes.auth import AccessRecord
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["HotPathResult", "run_hot_path"]

NAMESPACE = "hot"
READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class Phase:
    """API and IPAM requests of one phase (allocation or release) of ``claims`` claims."""

    label: str
    claims: int
    seconds: float = 0.0
    api: Counter[str] = field(default_factory=Counter)  # "verb resource[/sub]"
    ipam: Counter[str] = field(default_factory=Counter)  # "METHOD controller/action"
    cpu: float = 0.0  # the operator's CPU seconds (user + system) in the phase
    loop_cpu: float = 0.0  # of which its main thread's (kopf's event loop)
    profile: dict[str, Any] = field(default_factory=dict)  # yappi's (OperatorProcess)

    @property
    def cpu_ms(self) -> float:
        """The operator's CPU milliseconds per claim."""
        return 1000 * self.cpu / self.claims if self.claims else float("nan")

    @property
    def loop_cpu_ms(self) -> float:
        """The CPU milliseconds per claim of the operator's event loop (its main thread)."""
        return 1000 * self.loop_cpu / self.claims if self.claims else float("nan")

    @property
    def per_second(self) -> float:
        """Claims bound (or released) per second."""
        return self.claims / self.seconds if self.seconds else float("nan")

    def per_claim(self, verbs: frozenset[str]) -> float:
        """API requests per claim whose verb is in ``verbs``."""
        return sum(v for k, v in self.api.items() if k.split(" ", 1)[0] in verbs) / self.claims

    @property
    def ipam_per_claim(self) -> float:
        """IPAM requests per claim."""
        return sum(self.ipam.values()) / self.claims


@dataclass
class HotPathResult:
    """Figures of one run (see the module docstring)."""

    claims: int
    workers: int
    latency_ms: float = 0.0
    api_ms: tuple[float, float] = (0.0, 0.0)
    parallelism: int = 0
    raw: ClientResult | None = None
    bare: dict[str, BarePhase] = field(default_factory=dict)  # "allocation", "release"
    phases: list[Phase] = field(default_factory=list)
    profiled: list[Phase] = field(default_factory=list)  # the yappi run's phases
    idle_cpu_ms_per_s: float = 0.0  # the operator's CPU while nothing happens


def _api_key(record: AccessRecord) -> str:
    resource = record.resource
    if resource.endswith("ippools"):
        resource = "<pools>"
    sub = f"/{record.subresource}" if record.subresource else ""
    return f"{record.verb} {resource}{sub}"


def _bound(claim: dict[str, object]) -> bool:
    status = claim.get("status")
    return bool(
        isinstance(status, dict) and status.get("addressRef") and ready_of(claim)[0] == "True"
    )


def _requests(sandbox: Sandbox, since: int) -> tuple[list[AccessRecord], int]:
    records = sandbox.kube.access_log.records()
    user = sandbox.identity.user.name
    mine = [r for r in records[since:] if r.via == "request" and r.user == user]
    return mine, len(records)


def _wait_requests(sandbox: Sandbox, since: int, key: str, count: int, deadline: float) -> None:
    """Wait until the operator sent ``count`` requests ``key`` (``"verb resource[/sub]"``).

    Reads only the access log's new records at each look, which costs the emulator's process
    far less than listing the claims (that process also serves the operator).
    """
    user = sandbox.identity.user.name
    seen, position = 0, since
    while seen < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{seen}/{count} {key} requests")
        records = sandbox.kube.access_log.records()
        seen += sum(
            1
            for r in records[position:]
            if r.via == "request" and r.user == user and f"{r.verb} {r.resource_path}" == key
        )
        position = len(records)
        time.sleep(0.02)


def _settle(sandbox: Sandbox, quiet: float = 1.0, cap: float = 15.0) -> None:
    """Wait until the operator sent no API write for ``quiet`` seconds (at most ``cap``)."""
    deadline = time.monotonic() + cap
    count, since = len(sandbox.kube.access_log.records()), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = len(sandbox.kube.access_log.records())
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def _wait_bound(sandbox: Sandbox, claims: int, deadline: float) -> None:
    while True:
        done = sum(1 for c in sandbox.claims(NAMESPACE) if _bound(c))
        if done >= claims:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{done}/{claims} claims bound")
        time.sleep(0.02)


def _bare_run(
    sandbox: Sandbox, phpipam: MockPhpipamServer, claims: int, threads: int
) -> dict[str, BarePhase]:
    """Run the bare contract client on ``claims`` claims of its own (see the module)."""
    pool = sandbox.pool(NAMESPACE, "pool")
    assert pool is not None
    config = {
        "api": sandbox.kube.url,
        "token": sandbox.identity.token,
        "version": sandbox.version,
        "namespace": NAMESPACE,
        "pool": {"kind": "PHPIPAMIPPool", "name": "pool", "uid": pool["metadata"]["uid"]},
        "phpipam": phpipam.url,
        "subnet_id": SUBNET_ID,
        "threads": threads,
        **CREDENTIALS,
    }
    made = [sandbox.claim(NAMESPACE, f"b-{i:05d}", "pool") for i in range(claims)]
    pairs = [(c["metadata"]["name"], c["metadata"]["uid"]) for c in made]
    with BareClient(config) as bare:
        found = {"allocation": bare.run("allocate", pairs)}
        for name, _ in pairs:
            sandbox.delete_object(f"{GROUP}/{sandbox.version}", "ipaddressclaims", name, NAMESPACE)
        found["release"] = bare.run("release", pairs)
    sandbox.wait_gone(NAMESPACE, timeout=60)
    return found


def _operator_run(
    sandbox: Sandbox,
    phpipam: MockPhpipamServer,
    operator: OperatorProcess,
    names: list[str],
    *,
    timeout: float,
    profile: bool,
) -> list[Phase]:
    """Bind ``names`` (created at once), then release them; the two phases' figures."""
    claims = len(names)
    phpipam.store.clear_journal()
    _, mark = _requests(sandbox, 0)
    alloc = Phase("allocation", claims)
    cpu, loop = operator.cpu_seconds(), operator.loop_cpu_seconds()
    if profile:
        operator.start_profile()
    start = time.monotonic()
    for name in names:
        sandbox.claim(NAMESPACE, name, "pool")
    _wait_requests(sandbox, mark, "patch ipaddressclaims/status", claims, start + timeout)
    _wait_bound(sandbox, claims, start + timeout)
    alloc.seconds = time.monotonic() - start
    _settle(sandbox)
    alloc.cpu = operator.cpu_seconds() - cpu
    alloc.loop_cpu = operator.loop_cpu_seconds() - loop
    if profile:
        alloc.profile = operator.stop_profile()
    records, mark = _requests(sandbox, mark)
    alloc.api.update(_api_key(r) for r in records)
    alloc.ipam = classify(phpipam.store.requests())

    phpipam.store.clear_journal()
    release = Phase("release", claims)
    cpu, loop = operator.cpu_seconds(), operator.loop_cpu_seconds()
    if profile:
        operator.start_profile()
    start = time.monotonic()
    for name in names:
        sandbox.delete_object(f"{GROUP}/{sandbox.version}", "ipaddressclaims", name, NAMESPACE)
    # The access log first: listing the claims again and again would cost the emulator,
    # which serves the operator from this process, far more.
    _wait_requests(sandbox, mark, "delete ipaddresses", claims, start + timeout)
    _wait_requests(sandbox, mark, "patch ipaddressclaims", claims, start + timeout)
    sandbox.wait_gone(NAMESPACE, timeout=timeout)
    release.seconds = time.monotonic() - start
    _settle(sandbox)
    release.cpu = operator.cpu_seconds() - cpu
    release.loop_cpu = operator.loop_cpu_seconds() - loop
    if profile:
        release.profile = operator.stop_profile()
    records, mark = _requests(sandbox, mark)
    release.api.update(_api_key(r) for r in records)
    release.ipam = classify(phpipam.store.requests())
    return [alloc, release]


def under_load(
    sandbox: Sandbox,
    phpipam: MockPhpipamServer,
    since: int,
    latency_ms: float,
    api_ms: tuple[float, float],
) -> None:
    """Wait until a started operator serves the pool and watches, then turn the latencies on.

    ``since`` is the API server's access-log length before the operator started;
    ``latency_ms`` is added by the mock phpIPAM before every answer, ``api_ms`` (reads,
    writes) by the API server. Raises TimeoutError when the operator does not get there.
    """
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=60)
    _wait_watching(sandbox, since)
    _settle(sandbox)
    phpipam.faults.update(latency_seconds=latency_ms / 1000)
    read, write = api_ms[0] / 1000, api_ms[1] / 1000
    sandbox.kube.handler.latency.update(
        {verb: read for verb in ("get", "list")} | {verb: write for verb in WRITE_VERBS}
    )


def _wait_watching(sandbox: Sandbox, since: int, timeout: float = 60.0) -> None:
    """Wait until the operator (started after access-log record ``since``) watches claims.

    Its start-up is over then, and its signal handlers (the profiler's) are installed.
    """
    user = sandbox.identity.user.name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = sandbox.kube.access_log.records()[since:]
        if any(
            r.user == user and r.verb == "watch" and r.resource == "ipaddressclaims"
            for r in records
        ):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the operator does not watch claims after {timeout}s")


def _idle_cpu(operator: OperatorProcess, seconds: float = 2.0) -> float:
    """Return the operator's CPU milliseconds per second while nothing happens."""
    before = operator.cpu_seconds()
    time.sleep(seconds)
    return 1000 * (operator.cpu_seconds() - before) / seconds


def run_hot_path(
    claims: int,
    workers: int,
    *,
    latency_ms: float = 0.0,
    api_ms: tuple[float, float] = (0.0, 0.0),
    timeout: float = 180.0,
    profile: bool = True,
    settings: dict[str, str] | None = None,
    source: Path | None = None,
) -> HotPathResult:
    """Measure the raw IPAM, the bare client, the operator, and profile it (see the module).

    ``latency_ms`` is added by the mock phpIPAM before every answer, in every part (a real
    phpIPAM answers in tens of milliseconds); ``api_ms`` (reads, writes) is added by the
    emulated API server before each answer of get/list and create/patch/update/delete
    requests, the bare client's and the operator's alike
    (`mock_kubernetes.emulator.KubeEmulator.latency`: a real kube-apiserver answers reads
    in milliseconds, writes after an etcd commit); ``settings`` adds ``IPAM_BRIDGE_*``
    variables; ``profile`` False skips the yappi run; ``source`` runs the operator of another
    checkout (`benchmarks.operator_process.OperatorProcess`), the raw and bare clients staying
    this tree's.

    Raises
    ------
    TimeoutError
        When the claims are not all bound (or gone) within ``timeout`` seconds.
    """
    result = HotPathResult(claims, workers, latency_ms, api_ms)
    # The operator drives the IPAM with at most its endpoint slots (half the workers by
    # default): the raw and bare clients get that many threads.
    parallelism = int(
        (settings or {}).get("IPAM_BRIDGE_ENDPOINT_MAX_CONCURRENT") or max(1, workers // 2)
    )
    result.parallelism = parallelism
    result.raw = run_client_bench(claims, threads=parallelism, latency_ms=latency_ms)
    settings = {
        "IPAM_BRIDGE_WORKERS": str(workers),
        "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "3600",
        "IPAM_BRIDGE_RESYNC_SECONDS": "0",
        **(settings or {}),
    }
    workdir = Path(tempfile.mkdtemp(prefix="ipam-bridge-bench-"))
    with (
        MockPhpipamServer(Store(seed_for(claims))) as phpipam,
        Sandbox(settings=settings, start_operator=False) as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        since = len(sandbox.kube.access_log.records())
        with OperatorProcess(
            log_level=os.environ.get("BENCH_HOT_LOG_LEVEL"),
            log=workdir / "operator.log",
            source=source,
        ) as operator:
            under_load(sandbox, phpipam, since, latency_ms, api_ms)
            result.idle_cpu_ms_per_s = _idle_cpu(operator)
            names = [f"m-{i:05d}" for i in range(claims)]
            result.phases = _operator_run(
                sandbox, phpipam, operator, names, timeout=timeout, profile=False
            )
        # The bare client while no operator runs: nothing else sends requests.
        result.bare = _bare_run(sandbox, phpipam, claims, parallelism)
        if profile:
            since = len(sandbox.kube.access_log.records())
            with OperatorProcess(
                workdir / "profile.json",
                log_level=None,
                log=workdir / "operator-profiled.log",
                profiler=os.environ.get("BENCH_HOT_PROFILER", "yappi"),
            ) as operator:
                _wait_watching(sandbox, since)
                _settle(sandbox)
                names = [f"p-{i:05d}" for i in range(claims)]
                result.profiled = _operator_run(
                    sandbox, phpipam, operator, names, timeout=2 * timeout, profile=True
                )
    return result
