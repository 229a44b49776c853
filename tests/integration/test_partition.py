"""A leader cut off from the API server while it can still reach the IPAM (issue 19).

Two replicas (``python -m bridge.cli run`` with leader election, default timings: lease 15 s,
renew deadline 10 s, retry 2 s) against one emulated API server and one mock phpIPAM. Claims
are created every 0.2 s and bound claims deleted every 0.5 s through the admin. The leader's
identity is then cut off by the API server (its new requests are refused, or hang without
an answer; its open watch streams go on, so it keeps seeing claims to work on), while the
IPAM still answers it.

- Fencing: no IPAM write from the old leader (the mock's journal tells the replicas apart by
  their ``User-Agent``) later than its last renew of the Lease plus the renew deadline, plus
  a small margin for a request already on the wire.
- Takeover: the standby holds the Lease within 30 s of the cut, and the old leader exits 1.
- At the end every live claim is bound, every deleted claim is gone, no hostname is
  registered twice and no IPAM entry is left without its claim.

The figures (fencing and takeover times, claims, deletions, duplicates, leaks) are printed
(``pytest -s``).
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest
from integration_env import NAMESPACE
from test_leader_election import (
    Replica,
    holder,
    lease,
    lease_cluster,
    running_replicas,
    wait_leader,
)

from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

RENEW_DEADLINE = 10.0
#: A request the fence let through just before it closed may still be on the wire.
MARGIN = 1.0
CREATE_EVERY = 0.2
DELETE_EVERY = 0.5


@pytest.fixture
def cluster(tmp_path: Path, phpipam: MockPhpipamServer) -> Iterator[Sandbox]:
    with lease_cluster(tmp_path, phpipam) as sandbox:
        yield sandbox


@pytest.fixture
def replicas(cluster: Sandbox, tmp_path: Path) -> Iterator[Callable[[str], Replica]]:
    def make(name: str) -> Replica:
        return Replica(cluster, name, tmp_path)

    with running_replicas(make, tail=30) as start:
        yield start


class LeaseLog:
    """Polls the Lease every 20 ms: the last renewTime written by ``pod``, and handovers."""

    def __init__(self, sandbox: Sandbox, pod: str) -> None:
        self.last_renew: float | None = None
        self.handed_over: float | None = None
        self._sandbox, self._pod = sandbox, pod
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            spec = lease(self._sandbox).get("spec") or {}
            who = spec.get("holderIdentity") or ""
            if who.startswith(f"{self._pod}_") and spec.get("renewTime"):
                renewed = datetime.datetime.fromisoformat(spec["renewTime"]).timestamp()
                self.last_renew = max(self.last_renew or 0.0, renewed)
            elif who and self.handed_over is None and self.last_renew is not None:
                self.handed_over = time.time()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Churn:
    """Creates a claim every 0.2 s and deletes a bound one every 0.5 s, in a thread."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self._sandbox = sandbox
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def create(self) -> None:
        name = f"p{len(self.created)}"
        self._sandbox.claim(NAMESPACE, name, "pool")
        self.created.append(name)

    def _bound(self) -> str | None:
        for name in self.created:
            if name in self.deleted:
                continue
            claim = self._sandbox.get_claim(NAMESPACE, name) or {}
            if (claim.get("status") or {}).get("addressRef"):
                return name
        return None

    def _run(self) -> None:
        next_delete = time.monotonic()
        while not self._stop.wait(CREATE_EVERY):
            self.create()
            if time.monotonic() >= next_delete and (name := self._bound()) is not None:
                self._sandbox.delete_claim(NAMESPACE, name)
                self.deleted.append(name)
                next_delete = time.monotonic() + DELETE_EVERY

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def live(self) -> list[str]:
        return [n for n in self.created if n not in self.deleted]


def ipam_writes(phpipam: MockPhpipamServer, pod: str) -> list[float]:
    """Arrival times of the IPAM writes (logins aside) sent by ``pod``."""
    return [e.at for e in phpipam.store.requests(writes_only=True) if e.client.endswith(f"({pod})")]


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_a_leader_cut_off_from_the_api_server_stops_writing_within_the_renew_deadline(
    cluster: Sandbox,
    replicas: Callable[[str], Replica],
    phpipam: MockPhpipamServer,
    mode: Literal["refuse", "hang"],
) -> None:
    a = replicas("a")
    a.wait_started()
    wait_leader(cluster, a)
    b = replicas("b")
    b.wait_started()
    churn = Churn(cluster)
    for _ in range(10):
        churn.create()
    cluster.wait_claims_bound(NAMESPACE, 10, timeout=60)
    assert ipam_writes(phpipam, a.pod), "the leader's IPAM requests carry its pod name"

    leases = LeaseLog(cluster, a.pod)
    churn.start()
    time.sleep(3)  # the churn runs under the leader
    cut = time.time()
    cluster.kube.handler.partition.cut(a.identity, mode)
    try:
        wait_leader(cluster, b, timeout=60)
        takeover = time.time() - cut
        time.sleep(5)  # the churn goes on under the new leader
    finally:
        churn.stop()
        leases.stop()
    code = a.proc.wait(30)

    live, deleted = churn.live, churn.deleted
    cluster.wait_claims_bound(NAMESPACE, len(live), timeout=120)
    wait_for(
        lambda: all(cluster.get_claim(NAMESPACE, n) is None for n in deleted),
        timeout=120,
        message="deleted claims released",
    )
    registered = [str(x.hostname) for x in phpipam.store.subnet_addresses(7) if not x.is_gateway]
    duplicates = [h for h, n in collections.Counter(registered).items() if n > 1]
    leaks = sorted(set(registered) - {f"{n}.test" for n in live})
    missing = sorted({f"{n}.test" for n in live} - set(registered))
    writes = ipam_writes(phpipam, a.pod)
    last_renew = leases.last_renew
    assert last_renew is not None
    late = [round(t - last_renew, 3) for t in writes if t > last_renew + RENEW_DEADLINE + MARGIN]
    after_cut = [t for t in writes if t > cut]
    print(
        f"\npartition of the leader ({mode}): {len(churn.created)} claims created, {len(deleted)} "
        f"deleted; old leader's last renew {last_renew - cut:+.2f} s from the cut, its last "
        f"IPAM write {(max(writes) - cut):+.2f} s from the cut ({len(after_cut)} after it; "
        f"fenced at last renew + {RENEW_DEADLINE:g} s = {last_renew + RENEW_DEADLINE - cut:+.2f} "
        f"s); standby leads {takeover:.2f} s after the cut; duplicates {len(duplicates)}, "
        f"leaks {len(leaks)}"
    )
    assert late == [], f"IPAM writes of the cut-off leader past its renew deadline: {late}"
    assert takeover < 30
    assert holder(cluster).startswith(f"{b.pod}_")  # type: ignore[union-attr]
    assert code == 1, a.output()
    assert duplicates == [] and leaks == [] and missing == []
