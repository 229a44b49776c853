"""The claim lifecycle as a real management cluster exercises it (issue 9, items 1-3, 6, 9).

Each test runs the real operator against the emulated API (which now models namespace
termination, pruning, no-op writes and garbage collection) and the phpIPAM mock over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE
from moving import PHPIPAM_MOVE, assert_only_owners_rewritten, clusterctl_move

import bridge.operator as operator_module
from bridge.capi import ADDRESS_FINALIZER, CLAIM_FINALIZER, GROUP
from bridge.handlers.lifecycle import KOPF_ANNOTATION_PREFIX, KOPF_FINALIZER
from bridge.objects.client import ObjectClient
from bridge.reconcilers.pools import CREDENTIALS_FINALIZER
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

CLAIMS = f"{GROUP}/v1beta2"
CLUSTERS = "cluster.x-k8s.io/v1beta2"


def hosts(server: MockPhpipamServer, subnet_id: int) -> dict[str, str]:
    """Return ``{hostname: address}`` of the claim entries of a phpIPAM subnet."""
    return {
        str(a.hostname): str(a.ip)
        for a in server.store.subnet_addresses(subnet_id)
        if not a.is_gateway and not str(a.hostname).startswith("ipam-bridge-reserved")
    }


def cluster(sandbox: Sandbox, name: str, *, paused: bool = False) -> None:
    sandbox.create(
        {
            "apiVersion": CLUSTERS,
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"paused": paused},
        }
    )


def set_paused(sandbox: Sandbox, name: str, paused: bool) -> None:
    sandbox.kube.patch(CLUSTERS, "clusters", name, {"spec": {"paused": paused}}, NAMESPACE)


@contextmanager
def claim_writes(sandbox: Sandbox) -> Iterator[list[tuple[str, str | None]]]:
    """Record every write the emulated API receives for IPAddressClaims while inside."""
    store = sandbox.kube.store
    writes: list[tuple[str, str | None]] = []
    lock = threading.Lock()
    originals = {name: getattr(store, name) for name in ("patch", "replace")}

    def recording(method: str) -> Callable[..., Any]:
        def record(defn: Any, namespace: str | None, name: str, *args: Any, **kw: Any) -> Any:
            if defn.plural == "ipaddressclaims":
                with lock:
                    writes.append((name, kw.get("subresource")))
            return originals[method](defn, namespace, name, *args, **kw)

        return record

    for method in originals:
        setattr(store, method, recording(method))
    try:
        yield writes
    finally:
        for method, original in originals.items():
            setattr(store, method, original)


@pytest.fixture
def pool(sandbox: Sandbox, phpipam: MockPhpipamServer) -> str:
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    return "pool"


# -- 1. claims of other providers ---------------------------------------------------------


def test_a_foreign_claim_keeps_its_finalizer_and_is_never_written(
    sandbox: Sandbox, pool: str
) -> None:
    foreign = sandbox.create(
        {
            "apiVersion": CLAIMS,
            "kind": "IPAddressClaim",
            "metadata": {
                "name": "theirs",
                "namespace": NAMESPACE,
                "finalizers": [CLAIM_FINALIZER],
            },
            "spec": {"poolRef": {"apiGroup": GROUP, "kind": "InClusterIPPool", "name": "other"}},
        }
    )
    sandbox.claim(NAMESPACE, "ours", pool)
    sandbox.wait_claims_bound(NAMESPACE, 1)
    with claim_writes(sandbox) as writes:
        updated = sandbox.kube.patch(
            CLAIMS, "ipaddressclaims", "theirs", {"metadata": {"labels": {"x": "1"}}}, NAMESPACE
        )
        sandbox.delete_object(CLAIMS, "ipaddressclaims", "theirs", NAMESPACE)
        time.sleep(1.5)  # the operator sees both events within milliseconds
        after = sandbox.get_object(CLAIMS, "ipaddressclaims", "theirs", NAMESPACE)
    assert after is not None and after["metadata"].get("deletionTimestamp")
    assert after["metadata"]["finalizers"] == [CLAIM_FINALIZER]
    assert not after.get("status")
    annotations = after["metadata"].get("annotations") or {}
    assert not [k for k in annotations if k.startswith(KOPF_ANNOTATION_PREFIX)]
    # Only the test's own two writes (label patch; the delete is not a patch) touched it.
    assert [w for w in writes if w[0] == "theirs"] == [("theirs", None)]
    assert updated["metadata"]["uid"] == foreign["metadata"]["uid"]
    # Our own claim carries the contract finalizer and none of kopf's.
    ours = sandbox.get_claim(NAMESPACE, "ours")
    assert ours is not None
    assert ours["metadata"]["finalizers"] == [CLAIM_FINALIZER]
    assert KOPF_FINALIZER not in ours["metadata"]["finalizers"]
    assert not [k for k in ours["metadata"].get("annotations") or {} if "kopf" in k]


# -- 2. clusterctl move into a running operator -----------------------------------------


def test_clusterctl_move_into_a_running_operator_keeps_every_address(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    source = make_sandbox()
    target = make_sandbox()
    source.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    cluster(source, "c1")
    names = ["m1", "m2", "m3"]
    for name in names:
        source.claim(NAMESPACE, name, "pool", cluster="c1")
    source.wait_claims_bound(NAMESPACE, 3)
    before = hosts(phpipam, 7)
    addresses_before = {a["metadata"]["name"]: a["spec"] for a in source.addresses(NAMESPACE)}
    assert len(before) == 3
    set_paused(source, "c1", True)  # clusterctl move pauses the Cluster first
    phpipam.store.clear_journal()

    # Copy to the target (running operator): Cluster (paused), Secret, pool, claims and
    # IPAddresses with new owner UIDs; then annotate, delete and strip them at the source,
    # whose operator is still running.
    clusterctl_move(source, target, ((CLUSTERS, "clusters"), *PHPIPAM_MOVE))
    source.wait_gone(NAMESPACE, timeout=15)

    time.sleep(1.0)
    # Paused: nothing rebuilt yet, nothing asked of the IPAM.
    assert all(not (c.get("status") or {}).get("addressRef") for c in target.claims(NAMESPACE))
    set_paused(target, "c1", False)
    bound = target.wait_claims_bound(NAMESPACE, 3, timeout=15)
    assert {c["status"]["addressRef"]["name"] for c in bound} == set(names)
    assert {a["metadata"]["name"]: a["spec"] for a in target.addresses(NAMESPACE)} == (
        addresses_before
    )
    assert hosts(phpipam, 7) == before
    # Nothing allocated, nothing released: the target wrote itself as each entry's owner.
    assert_only_owners_rewritten(phpipam, target, 3)
    target.wait_pool_ready(NAMESPACE, "pool")
    assert source.claims(NAMESPACE) == [] and source.addresses(NAMESPACE) == []


# -- 3. namespace deletion --------------------------------------------------------------


def test_namespace_deletion_releases_every_address_then_completes(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str
) -> None:
    for i in range(5):
        sandbox.claim(NAMESPACE, f"m{i}", pool)
    sandbox.wait_claims_bound(NAMESPACE, 5)
    assert len(hosts(phpipam, 7)) == 5
    secrets = [
        s
        for s in sandbox.list_objects("v1", "secrets", NAMESPACE)
        if CREDENTIALS_FINALIZER in (s["metadata"].get("finalizers") or [])
    ]
    assert [s["metadata"]["name"] for s in secrets] == ["pool-credentials"]

    started = time.monotonic()
    sandbox.kube.delete("v1", "namespaces", NAMESPACE)
    wait_for(
        lambda: sandbox.kube.get("v1", "namespaces", NAMESPACE) is None,
        timeout=120,
        message="the namespace to be gone",
    )
    assert time.monotonic() - started < 120
    assert hosts(phpipam, 7) == {}


# -- 6. quiet waiting -------------------------------------------------------------------


def test_waiting_claims_write_nothing_and_wake_on_what_ends_their_wait(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "tiny", endpoint=phpipam.url, subnet_id=9, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "tiny")
    for name in ("a1", "a2"):  # a /30: two addresses, both taken
        sandbox.claim(NAMESPACE, name, "tiny")
    sandbox.wait_claims_bound(NAMESPACE, 2)
    waiting = [f"w{i}" for i in range(3)]
    for name in waiting:
        sandbox.claim(NAMESPACE, name, "tiny")
    for name in waiting:
        sandbox.wait_claim_reason(NAMESPACE, name, "PoolExhausted")
    cluster(sandbox, "c1", paused=True)
    sandbox.claim(NAMESPACE, "p1", "tiny", cluster="c1")

    with claim_writes(sandbox) as writes:
        time.sleep(60)
    per_claim = {name: sum(1 for w in writes if w[0] == name) for name in [*waiting, "p1"]}
    assert all(count <= 2 for count in per_claim.values()), per_claim
    assert sum(per_claim.values()) == 0, f"a steady wait writes nothing: {per_claim}"

    # An address freed in the IPAM by hand: a waiting claim is bound within 15 s.
    freed = phpipam.store.subnet_addresses(9)
    taken = next(a for a in freed if str(a.hostname).startswith("a1."))
    phpipam.store.delete_address(taken.id)
    started = time.monotonic()
    wait_for(
        lambda: any(
            sandbox.ready(sandbox.get_claim(NAMESPACE, n)) == ("True", "AddressAllocated")
            for n in waiting
        ),
        timeout=15,
        message="a waiting claim bound after an address was freed",
    )
    assert time.monotonic() - started < 15

    # The Cluster unpaused: its claim is handled within 15 s (here: it waits on the pool).
    started = time.monotonic()
    set_paused(sandbox, "c1", False)
    sandbox.wait_claim_reason(NAMESPACE, "p1", "PoolExhausted", timeout=15)
    assert time.monotonic() - started < 15


def test_a_release_here_wakes_a_waiting_claim(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "tiny", endpoint=phpipam.url, subnet_id=9, credentials=CREDENTIALS
    )
    for name in ("a1", "a2"):
        sandbox.claim(NAMESPACE, name, "tiny")
    sandbox.wait_claims_bound(NAMESPACE, 2)
    sandbox.claim(NAMESPACE, "w1", "tiny")
    sandbox.wait_claim_reason(NAMESPACE, "w1", "PoolExhausted")
    sandbox.delete_claim(NAMESPACE, "a1")
    started = time.monotonic()
    wait_for(
        lambda: sandbox.ready(sandbox.get_claim(NAMESPACE, "w1")) == ("True", "AddressAllocated"),
        timeout=15,
        message="w1 bound after a1 was released",
    )
    assert time.monotonic() - started < 5


# -- 9. the pool deletion guard ---------------------------------------------------------


def test_pool_deletion_waits_for_a_claim_that_holds_an_entry_without_an_ipaddress(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str
) -> None:
    # An IPAddress of the claim's name that belongs to someone else: the claim registers its
    # entry in the IPAM, then cannot create its IPAddress (the name-conflict path).
    sandbox.create(
        {
            "apiVersion": CLAIMS,
            "kind": "IPAddress",
            "metadata": {"name": "m1", "namespace": NAMESPACE},
            "spec": {
                "address": "192.0.2.10",
                "prefix": 24,
                "claimRef": {"name": "someone-else"},
                "poolRef": {"apiGroup": GROUP, "kind": "InClusterIPPool", "name": "other"},
            },
        }
    )
    sandbox.claim(NAMESPACE, "m1", pool)
    sandbox.wait_claim_reason(NAMESPACE, "m1", "AllocationFailed")
    assert "m1.test" in hosts(phpipam, 7)

    sandbox.delete_pool(NAMESPACE, pool)
    blocked = wait_for(
        lambda: (
            (p := sandbox.pool(NAMESPACE, pool)) and sandbox.ready(p)[1] == "DeletionBlocked" and p
        ),
        timeout=10,
        message="the pool to say why it stays",
    )
    assert "IPAddressClaim m1" in str(blocked["status"]["conditions"])

    sandbox.delete_claim(NAMESPACE, "m1")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "m1") is None, message="m1 released")
    wait_for(lambda: sandbox.pool(NAMESPACE, pool) is None, timeout=10, message="pool gone")
    assert hosts(phpipam, 7) == {}
    # The foreign IPAddress was never touched.
    other = sandbox.get_object(CLAIMS, "ipaddresses", "m1", NAMESPACE)
    assert other is not None and other["spec"]["claimRef"] == {"name": "someone-else"}
    assert ADDRESS_FINALIZER not in (other["metadata"].get("finalizers") or [])


# -- upgrade and restart ------------------------------------------------------------------

V01_PREFIX = "ipam-bridge.ipam.cluster.x-k8s.io/"


def test_upgrade_from_v0_1_keeps_every_address_and_reads_no_cluster(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster(sandbox, "c1")
    names = ["m1", "m2", "m3"]
    for name in names:
        sandbox.claim(NAMESPACE, name, pool, cluster="c1")
    sandbox.wait_claims_bound(NAMESPACE, 3)
    sandbox.stop_operator()

    # Make the objects look as v0.1 left them: kopf's bookkeeping under the old prefix, no
    # location on the IPAddresses, no credentials-in-use on the Secret.
    for claim in sandbox.claims(NAMESPACE):
        sandbox.kube.patch(
            CLAIMS,
            "ipaddressclaims",
            claim["metadata"]["name"],
            {
                "metadata": {
                    "annotations": {
                        V01_PREFIX + "last-handled-configuration": '{"spec": {}}',
                        V01_PREFIX + "allocate": '{"success": true}',
                    }
                }
            },
            NAMESPACE,
        )
    for address in sandbox.addresses(NAMESPACE):
        sandbox.kube.patch(
            CLAIMS,
            "ipaddresses",
            address["metadata"]["name"],
            {"metadata": {"annotations": {"ipam.cluster.x-k8s.io/ipam-location": None}}},
            NAMESPACE,
        )
    sandbox.kube.patch(
        "v1", "secrets", "pool-credentials", {"metadata": {"finalizers": None}}, NAMESPACE
    )
    before = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
    entries = hosts(phpipam, 7)
    phpipam.store.clear_journal()

    cluster_reads: list[str] = []
    original = ObjectClient.get_cluster

    def counting(self: ObjectClient, namespace: str, name: str) -> Any:
        cluster_reads.append(name)
        return original(self, namespace, name)

    monkeypatch.setattr(ObjectClient, "get_cluster", counting)
    seen: list[str] = []
    reconcile = operator_module.reconcile_claim

    def spy(ctx: Any, namespace: str, name: str) -> Any:
        decision = reconcile(ctx, namespace, name)
        seen.append(name)
        return decision

    monkeypatch.setattr(operator_module, "reconcile_claim", spy)
    with claim_writes(sandbox) as writes:
        sandbox.start_operator()
        wait_for(lambda: set(names) <= set(seen), message="every claim looked at")
        sandbox.wait_pool_ready(NAMESPACE, pool)
        time.sleep(1)
    # Bound claims: no write, no Cluster read, no IPAM call; the Secret is protected again.
    assert writes == []
    assert cluster_reads == []
    assert [r for r in phpipam.store.requests() if "/addresses/" in r.path] == []
    after = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
    for name in names:
        assert (
            after[name]["metadata"]["resourceVersion"]
            == before[name]["metadata"]["resourceVersion"]
        )
        assert after[name]["metadata"]["finalizers"] == [CLAIM_FINALIZER]
    secret = sandbox.get_object("v1", "secrets", "pool-credentials", NAMESPACE) or {}
    assert CREDENTIALS_FINALIZER in (secret.get("metadata") or {}).get("finalizers", [])

    # A v0.1 claim is still released, at the pool's location, and nothing else is touched.
    sandbox.delete_claim(NAMESPACE, "m1")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "m1") is None, message="m1 released")
    assert hosts(phpipam, 7) == {k: v for k, v in entries.items() if not k.startswith("m1.")}
