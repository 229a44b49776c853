"""A standby replica keeps no per-key state; the new leader replays its stores (issue 37, 4).

The informers of a standby fill their stores (a warm cache) and tell their sinks, whose keys
and wakes the standby's work queue drops (`WorkQueue(standby=True)`) until it leads; then
`bridge.handlers.resync.replay` queues what the stores hold, once.
"""

from __future__ import annotations

from typing import Any, cast

from bridge.capi import CLAIM_FINALIZER, GROUP
from bridge.handlers.claims import AddressEvents, ClaimEvents
from bridge.handlers.resync import replay
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.runtime.informer import Event
from bridge.runtime.workqueue import Result, WorkQueue
from bridge.settings import Settings


def claim(name: str, rv: int, *, bound: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"u-{name}"}
    meta["resourceVersion"] = str(rv)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": meta,
        "spec": {"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "p"}},
    }
    if bound:
        meta["finalizers"] = [CLAIM_FINALIZER]
        body["status"] = {"addressRef": {"name": name}}
    return body


def address(name: str, rv: int, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "IPAddress",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"a-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {
            "claimRef": {"name": claim_name},
            "poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool", "name": "p"},
        },
    }


class NoApi:
    """A Kubernetes client that must not be called: the replay reads the stores."""

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{name} called: the stores were listed")

        return call


def standby() -> tuple[Operator, WorkQueue]:
    """An operator whose queue stands by, its stores listed (empty), as after start-up."""
    queue = WorkQueue(lambda key: Result.done(), workers=1, standby=True)
    op = Operator(
        settings=Settings(),
        kube=cast(ObjectClient, NoApi()),
        versions=ServedVersions("v1beta2"),
        queue=queue,
    )
    for part in (op.cache.claims, op.cache.addresses, op.cache.pools, op.cache.clusters):
        part.fill([])
    return op, queue


def tell(op: Operator, sink: ClaimEvents | AddressEvents, type: str, body: dict[str, Any]) -> None:
    """What an informer does with one watch event: apply it to the store, tell the sink."""
    part = op.cache.claims if isinstance(sink, ClaimEvents) else op.cache.addresses
    key = ("ns", str(body["metadata"]["name"]))
    changed = part.apply(key, body, deleted=type == "DELETED")
    sink.event(Event(type, key, body, changed))


def test_a_standby_fed_10000_churned_claims_keeps_no_key_and_the_leader_replays_its_stores() -> (
    None
):
    op, queue = standby()
    claims, addresses = ClaimEvents(op), AddressEvents(op)
    rv = 0
    for i in range(10_000):  # created, changed, deleted: nothing of them stays
        name = f"c{i}"
        for type, body in (
            ("ADDED", claim(name, rv + 1)),
            ("MODIFIED", claim(name, rv + 2, bound=True)),
            ("DELETED", claim(name, rv + 2, bound=True)),
        ):
            tell(op, claims, type, body)
        tell(op, addresses, "ADDED", address(name, rv + 3, name))
        tell(op, addresses, "DELETED", address(name, rv + 3, name))
        rv += 3
    live = {
        "live-new": claim("live-new", rv + 1),
        "live-bound": claim("live-bound", rv + 2, bound=True),
    }
    for body in live.values():
        tell(op, claims, "ADDED", body)
    tell(op, addresses, "ADDED", address("live-bound", rv + 3, "live-bound"))

    assert len(op.cache.claims) == 2  # the warm cache holds what lives
    assert len(queue) == 0
    sizes = queue.sizes()
    assert sizes["due"] == sizes["heap"] == 0  # no key
    assert sizes["wake_history"] == sizes["parked_tokens"] == 0  # no wake entry
    assert sizes["failing"] == 0  # no per-key backoff

    queue.lead()  # the Lease is won: the stores are replayed
    assert replay(op) == {"pools": 0, "claims": 2, "owners": 1, "clusters": 0}
    assert len(queue) == 2  # each live claim once (the bound one also by its IPAddress)
    assert queue.sizes()["due"] == 2
    assert queue.leading

    # from now on the sinks queue as a leader's do
    tell(op, claims, "ADDED", claim("later", rv + 4))
    assert len(queue) == 3


def test_a_queue_that_is_not_a_standby_keeps_keys_from_the_start() -> None:
    queue = WorkQueue(lambda key: Result.done(), workers=1)
    queue.add(claim_key("ns", "a"))
    assert len(queue) == 1 and queue.leading
    assert queue.wake("token") == 0 and queue.sizes()["wake_history"] == 1
