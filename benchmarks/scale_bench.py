"""Scale: ``pools`` pools of ``per_pool`` claims each, allocated, restarted, released.

On 127.0.0.1: the emulated API server and one mock phpIPAM (one subnet per pool) in this
process, the operator in a process of its own (`benchmarks.operator_process`, logging at
its default level, INFO, to a file) with ``IPAM_BRIDGE_WORKERS=16`` and the production
defaults of every other setting (pool refresh 60 s, resync and drift audit every 300 s).

1. **allocation**: the pools are made Ready, then every claim is created (as fast as this
   process can, one after the other); measured: seconds from the first create to the last
   claim's status write (the emulator's access log), claims/s, the operator's CPU
   milliseconds per claim (``/proc``), its peak RSS (``VmHWM``).
2. **restart with all bound**: the operator stops (SIGTERM) and a new one starts; a new
   claim is created at once. Measured: seconds from the new process's start to the new
   claim bound, phpIPAM writes meanwhile and in the next seconds (the new claim's
   first-free is 1; every bound claim must cost 0), its RSS and peak.
3. **release**: every claim is deleted; seconds until the last IPAddress deleted and every
   claim gone, releases/s, CPU per claim, and the peak RSS of the restarted operator
   through restart and release.

Figures only; nothing passes or fails.
"""

from __future__ import annotations

import ipaddress
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import CREDENTIALS
from benchmarks.operator_process import OperatorProcess
from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["ScaleResult", "format_result", "run_scale_bench"]

NAMESPACE = "scale"
FIRST_SUBNET_ID = 100
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: The production defaults of what `mock_kubernetes.sandbox.FAST_SETTINGS` shortens.
PRODUCTION = {
    "IPAM_BRIDGE_WORKERS": "16",
    "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "60",
    "IPAM_BRIDGE_REQUEUE_SECONDS": "10",
    "IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "60",
    "IPAM_BRIDGE_REQUEUE_EXHAUSTED_SECONDS": "5",
    "IPAM_BRIDGE_RETRY_ATTEMPTS": "5",
    "IPAM_BRIDGE_RETRY_MAX_DELAY_SECONDS": "5",
    "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "30",
    "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "10",
}


@dataclass
class ScalePhase:
    """One phase: ``claims`` claims in ``seconds``, the operator's CPU seconds meanwhile."""

    label: str
    claims: int
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def per_second(self) -> float:
        """Claims per second."""
        return self.claims / self.seconds if self.seconds else float("nan")


@dataclass
class ScaleResult:
    """Figures of one scale run (see the module docstring)."""

    pools: int
    per_pool: int
    pools_ready_seconds: float = 0.0
    allocation: ScalePhase | None = None
    release: ScalePhase | None = None
    alloc_peak_mib: float = 0.0
    restart_seconds: float = 0.0
    restart_ipam_writes: int = 0
    restart_ipam_writes_after: int = 0
    restart_api: Counter[str] = field(default_factory=Counter)
    restart_rss_mib: float = 0.0
    restart_peak_mib: float = 0.0
    release_peak_mib: float = 0.0
    logs: Path | None = None

    @property
    def claims(self) -> int:
        """All claims of the run."""
        return self.pools * self.per_pool


def _seed(pools: int, per_pool: int) -> dict[str, Any]:
    """A mock phpIPAM seed: one subnet per pool (ids from `FIRST_SUBNET_ID`), room for all."""
    size = max(24, 32 - (per_pool + 8).bit_length())
    base = ipaddress.IPv4Network("10.0.0.0/8")
    subnets = []
    for i, network in enumerate(base.subnets(new_prefix=size)):
        if i == pools:
            break
        subnets.append(
            {
                "id": FIRST_SUBNET_ID + i,
                "cidr": str(network),
                "gateway": str(network.network_address + 1),
            }
        )
    return {
        "users": [dict(CREDENTIALS)],
        "apps": [{"id": "capi", "permissions": 2, "security": "none"}],
        "sections": [{"id": 3, "name": "scale", "subnets": subnets}],
    }


