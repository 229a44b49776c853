"""The sinks of the pools' and Clusters' informers: what their lists and events queue or wake.

The same as kopf's handlers of pools and Clusters did (one watch stack now): a pool is
queued when it needs a check, its claims woken once it was checked; a Cluster not paused
or gone wakes the claims waiting for it; one asking for an endpoint is queued.
"""

from __future__ import annotations

from typing import Any, cast

from fakes import FakeQueue

from bridge.capi import GROUP
from bridge.handlers.claims import ClusterEvents
from bridge.handlers.pools import PoolEvents
from bridge.objects.client import ObjectClient
from bridge.objects.keys import cluster_key, cluster_token, pool_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.control_plane import POOL_ANNOTATION
from bridge.runtime.informer import Event, Listed
from bridge.runtime.store import Relisted
from bridge.settings import Settings

KIND = "PHPIPAMIPPool"


def operator() -> tuple[Operator, FakeQueue]:
    queue = FakeQueue()
    op = Operator(
        settings=Settings(),
        kube=cast(ObjectClient, object()),
        versions=ServedVersions("v1beta2"),
        queue=queue,
    )
    return op, queue


def pool(ready: str | None, *, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed}
    if ready is not None:
        status["conditions"] = [
            {"type": "Ready", "status": ready, "reason": "R", "lastTransitionTime": "t"}
        ]
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": KIND,
        "metadata": {"name": "p", "namespace": "ns", "generation": generation, "uid": "u"},
        "spec": {},
        "status": status,
    }


def cluster(paused: bool, *, endpoint: bool = False) -> dict[str, Any]:
    annotations = {POOL_ANNOTATION: f"{KIND}/p"} if endpoint else {}
    return {
        "metadata": {"name": "c1", "namespace": "ns", "annotations": annotations},
        "spec": {"paused": paused},
    }


POOL, TOKEN = pool_key("ns", KIND, "p"), pool_token("ns", KIND, "p")


def test_a_listed_pool_is_queued_and_a_checked_one_wakes_its_claims() -> None:
    op, queue = operator()
    PoolEvents(op).listed(Listed([((KIND, "ns", "p"), pool("True"))]))
    assert [key for key, _ in queue.added] == [POOL] and queue.woken == [TOKEN]


def test_a_pool_event_queues_only_what_needs_a_check() -> None:
    op, queue = operator()
    sink = PoolEvents(op)
    sink.event(Event("MODIFIED", (KIND, "ns", "p"), pool("True"), True))  # our status write
    assert queue.added == [] and queue.woken == [TOKEN]
    sink.event(Event("MODIFIED", (KIND, "ns", "p"), pool("False", generation=2), True))
    assert [key for key, _ in queue.added] == [POOL]  # spec changed: check it again
    assert queue.woken == [TOKEN]  # not Ready and not checked yet: its claims keep waiting
    sink.event(Event("ADDED", (KIND, "ns", "p"), pool(None), True))  # new, no status
    sink.event(Event("DELETED", (KIND, "ns", "p"), pool(None), True))
    assert [key for key, _ in queue.added] == [POOL, POOL, POOL] and queue.woken[-1] == TOKEN


def test_a_relist_queues_and_wakes_the_pools_gone_or_changed() -> None:
    op, queue = operator()
    PoolEvents(op).relisted(Relisted(gone=[((KIND, "ns", "p"), pool(None))], changed=[]))
    assert [key for key, _ in queue.added] == [POOL] and queue.woken == [TOKEN]


def test_a_cluster_not_paused_or_gone_wakes_its_claims() -> None:
    op, queue = operator()
    sink = ClusterEvents(op)
    sink.listed(Listed([(("ns", "c1"), cluster(paused=True))]))
    assert queue.woken == [] and queue.added == []
    sink.event(Event("MODIFIED", ("ns", "c1"), cluster(paused=False), True))  # unpaused
    assert queue.woken == [cluster_token("ns", "c1")]
    sink.relisted(Relisted(gone=[(("ns", "c1"), cluster(paused=True))], changed=[]))
    assert queue.woken == [cluster_token("ns", "c1")] * 2  # gone while the watch was down


def test_a_cluster_asking_for_an_endpoint_is_queued_paused_or_not() -> None:
    op, queue = operator()
    sink = ClusterEvents(op)
    sink.event(Event("ADDED", ("ns", "c1"), cluster(paused=True, endpoint=True), True))
    sink.relisted(Relisted(gone=[], changed=[(("ns", "c1"), cluster(False, endpoint=True))]))
    assert [key for key, _ in queue.added] == [cluster_key("ns", "c1")] * 2
