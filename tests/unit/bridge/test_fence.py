"""The fence: writes pass only while this replica's last renew is younger than the deadline."""

from __future__ import annotations

import pytest

from bridge.runtime.fence import Fence, LeadershipLostError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_leader_election_every_write_passes() -> None:
    fence = Fence.open()
    fence.check()
    assert fence.left() is None
    fence.revoke("ignored")  # nothing to revoke: no election
    fence.check()


def test_a_replica_that_never_held_the_lease_does_not_write() -> None:
    fence = Fence(lambda: None, 10.0, clock=Clock())
    with pytest.raises(LeadershipLostError, match="not renewed within 10 s"):
        fence.check()


def test_writes_pass_until_the_renew_deadline_by_the_replicas_own_clock() -> None:
    clock = Clock()
    renewed: list[float] = [clock.now]
    fence = Fence(lambda: renewed[-1], 10.0, clock=clock)
    clock.now += 9.99
    fence.check()
    assert fence.left() == pytest.approx(0.01)
    clock.now += 0.01
    with pytest.raises(LeadershipLostError):
        fence.check()
    renewed.append(clock.now)  # a late renew that succeeded: valid again
    fence.check()


def test_a_revoked_fence_stays_closed_even_after_a_renew() -> None:
    clock = Clock()
    renewed: list[float] = [clock.now]
    fence = Fence(lambda: renewed[-1], 10.0, clock=clock)
    fence.revoke("lost the leader Lease ns/ipam-bridge")
    fence.revoke("a later reason")
    renewed.append(clock.now + 1)
    with pytest.raises(LeadershipLostError, match=r"^lost the leader Lease ns/ipam-bridge$"):
        fence.check()
    assert fence.left() == 0.0


def test_a_writes_timeout_is_cut_to_the_lease_left_and_refused_when_too_little_is_left() -> None:
    clock = Clock()
    fence = Fence(lambda: 100.0, 10.0, clock=clock)
    assert fence.bound(30.0) == pytest.approx(10.0)
    assert fence.bound(4.0) == 4.0
    clock.now += 9.5
    assert fence.bound(30.0) == pytest.approx(0.5)
    clock.now += 0.46  # 40 ms left: too short to get an answer
    with pytest.raises(LeadershipLostError, match="too short for a write"):
        fence.bound(30.0)
    assert Fence.open().bound(30.0) == 30.0
    revoked = Fence(lambda: clock.now, 10.0, clock=clock)
    revoked.revoke("lost the Lease")
    with pytest.raises(LeadershipLostError, match="lost the Lease"):
        revoked.bound(1.0)
