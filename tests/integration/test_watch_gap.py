"""The cache follows the API server across a watch gap: an outage, then resumed or 410 Gone.

The real operator runs against the emulated API server and the phpIPAM mock. The server
goes down (every watch dropped, connections refused) while the admin, acting on the
emulator's store directly, deletes and creates claims; then it comes back, either with its
watch history (watches resume and replay what happened) or without it (watches resumed
from an old resourceVersion answer 410 Gone and the operator must list again). The
Cluster the waiting claims wait on is unpaused at once: its event may well come before the
claims' watch caught up. Everything must converge: every live claim bound, no deleted
claim holding an address, no hostname registered twice, and the pool deletable.
"""

from __future__ import annotations

import collections
import logging
import time

import pytest
from fault_audit import entries_per_claim
from integration_env import CREDENTIALS, NAMESPACE

from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

CLUSTERS = "cluster.x-k8s.io/v1beta2"
#: Seconds the API server is down (the figure of the field report's blackhole is 90 s).
OUTAGE_SECONDS = 60.0
#: Generous: the machine running the tests is shared and loaded.
CONVERGE_SECONDS = 240.0
SUBNET = 7


def _bound(sandbox: Sandbox, names: set[str]) -> bool:
    claims = {str(c["metadata"]["name"]): c for c in sandbox.claims(NAMESPACE)}
    return all(
        name in claims
        and (claims[name].get("status") or {}).get("addressRef")
        and sandbox.ready(claims[name])[0] == "True"
        for name in names
    )


def _converged(sandbox: Sandbox, phpipam: MockPhpipamServer, live: set[str]) -> bool:
    """Every live claim bound; the IPAM and the IPAddresses hold exactly the live claims."""
    names = {str(c["metadata"]["name"]) for c in sandbox.claims(NAMESPACE)}
    addresses = collections.Counter(
        str(a["spec"]["claimRef"]["name"]) for a in sandbox.addresses(NAMESPACE)
    )
    return (
        names == live
        and _bound(sandbox, live)
        and entries_per_claim(phpipam.store, SUBNET) == collections.Counter(live)
        and addresses == collections.Counter(live)
    )


def _lists(sandbox: Sandbox, plurals: tuple[str, ...]) -> int:
    """How many LIST requests of ``plurals`` the API server has answered."""
    records = sandbox.kube.access_log.records()
    return sum(1 for r in records if r.verb == "list" and r.resource in plurals)