class _Log:
    """The operator's requests in the emulator's access log from the moment this was made."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.user = sandbox.identity.user.name
        self.mark = len(sandbox.kube.access_log.records())

    def new(self) -> list[Any]:
        """Return the operator's requests since this was made."""
        records = self.sandbox.kube.access_log.records()
        return [r for r in records[self.mark :] if r.via == "request" and r.user == self.user]

    def wait(self, key: str, count: int, timeout: float) -> None:
        """Wait until the operator sent ``count`` requests ``"verb resource[/sub]"`` since then."""
        seen, position = 0, self.mark
        deadline = time.monotonic() + timeout
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen}/{count} {key} requests after {timeout}s")
            records = self.sandbox.kube.access_log.records()
            seen += sum(
                1
                for r in records[position:]
                if r.via == "request"
                and r.user == self.user
                and f"{r.verb} {r.resource_path}" == key
            )
            position = len(records)
            time.sleep(0.25)


def _pools_ready(sandbox: Sandbox, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        sandbox.wait_pool_ready(NAMESPACE, name, timeout=max(1.0, deadline - time.monotonic()))


def _names(pools: int, per_pool: int) -> list[tuple[str, str]]:
    return [(f"c-{p:03d}-{c:04d}", f"pool-{p:03d}") for p in range(pools) for c in range(per_pool)]


def _allocate(
    sandbox: Sandbox, operator: OperatorProcess, claims: list[tuple[str, str]], timeout: float
) -> ScalePhase:
    phase = ScalePhase("allocation", len(claims))
    log = _Log(sandbox)
    cpu = operator.cpu_seconds()
    start = time.monotonic()
    for name, pool in claims:
        sandbox.claim(NAMESPACE, name, pool)
    log.wait("patch ipaddressclaims/status", len(claims), timeout)
    phase.seconds = time.monotonic() - start
    phase.cpu = operator.cpu_seconds() - cpu
    return phase


def _restart(
    sandbox: Sandbox,
    phpipam: MockPhpipamServer,
    operator: OperatorProcess,
    result: ScaleResult,
    timeout: float,
    after: float,
) -> None:
    """Measure the restarted ``operator`` (just started) serving one new claim."""
    log = _Log(sandbox)
    sandbox.claim(NAMESPACE, "new", "pool-000")
    deadline = time.monotonic() + timeout
    while not (sandbox.get_claim(NAMESPACE, "new") or {}).get("status", {}).get("addressRef"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the new claim not bound {timeout}s after the restart")
        time.sleep(0.05)
    result.restart_seconds = time.monotonic() - operator.started
    result.restart_rss_mib = operator.memory_mib().get("VmRSS", 0.0)
    result.restart_ipam_writes = len(phpipam.store.requests(writes_only=True))
    time.sleep(after)
    result.restart_ipam_writes_after = (
        len(phpipam.store.requests(writes_only=True)) - result.restart_ipam_writes
    )
    result.restart_api = Counter(f"{r.verb} {r.resource_path}" for r in log.new())
    result.restart_peak_mib = operator.memory_mib().get("VmHWM", 0.0)


def _release(
    sandbox: Sandbox, operator: OperatorProcess, names: list[str], timeout: float
) -> ScalePhase:
    phase = ScalePhase("release", len(names))
    log = _Log(sandbox)
    cpu = operator.cpu_seconds()
    start = time.monotonic()
    for name in names:
        sandbox.delete_object(f"{GROUP}/{sandbox.version}", "ipaddressclaims", name, NAMESPACE)
    log.wait("delete ipaddresses", len(names), timeout)
    log.wait("patch ipaddressclaims", len(names), timeout)  # the finalizers: listing is dear
    sandbox.wait_gone(NAMESPACE, timeout=timeout)
    phase.seconds = time.monotonic() - start
    phase.cpu = operator.cpu_seconds() - cpu
    return phase


def run_scale_bench(
    pools: int = 100, per_pool: int = 100, *, timeout: float = 1800.0, after: float = 10.0
) -> ScaleResult:
    """Allocate, restart with all bound, and release ``pools`` x ``per_pool`` claims.

    ``after``: seconds after the new claim is bound during which the restarted operator's
    IPAM writes are still counted.

    Raises
    ------
    TimeoutError
        When a phase does not end within ``timeout`` seconds.
    """
    result = ScaleResult(pools, per_pool)
    workdir = Path(tempfile.mkdtemp(prefix="ipam-bridge-scale-"))
    result.logs = workdir
    claims = _names(pools, per_pool)
    pool_names = [f"pool-{p:03d}" for p in range(pools)]
    with (
        MockPhpipamServer(Store(_seed(pools, per_pool))) as phpipam,
        Sandbox(settings=PRODUCTION, start_operator=False) as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        for i, name in enumerate(pool_names):
            sandbox.phpipam_pool(
                NAMESPACE,
                name,
                endpoint=phpipam.url,
                subnet_id=FIRST_SUBNET_ID + i,
                credentials=CREDENTIALS,
            )
        with OperatorProcess(log_level=None, log=workdir / "operator-1.log") as operator:
            _pools_ready(sandbox, pool_names, timeout)
            result.pools_ready_seconds = time.monotonic() - operator.started
            result.allocation = _allocate(sandbox, operator, claims, timeout)
            result.alloc_peak_mib = operator.memory_mib().get("VmHWM", 0.0)
        phpipam.store.clear_journal()
        with OperatorProcess(log_level=None, log=workdir / "operator-2.log") as operator:
            _restart(sandbox, phpipam, operator, result, timeout, after)
            names = [name for name, _ in claims] + ["new"]
            result.release = _release(sandbox, operator, names, timeout)
            result.release_peak_mib = operator.memory_mib().get("VmHWM", 0.0)
    return result


def format_result(result: ScaleResult) -> str:
    """Return the figures as text."""
    alloc, release = result.allocation, result.release
    assert alloc is not None and release is not None
    writes = sum(v for k, v in result.restart_api.items() if k.split(" ", 1)[0] in WRITE_VERBS)
    api = ", ".join(f"{k} {v}" for k, v in sorted(result.restart_api.items())) or "none"
    return (
        f"(g) scale: {result.pools} pools x {result.per_pool} claims = {result.claims} claims, "
        "one mock phpIPAM (a subnet per pool), the operator in its own process "
        "(IPAM_BRIDGE_WORKERS=16, production defaults, INFO logs to a file); pools Ready "
        f"{result.pools_ready_seconds:.1f} s after its start\n"
        f"  allocation: all {alloc.claims} bound in {alloc.seconds:.1f} s "
        f"({alloc.per_second:.1f}/s), operator CPU {1000 * alloc.cpu / alloc.claims:.2f} ms "
        f"per claim, peak RSS {result.alloc_peak_mib:.0f} MiB\n"
        f"  restart with {result.claims} bound: new claim bound {result.restart_seconds:.1f} s "
        f"after the process start; phpIPAM writes until then {result.restart_ipam_writes} "
        f"(the new claim's first-free is 1), in the next seconds "
        f"{result.restart_ipam_writes_after}; RSS then {result.restart_rss_mib:.0f} MiB, peak "
        f"{result.restart_peak_mib:.0f} MiB; API requests ({writes} writes): {api}\n"
        f"  release: all {release.claims} released in {release.seconds:.1f} s "
        f"({release.per_second:.1f}/s), operator CPU {1000 * release.cpu / release.claims:.2f} "
        f"ms per claim; peak RSS of the restarted operator through restart and release "
        f"{result.release_peak_mib:.0f} MiB\n"
        f"  operator logs: {result.logs}"
    )
