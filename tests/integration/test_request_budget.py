"""The API requests of a claim's hot path, counted exactly (issue 15).

The real operator against the in-memory API: every request it sends is in the emulator's
access log. An allocation reads nothing (claims, pools, Clusters and IPAddresses come from the
watches, the backend client from the pool's check, no Secret read) and writes the claim's
finalizer, the IPAddress and the claim's status (no Event: a claim that never waited has
nothing to tell a person beyond its Ready condition); a release writes the IPAddress's
finalizer removal and its deletion and the claim's finalizer removal. A read or a write added
on the hot path fails here.
"""

from __future__ import annotations

import time
from collections import Counter

from integration_env import CREDENTIALS, NAMESPACE

from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer

CLAIMS = 3
CLUSTERS = "cluster.x-k8s.io/v1beta2"
#: No periodic pool check or resync inside the measured windows.
QUIET = {"IPAM_BRIDGE_POOL_REFRESH_SECONDS": "3600", "IPAM_BRIDGE_RESYNC_SECONDS": "0"}


def _requests(sandbox: Sandbox, since: int) -> tuple[Counter[str], int]:
    """Count the operator's requests after position ``since`` as ``"verb resource[/sub]"``."""
    records = sandbox.kube.access_log.records()
    user = sandbox.identity.user.name
    counts: Counter[str] = Counter(
        f"{r.verb} {r.resource_path}"
        for r in records[since:]
        if r.via == "request" and r.user == user
    )
    return counts, len(records)


def _settle(sandbox: Sandbox, quiet: float = 1.0) -> int:
    """Wait until the operator sent nothing for ``quiet`` seconds; return the log position."""
    count, since = len(sandbox.kube.access_log.records()), time.monotonic()
    deadline = since + 20
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = len(sandbox.kube.access_log.records())
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return count


def test_allocation_reads_nothing_and_writes_three_objects_release_the_same(
    phpipam: MockPhpipamServer,
) -> None:
    with Sandbox(settings=QUIET) as sandbox:
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        sandbox.wait_pool_ready(NAMESPACE, "pool")
        # A Cluster the claims belong to: its pause state is read from the watch too.
        sandbox.create(
            {
                "apiVersion": CLUSTERS,
                "kind": "Cluster",
                "metadata": {"name": "c1", "namespace": NAMESPACE},
                "spec": {"paused": False},
            }
        )
        mark = _settle(sandbox)
        phpipam.store.clear_journal()

        for i in range(CLAIMS):
            sandbox.claim(NAMESPACE, f"m{i}", "pool", cluster="c1")
        sandbox.wait_claims_bound(NAMESPACE, CLAIMS)
        mark_after = _settle(sandbox)
        allocation, _ = _requests(sandbox, mark)
        assert allocation == Counter(
            {
                "patch ipaddressclaims": CLAIMS,  # the ReleaseAddress finalizer
                "create ipaddresses": CLAIMS,
                "patch ipaddressclaims/status": CLAIMS,  # addressRef and Ready
            }
        ), allocation
        assert len(phpipam.store.requests(writes_only=True)) == CLAIMS  # one first-free each

        for i in range(CLAIMS):
            sandbox.delete_object(
                f"{GROUP}/{sandbox.version}", "ipaddressclaims", f"m{i}", NAMESPACE
            )
        sandbox.wait_gone(NAMESPACE)
        _settle(sandbox)
        release, _ = _requests(sandbox, mark_after)
        assert release == Counter(
            {
                "patch ipaddresses": CLAIMS,  # the ProtectAddress finalizer
                "delete ipaddresses": CLAIMS,
                "patch ipaddressclaims": CLAIMS,  # the ReleaseAddress finalizer
            }
        ), release


def test_a_restart_with_bound_claims_reads_and_writes_nothing_of_theirs(
    phpipam: MockPhpipamServer,
) -> None:
    """Bound claims cost no GET, no write and no IPAM call when the operator starts again.

    The cache's initial lists (the informers' one list of IPAddresses and one of claims,
    one of each pool kind, one of Clusters) and the watches replace the per-claim reads of
    the IPAddress, pool and Cluster; the pool's own check (its Secret, the IPAM's subnet)
    still runs.
    """
    with Sandbox(settings=QUIET) as sandbox:
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        for i in range(CLAIMS):
            sandbox.claim(NAMESPACE, f"m{i}", "pool")
        sandbox.wait_claims_bound(NAMESPACE, CLAIMS)
        _settle(sandbox)
        sandbox.stop_operator()
        mark = len(sandbox.kube.access_log.records())
        phpipam.store.clear_journal()
        sandbox.start_operator()
        _settle(sandbox)
        counts, _ = _requests(sandbox, mark)
        per_claim = {
            key: n
            for key, n in counts.items()
            if key.split(" ")[1] in ("ipaddressclaims", "ipaddressclaims/status", "ipaddresses")
            and key.split(" ")[0] != "watch"
        }
        # One start-up check that claims may be listed, and each informer's list: nothing per
        # claim.
        assert per_claim == {"list ipaddressclaims": 2, "list ipaddresses": 1}, counts
        assert phpipam.store.requests(writes_only=True) == []
