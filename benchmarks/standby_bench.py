"""A standby's memory under churn: RSS before and after ``claims`` claims created and deleted.

The operator runs as a standby in a process of its own (`benchmarks.operator_process`, as in
a pod: ``ipam-bridge run`` with leader election on), its informers watching the emulated
Kubernetes API of this process; the Lease ``ipam-bridge`` is held by another identity for an
hour, so it never leads. Claims of ours (a ``PHPIPAMIPPool`` poolRef; no pool is needed: a
standby reconciles nothing) are created and deleted straight in the emulator (no HTTP on the
benchmark's side), at most ``window`` alive at once; every one reaches the standby as an
ADDED and a DELETED watch event through its real informers, stores and sinks. Once its
claims watch has been idle for a while (it has seen everything), its RSS is read again.

With ``source`` (another checkout: ``git worktree add DIR main``), that tree's operator is
measured in the same way, for a comparison. Figures only; nothing passes or fails.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import table
from benchmarks.operator_process import OperatorProcess
from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox

__all__ = ["StandbyResult", "format_result", "run_standby_bench"]

NAMESPACE = "churn"
VERSION = "v1beta2"
#: Seconds the standby's claims watch must be idle to count as caught up.
SETTLED_SECONDS = 3.0


@dataclass
class StandbyResult:
    """RSS of a standby before and after a churn of ``claims`` claims (MiB)."""

    label: str
    claims: int
    window: int
    churn_seconds: float = 0.0
    caught_up_seconds: float = 0.0
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    peak_mib: float = 0.0
    leader: float | None = None

    @property
    def growth_mib(self) -> float:
        """RSS after minus before, in MiB."""
        return self.rss_after_mib - self.rss_before_mib


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _samples(port: int) -> dict[str, float] | None:
    """Return ``/metrics`` as ``{"name{labels}": value}``; None until it answers."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return None
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def _claims_idle(port: int) -> float:
    """Return the idle seconds of the standby's claims watch (0.0 while unknown)."""
    samples = _samples(port) or {}
    return max(
        (v for k, v in samples.items() if "resource=ipaddressclaims" in k),
        default=0.0,
    )


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g} s")
        time.sleep(0.2)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseHolder:
    """Holds the Lease ``ipam-bridge`` as another identity, renewed every second in a thread.

    A candidate counts a Lease as held while its record changed less than its own lease
    duration ago (the official client's ``observed_time``), so it is renewed as a leader
    would renew it.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._stop = threading.Event()
        _hold_lease(sandbox)
        self._thread = threading.Thread(target=self._renew, name="lease-holder", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(1.0):
            self._sandbox.kube.patch(
                "coordination.k8s.io/v1",
                "leases",
                "ipam-bridge",
                {"spec": {"renewTime": _now()}},
                "default",
            )

    def stop(self) -> None:
        """Stop renewing."""
        self._stop.set()
        self._thread.join(5)


def _hold_lease(sandbox: Sandbox) -> None:
    """Make the Lease held by someone else."""
    now = _now()
    sandbox.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "ipam-bridge", "namespace": "default"},
            "spec": {
                "holderIdentity": "leader-elsewhere",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
    )


def _claim(name: str) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "pool"}},
    }


def _churn(sandbox: Sandbox, claims: int, window: int) -> None:
    """Create ``claims`` claims, deleting each once ``window`` newer ones exist; then the rest."""
    api_version = f"{GROUP}/{VERSION}"
    for i in range(claims):
        sandbox.create(_claim(f"c-{i:06d}"))
        if i >= window:
            sandbox.delete_object(api_version, "ipaddressclaims", f"c-{i - window:06d}", NAMESPACE)
    for i in range(max(0, claims - window), claims):
        sandbox.delete_object(api_version, "ipaddressclaims", f"c-{i:06d}", NAMESPACE)


def run_standby_bench(
    claims: int = 100_000,
    *,
    window: int = 500,
    source: Path | None = None,
    label: str = "this",
    timeout: float = 1800.0,
) -> StandbyResult:
    """Run one standby against a churn of ``claims`` claims; return its figures.

    Parameters
    ----------
    claims:
        Claims created and deleted.
    window:
        Claims alive at once at most.
    source:
        Another checkout whose operator runs (None: this tree's).
    label:
        The name of the run in the table.
    timeout:
        Seconds each wait may take (start-up, catching up).
    """
    result = StandbyResult(label, claims, window)
    port = _free_port()
    settings = {
        "IPAM_BRIDGE_LEADER_ELECTION": "true",
        "IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE": "default",
        "IPAM_BRIDGE_METRICS_PORT": str(port),
        "POD_NAME": f"standby-{label}",
    }
    with Sandbox(start_operator=False, settings=settings) as sandbox:
        sandbox.namespace(NAMESPACE)
        holder = LeaseHolder(sandbox)
        with OperatorProcess(source=source) as operator:
            _wait(lambda: _claims_idle(port) > SETTLED_SECONDS, timeout, "the standby's start")
            result.rss_before_mib = operator.memory_mib()["VmRSS"]
            started = time.monotonic()
            _churn(sandbox, claims, window)
            result.churn_seconds = time.monotonic() - started
            _wait(lambda: _claims_idle(port) > SETTLED_SECONDS, timeout, "the standby's catch-up")
            result.caught_up_seconds = time.monotonic() - started - SETTLED_SECONDS
            memory = operator.memory_mib()
            result.rss_after_mib, result.peak_mib = memory["VmRSS"], memory["VmHWM"]
            result.leader = (_samples(port) or {}).get("ipam_bridge_leader{}")
        holder.stop()
    if result.leader != 0:
        raise RuntimeError(f"the standby did not stand by: ipam_bridge_leader {result.leader}")
    return result


def format_result(results: list[StandbyResult]) -> str:
    """Return the table of one or more standby runs."""
    first = results[0]
    return (
        f"(h) a standby's memory: {first.claims} claims of ours created and deleted in the "
        f"emulated API (at most {first.window} alive at once), each an ADDED and a DELETED "
        "watch event through the standby's informers, stores and sinks (the operator in a "
        "process of its own, the Lease held elsewhere, the emulator in the benchmark's); "
        "RSS of the standby's process when its start-up settled and once its claims watch "
        f"was idle {SETTLED_SECONDS:g} s after the churn\n"
        + table(
            [
                "tree",
                "claims",
                "churn s",
                "caught up s",
                "RSS before MiB",
                "RSS after MiB",
                "growth MiB",
                "peak MiB",
                "ipam_bridge_leader",
            ],
            [
                [
                    r.label,
                    r.claims,
                    r.churn_seconds,
                    r.caught_up_seconds,
                    r.rss_before_mib,
                    r.rss_after_mib,
                    r.growth_mib,
                    r.peak_mib,
                    "-" if r.leader is None else r.leader,
                ]
                for r in results
            ],
        )
    )
