"""Structures that would grow with churn are bounded or pruned when their object goes."""

from __future__ import annotations

import threading
from typing import cast

from bridge.objects.client import ObjectClient
from bridge.operator import Operator
from bridge.reconcilers.context import Notices, ServedVersions
from bridge.settings import Settings

WAIT = 10.0


def context() -> Operator:
    return Operator(
        settings=Settings(), kube=cast(ObjectClient, object()), versions=ServedVersions("v1beta2")
    )


def test_notices_keep_at_most_their_limit_least_recently_told_first() -> None:
    notices = Notices(limit=3)
    for subject in ("a", "b", "c"):
        assert notices.first(subject, "problem")
    assert not notices.first("a", "problem")  # told: now the most recent
    assert notices.first("d", "problem")  # "b" goes
    assert len(notices) == 3
    assert not notices.first("a", "problem") and not notices.first("c", "problem")
    assert notices.first("b", "problem")  # forgotten: told once more


def test_namespace_locks_go_when_no_thread_holds_or_waits() -> None:
    ctx = context()
    for i in range(100):
        with ctx.locks.holding(f"ns-{i}"):
            pass
    assert ctx.sizes()["namespace_locks"] == 0


def test_a_namespace_lock_still_excludes_while_another_thread_waits() -> None:
    ctx = context()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with ctx.locks.holding("ns"):
            order.append("first in")
            inside.set()
            assert release.wait(WAIT)
            order.append("first out")

    def second() -> None:
        with ctx.locks.holding("ns"):
            order.append("second in")

    one = threading.Thread(target=first)
    one.start()
    assert inside.wait(WAIT)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.2)  # it waits: the lock is held
    assert order == ["first in"] and ctx.sizes()["namespace_locks"] == 1
    release.set()
    one.join(WAIT)
    two.join(WAIT)
    assert order == ["first in", "first out", "second in"]
    assert ctx.sizes()["namespace_locks"] == 0


def test_context_sizes_name_every_structure() -> None:
    ctx = context()
    ctx.exhausted.hold(("ns", "PHPIPAMIPPool", "pool"))
    ctx.flow.endpoint("https://ipam.example.com")
    sizes = ctx.sizes()
    assert sizes["exhausted"] == 1 and sizes["flow.endpoints"] == 1
    for name in (
        "cache.claims",
        "cache.addresses",
        "cache.pools",
        "cache.clusters",
        "cache.expectations",
        "backends.entries",
        "backends.retired",
        "flow.in_flight",
        "places.waiting",
        "places.woken",
        "notices",
        "metrics.pending",
    ):
        assert sizes[name] == 0, name