@pytest.mark.parametrize("expire", [False, True], ids=["resumed", "410-gone"])
def test_a_watch_gap_converges_without_leaks_or_duplicates(
    sandbox: Sandbox, phpipam: MockPhpipamServer, expire: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.runtime.informer")
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=60)
    sandbox.create(
        {
            "apiVersion": CLUSTERS,
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": NAMESPACE},
            "spec": {"paused": True},
        }
    )
    waiting = {f"w{i}" for i in range(20)}
    bound = {f"b{i}" for i in range(10)}
    for name in sorted(waiting):
        sandbox.claim(NAMESPACE, name, "pool", cluster="c1")
    for name in sorted(bound):
        sandbox.claim(NAMESPACE, name, "pool")
    # The bound claims came through the claims' watch after the waiting ones: the operator
    # has seen (and cached) every waiting claim by then.
    wait_for(lambda: _bound(sandbox, bound), timeout=CONVERGE_SECONDS, message="10 bound")
    assert entries_per_claim(phpipam.store, SUBNET) == collections.Counter(bound)

    lists_before = _lists(sandbox, ("ipaddressclaims", "ipaddresses", "phpipamippools", "clusters"))
    sandbox.kube.go_down(expire=expire)
    down = time.monotonic()
    deleted_waiting = {f"w{i}" for i in range(10)}
    new_waiting = {f"w{i}" for i in range(20, 30)}
    deleted_bound = {f"b{i}" for i in range(5)}
    new_bound = {f"b{i}" for i in range(10, 15)}
    for name in sorted(deleted_waiting | deleted_bound):
        sandbox.delete_claim(NAMESPACE, name)  # the waiting ones carry no finalizer: gone
    for name in sorted(new_waiting):
        sandbox.claim(NAMESPACE, name, "pool", cluster="c1")
    for name in sorted(new_bound):
        sandbox.claim(NAMESPACE, name, "pool")
    assert not sandbox.kube.serving
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down)))  # the outage itself
    sandbox.kube.come_up()
    # At once: the Cluster's event may reach the operator before the claims' watch is back.
    sandbox.kube.patch(CLUSTERS, "clusters", "c1", {"spec": {"paused": False}}, NAMESPACE)

    live = (waiting - deleted_waiting) | new_waiting | (bound - deleted_bound) | new_bound
    assert len(live) == 30
    try:
        wait_for(
            lambda: _converged(sandbox, phpipam, live),
            timeout=CONVERGE_SECONDS,
            message="every live claim bound, nothing else registered",
        )
    finally:
        registered = entries_per_claim(phpipam.store, SUBNET)
        leaked = sorted(set(registered) - live)
        duplicated = sorted(name for name, count in registered.items() if count > 1)
        print(
            f"watch gap ({'410 Gone' if expire else 'resumed'}): leaked {leaked}, "
            f"duplicated {duplicated}, live claims {len(live)}"
        )
    assert sandbox.operator_running
    plurals = ("ipaddressclaims", "ipaddresses", "phpipamippools", "clusters")
    if expire:
        # 410 Gone: every informer (one watch stack: claims, IPAddresses, pools, Clusters)
        # lists again, once its backoff ends.
        wait_for(
            lambda: all(f"{plural} listed again" in caplog.text for plural in plurals),
            timeout=CONVERGE_SECONDS,
            message="the informers' lists",
        )
    else:
        # Resumed from their last resourceVersion: the history replayed the gap, no list.
        assert "listed again" not in caplog.text
        assert _lists(sandbox, plurals) == lists_before

    # Every pool can be deleted at the end.
    for name in sorted(live):
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.wait_gone(NAMESPACE, timeout=CONVERGE_SECONDS)
    sandbox.delete_pool(NAMESPACE, "pool")
    wait_for(
        lambda: sandbox.pool(NAMESPACE, "pool") is None,
        timeout=CONVERGE_SECONDS,
        message="the pool deleted",
    )
    assert entries_per_claim(phpipam.store, SUBNET) == collections.Counter()


def test_a_reset_of_every_watch_connection_costs_no_list_and_no_api_read(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    # A load balancer or NAT dropping long-lived connections: each watch resumes from its
    # last resourceVersion (client-go's reflector), the cache stays trusted meanwhile.
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=60)
    for name in ("a", "b"):
        sandbox.claim(NAMESPACE, name, "pool")
    wait_for(lambda: _bound(sandbox, {"a", "b"}), timeout=CONVERGE_SECONDS, message="bound")
    mark = len(sandbox.kube.access_log.records())
    assert sandbox.kube.reset_watches() >= 4  # claims, IPAddresses, pool kinds, Clusters
    sandbox.claim(NAMESPACE, "after", "pool")
    sandbox.delete_claim(NAMESPACE, "a")
    wait_for(
        lambda: _bound(sandbox, {"b", "after"}) and sandbox.get_claim(NAMESPACE, "a") is None,
        timeout=CONVERGE_SECONDS,
        message="the claim made after the reset bound, the one deleted released",
    )
    user = sandbox.identity.user.name
    since = [r for r in sandbox.kube.access_log.records()[mark:] if r.user == user]
    assert not [r for r in since if r.verb == "list"]
    reads = [
        r for r in since if r.verb == "get" and r.resource in ("ipaddressclaims", "ipaddresses")
    ]
    assert not reads  # every pass read the store
    assert entries_per_claim(phpipam.store, SUBNET) == collections.Counter({"b", "after"})
