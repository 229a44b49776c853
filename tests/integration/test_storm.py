"""A create/delete storm: claims deleted while they are being allocated, a pool deleted under
its new claims. Exactly one address at the edges, and nothing left behind.

What a management cluster meets when CAPI scales a MachineSet up and down in the same
second: 300 claims created from 20 threads, 150 of them deleted 0-300 ms after their
creation (mostly while the operator is writing their finalizer, asking phpIPAM or creating
their IPAddress); and 20 claims whose pool is deleted right after they are created. The
mock phpIPAM is the judge: no address held twice, no entry without a live claim, every
live claim bound to the address phpIPAM holds under its hostname, and every pool can be
deleted at the end.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fault_audit import print_figures, wait_converged
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

from bridge.testing.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

#: A /23 for the storm (509 assignable addresses: never exhausted by 300 claims), and a /24
#: for the pool deleted under its claims.
STORM_SUBNET, STORM_CIDR = 20, "10.30.0.0/23"
DOOMED_SUBNET, DOOMED_CIDR = 21, "10.31.0.0/24"
DOOMED_NAMESPACE = "storm-doomed"
CLAIMS, DELETED, THREADS = 300, 150, 20
STORM_TIMEOUT = float(__import__("os").environ.get("STORM_TIMEOUT", "240"))


@pytest.fixture
def phpipam_storm() -> Iterator[MockPhpipamServer]:
    """A mock phpIPAM whose section also holds `STORM_CIDR` and `DOOMED_CIDR`."""
    seed: dict[str, Any] = copy.deepcopy(PHPIPAM_SEED)
    seed["sections"][0]["subnets"] += [
        {"id": STORM_SUBNET, "cidr": STORM_CIDR, "gateway": "10.30.0.1"},
        {"id": DOOMED_SUBNET, "cidr": DOOMED_CIDR, "gateway": "10.31.0.1"},
    ]
    with MockPhpipamServer(Store(seed)) as server:
        yield server


def entries(store: Store, subnet: int) -> list[tuple[str, str]]:
    """The (hostname, address) entries of a subnet, gateway left out."""
    return sorted(
        (a.hostname or "", a.ip.compressed)
        for a in store.subnet_addresses(subnet)
        if not a.is_gateway
    )


def test_create_delete_storm_leaves_exactly_one_address_per_live_claim(
    make_sandbox: Callable[..., Sandbox], phpipam_storm: MockPhpipamServer
) -> None:
    phpipam, store = phpipam_storm, phpipam_storm.store
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_WORKERS": "16"})
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=STORM_SUBNET, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool")

    rng = random.Random(19)
    names = [f"storm-{i:03d}" for i in range(CLAIMS)]
    doomed = set(rng.sample(names, DELETED))
    delays = {name: rng.uniform(0.0, 0.3) for name in doomed}

    def create(name: str) -> None:
        sandbox.claim(NAMESPACE, name, "pool")
        if name in doomed:
            time.sleep(delays[name])
            sandbox.delete_claim(NAMESPACE, name)

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as threads:
        list(threads.map(create, names))
    storm = wait_converged(
        sandbox, store, CLAIMS - DELETED, timeout=STORM_TIMEOUT, subnet_ids=(STORM_SUBNET,)
    )
    storm_seconds = time.monotonic() - started
    assert storm.duplicates == [] and storm.leaks == [] and storm.orphans == []
    live = {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)}
    assert live == set(names) - doomed
    assert len(entries(store, STORM_SUBNET)) == CLAIMS - DELETED

    # A pool deleted right after its claims are created: whatever each claim got, the
    # pool keeps guarding it, and nothing is registered that no claim holds.
    sandbox.namespace(DOOMED_NAMESPACE)
    sandbox.phpipam_pool(
        DOOMED_NAMESPACE,
        "doomed",
        endpoint=phpipam.url,
        subnet_id=DOOMED_SUBNET,
        credentials=CREDENTIALS,
    )
    sandbox.wait_pool_ready(DOOMED_NAMESPACE, "doomed")
    orphaned = [f"orphan-{i:02d}" for i in range(20)]
    with ThreadPoolExecutor(THREADS) as threads:
        list(threads.map(lambda n: sandbox.claim(DOOMED_NAMESPACE, n, "doomed"), orphaned))
    sandbox.delete_pool(DOOMED_NAMESPACE, "doomed")

    def settled() -> bool:
        """Every claim either bound (and its entry guarded by the pool) or told to wait."""
        claims = sandbox.claims(DOOMED_NAMESPACE)
        return len(claims) == len(orphaned) and all(
            sandbox.ready(c)[1] in ("AddressAllocated", "PoolNotReady") for c in claims
        )

    wait_for(settled, timeout=120, message="the doomed pool's claims bound or waiting")
    bound = {
        a["spec"]["address"]: a["metadata"]["name"] for a in sandbox.addresses(DOOMED_NAMESPACE)
    }
    registered = dict((ip, host) for host, ip in entries(store, DOOMED_SUBNET))
    assert set(registered) == set(bound), "an entry without its IPAddress, or the reverse"
    assert all(host == f"{bound[ip]}.{DOOMED_NAMESPACE}" for ip, host in registered.items())
    if bound:  # the pool still guards what its claims hold
        assert sandbox.pool(DOOMED_NAMESPACE, "doomed") is not None

    # Everything can go: claims first, then each pool, and phpIPAM is left empty.
    for name in orphaned:
        sandbox.delete_claim(DOOMED_NAMESPACE, name)
    for name in live:
        sandbox.delete_claim(NAMESPACE, name)
    sandbox.delete_pool(NAMESPACE, "pool")
    wait_for(
        lambda: (
            sandbox.pool(NAMESPACE, "pool") is None
            and sandbox.pool(DOOMED_NAMESPACE, "doomed") is None
        ),
        timeout=120,
        message="both pools deleted",
    )
    assert sandbox.claims(NAMESPACE) == [] and sandbox.claims(DOOMED_NAMESPACE) == []
    assert entries(store, STORM_SUBNET) == [] and entries(store, DOOMED_SUBNET) == []
    print_figures(
        f"create/delete storm: {CLAIMS} claims from {THREADS} threads, {DELETED} deleted "
        "0-300 ms after creation",
        claims=CLAIMS,
        deleted=DELETED,
        duplicates=len(storm.duplicates),
        leaks=len(storm.leaks),
        seconds_to_converge=round(storm_seconds, 1),
    )
    print_figures(
        "20 claims, their pool deleted right after",
        claims=len(orphaned),
        bound_before_the_pool_let_go=len(bound),
        leaks=len(set(registered) - set(bound)),
    )
