"""Many claims at once, on two pools that share one phpIPAM subnet (issue 4, point 6).

The operator runs 16 workers (``IPAM_BRIDGE_WORKERS``). Two pools point at the same /23,
one by ``subnetId`` and one by ``subnet`` (CIDR): uniqueness must come from phpIPAM's
first-free allocation, never from per-pool state. Lost first-free races are injected
(`mock_phpipam.faults.FaultConfig.race_rate`): ``instead`` (409 / duplicate key, nothing
allocated, as phpIPAM answers the loser of a real race) while the first 500 claims come,
then ``after`` (the address is allocated but the answer lost) while half are replaced.
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fault_audit import deleting, print_figures, wait_converged
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["duplicates_now"]

#: A /23 (gateway 10.30.0.1, 509 assignable addresses) added to the shared seed.
SUBNET_ID = 20
CIDR = "10.30.0.0/23"
PER_POOL = 250
WORKERS = 16


@pytest.fixture
def phpipam_wide() -> Iterator[MockPhpipamServer]:
    """A mock phpIPAM whose section also holds the /23 `CIDR` (id `SUBNET_ID`)."""
    seed: dict[str, Any] = copy.deepcopy(PHPIPAM_SEED)
    seed["sections"][0]["subnets"].append({"id": SUBNET_ID, "cidr": CIDR, "gateway": "10.30.0.1"})
    with MockPhpipamServer(Store(seed)) as server:
        yield server


def duplicates_now(sandbox: Sandbox) -> tuple[list[str], list[str]]:
    """Return the addresses held by two IPAddresses of live claims, and by two IPAddresses
    at all.

    Only the first are duplicates. Between the release in phpIPAM and the IPAddress
    deletion (the contract's order), a claim being deleted still has its IPAddress while
    phpIPAM may already hand the address to a new claim: an overlap of the second kind.
    """
    live = {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE) if not deleting(c)}
    addresses = sandbox.addresses(NAMESPACE)
    held = Counter(a["spec"]["address"] for a in addresses)
    held_live = Counter(
        a["spec"]["address"] for a in addresses if a["spec"]["claimRef"]["name"] in live
    )
    return (
        sorted(ip for ip, n in held_live.items() if n > 1),
        sorted(ip for ip, n in held.items() if n > 1),
    )


def test_500_claims_at_once_on_two_pools_sharing_a_subnet(
    make_sandbox: Callable[..., Sandbox], phpipam_wide: MockPhpipamServer
) -> None:
    phpipam = phpipam_wide
    store = phpipam.store
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_WORKERS": str(WORKERS)}, start_operator=False)
    sandbox.phpipam_pool(
        NAMESPACE, "left", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE, "right", endpoint=phpipam.url, subnet=CIDR, secret="left-credentials"
    )
    names = {pool: [f"{pool}-{i:03d}" for i in range(PER_POOL)] for pool in ("left", "right")}
    # All 500 exist before the operator starts: it meets them at once.
    for pool, claims in names.items():
        for name in claims:
            sandbox.claim(NAMESPACE, name, pool)
    phpipam.faults.rng = random.Random(4006)
    phpipam.faults.update(race_rate=0.1, race_mode="instead")

    started = time.monotonic()
    sandbox.start_operator()
    first = wait_converged(sandbox, store, 2 * PER_POOL, timeout=180, subnet_ids=(SUBNET_ID,))
    first_seconds = time.monotonic() - started
    races_first = phpipam.faults.stats["races"]

    addresses = sandbox.addresses(NAMESPACE)
    assert len(addresses) == len({a["spec"]["address"] for a in addresses}) == 2 * PER_POOL
    assert Counter(a["spec"]["poolRef"]["name"] for a in addresses) == {
        "left": PER_POOL,
        "right": PER_POOL,
    }
    assert races_first > 0

    # Half of each pool's claims go, as many new ones come, at once; the freed addresses
    # are handed out again while answers to first-free requests get lost.
    phpipam.faults.update(race_mode="after")
    doomed = names["left"][::2] + names["right"][1::2]
    started_second = time.monotonic()
    for name in doomed:
        sandbox.delete_claim(NAMESPACE, name)
    for pool in ("left", "right"):
        for i in range(PER_POOL // 2):
            sandbox.claim(NAMESPACE, f"{pool}-new-{i:03d}", pool)
    seen_duplicates: set[str] = set()
    seen_overlaps: set[str] = set()

    def sample() -> None:
        duplicates, overlaps = duplicates_now(sandbox)
        seen_duplicates.update(duplicates)
        seen_overlaps.update(overlaps)

    second = wait_converged(
        sandbox,
        store,
        2 * PER_POOL,
        timeout=180,
        subnet_ids=(SUBNET_ID,),
        each=sample,
    )
    second_seconds = time.monotonic() - started_second
    races_second = phpipam.faults.stats["races"] - races_first
    phpipam.faults.reset()

    assert seen_duplicates == set(), "two live claims held one address"
    assert races_second > 0
    assert not set(doomed) & {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)}
    print_figures(
        f"500 claims at once, 2 pools / 1 subnet, {WORKERS} workers",
        claims=2 * PER_POOL,
        races_injected=races_first,
        duplicates=len(first.duplicates),
        leaks=len(first.leaks),
        unbound=len(first.unbound),
        seconds=first_seconds,
    )
    print_figures(
        "250 replaced at once (lost first-free answers)",
        claims_deleted=len(doomed),
        claims_created=2 * (PER_POOL // 2),
        races_injected=races_second,
        duplicates=len(second.duplicates) + len(seen_duplicates),
        overlaps_with_deleting_claims=len(seen_overlaps),
        leaks=len(second.leaks),
        unbound=len(second.unbound),
        seconds=second_seconds,
    )
