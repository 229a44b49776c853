"""The hot path of a claim: requests per allocation and release, rate vs the raw IPAM, a profile.

One run, on 127.0.0.1, in this process (issue 15, "measure first"):

1. **raw IPAM rate**: `backends.phpipam.PHPIPAMBackend` alone against a mock phpIPAM, with
   as many threads as the operator has workers: allocations/s (search + first-free) and
   releases/s. This is the ceiling the operator is compared with.
2. **the operator**: the real kopf operator, in a process of its own
   (`benchmarks.operator_process`, as in a pod) against the emulated API
   (`mock_kubernetes.sandbox.Sandbox`) served from this process, with
   ``IPAM_BRIDGE_WORKERS`` = that parallelism binds ``claims`` claims created at once, then
   releases them. Every request the operator sends to the emulated API is in the emulator's
   access log: counted per allocation and per release by verb (get, list, watch, create,
   patch, update, delete) and resource; the mock's journal counts the IPAM requests.
3. **profile**: a wall-clock sampler (`benchmarks.sampler.Sampler`) of the operator's worker
   threads and event loop, in the operator's process, while the claims are bound: where a
   claim's time goes.

Figures only; nothing passes or fails.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

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
    phases: list[Phase] = field(default_factory=list)
    profile: list[tuple[str, float]] = field(default_factory=list)
    idle_share: float = 0.0


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


def run_hot_path(
    claims: int,
    workers: int,
    *,
    latency_ms: float = 0.0,
    api_ms: tuple[float, float] = (0.0, 0.0),
    timeout: float = 180.0,
    profile: bool = True,
    settings: dict[str, str] | None = None,
) -> HotPathResult:
    """Measure the raw IPAM rate, then the operator's allocations and releases (see module).

    ``latency_ms`` is added by the mock phpIPAM before every answer, in both parts (a real
    phpIPAM answers in tens of milliseconds); ``api_ms`` (reads, writes) is added by the
    emulated API server before each answer of the operator's get/list and
    create/patch/update/delete requests (`mock_kubernetes.emulator.KubeEmulator.latency`: a
    real kube-apiserver answers reads in milliseconds, writes after an etcd commit);
    ``settings`` adds ``IPAM_BRIDGE_*`` variables.

    Raises
    ------
    TimeoutError
        When the claims are not all bound (or gone) within ``timeout`` seconds.
    """
    result = HotPathResult(claims, workers, latency_ms, api_ms)
    # The operator drives the IPAM with at most its endpoint slots (half the workers by
    # default): the raw client gets that many threads.
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
    profile_file = Path(tempfile.mkdtemp(prefix="ipam-bridge-bench-")) / "profile.json"
    with (
        MockPhpipamServer(Store(seed_for(claims))) as phpipam,
        Sandbox(settings=settings, start_operator=False) as sandbox,
        OperatorProcess(profile=profile_file if profile else None) as operator,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=60)
        _settle(sandbox)
        phpipam.faults.update(latency_seconds=latency_ms / 1000)
        read, write = api_ms[0] / 1000, api_ms[1] / 1000
        sandbox.kube.handler.latency.update(
            {verb: read for verb in ("get", "list")} | {verb: write for verb in WRITE_VERBS}
        )
        phpipam.store.clear_journal()
        _, mark = _requests(sandbox, 0)
        names = [f"m-{i:05d}" for i in range(claims)]
        alloc = Phase("allocation", claims)
        operator.start_profile()
        start = time.monotonic()
        for name in names:
            sandbox.claim(NAMESPACE, name, "pool")
        _wait_requests(sandbox, mark, "patch ipaddressclaims/status", claims, start + timeout)
        deadline = start + timeout
        while True:
            done = sum(1 for c in sandbox.claims(NAMESPACE) if _bound(c))
            if done >= claims:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{done}/{claims} claims bound after {timeout}s")
            time.sleep(0.02)
        alloc.seconds = time.monotonic() - start
        found = operator.stop_profile()
        result.profile = [(str(p), float(v)) for p, v in found.get("top", [])]
        result.idle_share = float(found.get("idle", 0.0))
        _settle(sandbox)
        records, mark = _requests(sandbox, mark)
        alloc.api.update(_api_key(r) for r in records)
        alloc.ipam = classify(phpipam.store.requests())

        phpipam.store.clear_journal()
        release = Phase("release", claims)
        start = time.monotonic()
        for name in names:
            sandbox.delete_object(f"{GROUP}/{sandbox.version}", "ipaddressclaims", name, NAMESPACE)
        _wait_requests(sandbox, mark, "delete ipaddresses", claims, start + timeout)
        sandbox.wait_gone(NAMESPACE, timeout=timeout)
        release.seconds = time.monotonic() - start
        _settle(sandbox)
        records, mark = _requests(sandbox, mark)
        release.api.update(_api_key(r) for r in records)
        release.ipam = classify(phpipam.store.requests())
        result.phases = [alloc, release]
    return result
