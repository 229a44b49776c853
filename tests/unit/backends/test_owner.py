"""Unit tests of the ownership helpers of backends.base: owner_text, parse_owner, may_adopt."""

from __future__ import annotations

import pytest

from backends.base import (
    Allocation,
    EntryOwner,
    may_adopt,
    owner_text,
    parse_owner,
    quarantine_mark,
)
from backends.errors import EntryOwnedError
from backends.retry import is_retryable

CLUSTER = "3f0c2a1e-6a8b-4f1e-9c7d-1a2b3c4d5e6f"
OURS = EntryOwner(CLUSTER, "default/m1")


def entry(owner: EntryOwner | None, address: str = "10.20.0.2") -> Allocation:
    return Allocation(address, 24, None, "m1.default", "12", owner=owner)


def test_owner_text_names_cluster_and_claim_and_reads_back() -> None:
    assert owner_text(OURS) == f"ipam-bridge {CLUSTER} default/m1"
    assert parse_owner(owner_text(OURS)) == OURS
    # Without a cluster id: the previous release's form, read back as the same owner.
    legacy = EntryOwner("", "default/m1")
    assert owner_text(legacy) == "ipam-bridge default/m1"
    assert parse_owner(owner_text(legacy)) == legacy


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"ipam-bridge cluster={CLUSTER} claim=default/m1", OURS),  # phpIPAM note
        ("ipam-bridge default/m1", EntryOwner("", "default/m1")),  # previous release
        ("ipam-bridge default/m1.x cluster prod-1", EntryOwner("", "default/m1.x")),
        (quarantine_mark(1_800_000_000, owner_text(OURS)), OURS),  # the mark keeps it
        (quarantine_mark(1_800_000_000, "ipam-bridge default/m1"), EntryOwner("", "default/m1")),
        (quarantine_mark(1_800_000_000), None),
        ("ipam-bridge: the subnet's gateway, never assign", None),  # a reservation of ours
        ("reserved for the lab router", None),
        ("ipam-bridge", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_owner(text: str | None, expected: EntryOwner | None) -> None:
    assert parse_owner(text) == expected


@pytest.mark.parametrize(
    ("found", "adopt", "allowed"),
    [
        (None, None, True),  # a network team's reservation
        (OURS, None, True),
        (EntryOwner("", "default/m1"), None, True),  # the previous release's
        (EntryOwner("other-cluster", "default/m1"), None, False),
        (EntryOwner(CLUSTER, "lab/m1.default"), None, False),
        (EntryOwner("", "lab/m1.default"), None, False),
        (EntryOwner("other-cluster", "default/m1"), "10.20.0.2", True),  # moved
        (EntryOwner("other-cluster", "default/m1"), "10.20.0.3", False),
    ],
)
def test_may_adopt(found: EntryOwner | None, adopt: str | None, allowed: bool) -> None:
    assert may_adopt(entry(found), OURS, adopt) is allowed


def test_may_adopt_compares_addresses_not_their_spelling() -> None:
    other = EntryOwner("other-cluster", "default/m1")
    moved = Allocation("2001:db8::10", 64, None, "m1.default", "r", owner=other)
    assert may_adopt(moved, OURS, "2001:0db8:0000::0010") is True


def test_entry_owned_error_carries_the_entry_and_is_never_retried() -> None:
    owner = EntryOwner("other-cluster", "default/m1")
    error = EntryOwnedError("taken", hostname="m1.default", address="10.20.0.2", owner=owner)
    assert (error.hostname, error.address, error.owner) == ("m1.default", "10.20.0.2", owner)
    assert not is_retryable(error)
