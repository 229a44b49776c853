"""`bridge.runtime.expectations`: a reconcile never acts on a store older than its write."""

from __future__ import annotations

from bridge.runtime.expectations import EXPECT_SECONDS, GONE, Expectations
from bridge.runtime.store import Store

K = ("ipaddressclaims", "ns", "c")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_our_write_is_pending_until_the_watch_delivers_its_version() -> None:
    expectations = Expectations(clock=Clock())
    assert expectations.pending(K) == 0.0
    expectations.wrote(K, "11")  # the finalizer
    expectations.wrote(K, "12")  # then the status: the pass waits for the later one
    assert expectations.pending(K) == EXPECT_SECONDS
    assert expectations.observed(K, "10") is False  # someone else's, older: still waiting
    assert expectations.observed(K, "11") is True  # our echo: queues nothing
    assert expectations.pending(K) > 0
    assert expectations.observed(K, "12") is True
    assert expectations.pending(K) == 0.0
    assert expectations.observed(K, "13") is False  # someone else's later change


def test_an_echo_before_the_answer_and_more_than_four_events_since_hold_nothing() -> None:
    store, expectations = Store("ipaddressclaims"), Expectations(clock=Clock())
    store.fill([(K[1:], {"metadata": {"name": "c", "resourceVersion": "1"}})])
    # The watch tells of our write's version 2 and of five more before the answer comes.
    for version in range(2, 8):
        body = {"metadata": {"name": "c", "resourceVersion": str(version)}}
        assert store.apply(K[1:], body) is True
        assert expectations.observed(K, str(version)) is False  # not known as ours yet
    expectations.wrote(K, "2")
    assert expectations.pending(K) == 0.0  # the store is past it: nothing to wait for
    assert expectations.ours(K, "2") and not expectations.ours(K, "7")
    assert store.version(K[1:]) == "7"  # never the older version back
    body = {"metadata": {"name": "c", "resourceVersion": "8"}}
    assert store.apply(K[1:], body) is True  # later events are not held back


def test_a_write_that_changed_nothing_is_met_by_the_version_stored() -> None:
    # The API server answers a no-op write with the stored version and sends no event.
    expectations = Expectations(clock=Clock())
    expectations.wrote(K, "7")
    assert expectations.pending(K, "6") > 0
    assert expectations.pending(K, "7") == 0.0 and expectations.pending(K) == 0.0


def test_our_deletion_is_met_by_the_deleted_event_and_any_deletion_ends_a_wait() -> None:
    expectations = Expectations(clock=Clock())
    expectations.wrote(K, GONE)
    assert expectations.pending(K) > 0
    assert expectations.observed(K, "9", deleted=True) is True  # ours: queues nothing
    assert expectations.pending(K) == 0.0
    other = ("ipaddresses", "ns", "a")
    expectations.wrote(other, "5")
    assert expectations.observed(other, "7", deleted=True) is False  # someone else deleted it
    assert expectations.pending(other) == 0.0


def test_an_expectation_lapses_after_its_timeout_and_memory_stays_bounded() -> None:
    clock = Clock()
    expectations = Expectations(timeout=5.0, clock=clock)
    for i in range(100):
        key = ("ipaddressclaims", "ns", f"c{i}")
        expectations.wrote(key, "1")
        expectations.observed(key, "0")
    assert expectations.pending(("ipaddressclaims", "ns", "c0")) == 5.0
    clock.now = 4.0
    assert expectations.pending(("ipaddressclaims", "ns", "c0")) == 1.0
    clock.now = 5.5  # the watch never told (it is down): the reconcile acts after all
    assert expectations.pending(("ipaddressclaims", "ns", "c1")) == 0.0
    expectations.wrote(K, "2")  # any later record drops what lapsed
    assert len(expectations) == 2  # K's write and its pending wait
    assert Expectations.token(K) == Expectations.token(K) != Expectations.token(("x",))
