"""claims: what `reconcile_claim` decides and writes, with a fake API and a fake IPAM.

Also the pure helpers the decision relies on: `errors` (delays, claim errors, the one
exhausted message), `pool_backends` (the recorded IPAM location) and `bridge.capi` (claim
status on v1beta1 schemas without ``status.v1beta2``).
"""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import pytest
from fakes import (
    DELETED_AT,
    FakeIPAM,
    FakeKube,
    FakeQueue,
    claim,
    install_backend,
    ours,
    phpipam_pool,
    pool_condition,
)
from kubernetes.client import ApiException

from backends import errors as be
from backends.base import EntryOwner
from backends.flowcontrol import FlowControl
from bridge import capi
from bridge.capi import Claim, Reason
from bridge.handlers.claims import AddressEvents
from bridge.models import wire
from bridge.objects.client import ObjectClient
from bridge.objects.keys import claim_key, cluster_token, pool_key, pool_token
from bridge.operator import Operator
from bridge.reconcilers import pools as pool_service
from bridge.reconcilers.claims import _release, reconcile_claim
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.errors import TLS_HINT, claim_error_from, exhausted_message, retry_delay
from bridge.reconcilers.pool_backends import LOCATION_FIELDS, location_of, parse_pool, with_location
from bridge.runtime.expectations import GONE
from bridge.runtime.gateway import Outcome
from bridge.runtime.gateway import Write as KubeWrite
from bridge.runtime.informer import Event, Listed
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

NS = "ns"
POOL = "pool"
KIND = "PHPIPAMIPPool"
DISPLAY = f"{KIND} {NS}/{POOL}"
POOL_TOKEN = pool_token(NS, KIND, POOL)
POOL_ENDPOINT = "https://ipam.example.com"  # the fake pools' spec.endpoint
CLUSTER_ID = "uid-of-kube-system-a"  # this management cluster (IPAM_BRIDGE_CLUSTER_ID)
OTHER_CLUSTER = "uid-of-kube-system-b"  # another one sharing the IPAM


class World:
    """A context over a `FakeKube`, a `FakeIPAM`, a `FakeQueue` and a hand-driven gate clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, version: str = "v1beta2") -> None:
        self.kube = FakeKube()
        self.ipam = FakeIPAM(timeline=self.kube.timeline)
        self.built = install_backend(monkeypatch, self.ipam)
        self.queue = FakeQueue()
        self.now = 1000.0
        self.ctx = Operator(
            settings=Settings(cluster_id=CLUSTER_ID),
            kube=cast(ObjectClient, self.kube),
            versions=ServedVersions(version),
            flow=FlowControl(clock=lambda: self.now),
            queue=self.queue,
        )
        self.kube.add_secret(NS, "creds", {"username": "u", "password": "p"})

    def reconcile(self, name: str = "c1") -> Result:
        return reconcile_claim(self.ctx.claims, NS, name)

    def stored(self, name: str = "c1") -> dict[str, Any]:
        return self.kube.claims[(NS, name)]

    def delete(self, name: str = "c1") -> None:
        meta = self.stored(name)["metadata"]
        meta["deletionTimestamp"] = DELETED_AT
        meta["resourceVersion"] = self.kube._rv()  # as the API server does on a change

    def reset(self) -> None:
        """Forget what was recorded so far (the store keeps its objects)."""
        self.kube.writes.clear()
        self.kube.reads.clear()
        self.kube.timeline.clear()
        self.ipam.calls.clear()
        self.built.clear()
        self.queue.added.clear()
        self.queue.woken.clear()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    return World(monkeypatch)


def ready(body: dict[str, Any]) -> dict[str, Any]:
    """Return the Ready condition of a stored claim (v1beta2 shape)."""
    return next(c for c in body["status"]["conditions"] if c["type"] == "Ready")


def bind(world: World, name: str = "c1", **kwargs: Any) -> None:
    """Add a ready pool (when missing) and an ours claim, and let the services bind it."""
    if (NS, KIND, POOL) not in world.kube.pools:
        world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim(name, **kwargs))
    assert world.reconcile(name) == Result.done()
    assert (NS, name) in world.kube.addresses
    world.reset()


# -- pure helpers -------------------------------------------------------------------------


def test_retry_delay_by_reason() -> None:
    settings = Settings(
        requeue_seconds=1, requeue_config_error_seconds=2, requeue_exhausted_seconds=3
    )
    assert retry_delay(settings, Reason.POOL_EXHAUSTED) == 3
    for reason in (
        Reason.INVALID_SPEC,
        Reason.CREDENTIALS_NOT_FOUND,
        Reason.AUTHENTICATION_FAILED,
        Reason.SUBNET_NOT_FOUND,
        Reason.TLS_VERIFICATION_FAILED,
        Reason.POOL_NOT_READY,
    ):
        assert retry_delay(settings, reason) == 2, reason
    for reason in (Reason.BACKEND_UNAVAILABLE, Reason.ALLOCATION_FAILED, ""):
        assert retry_delay(settings, reason) == 1, reason


@pytest.mark.parametrize(
    ("exc", "reason", "delay"),
    [
        (be.SubnetExhaustedError("full"), Reason.POOL_EXHAUSTED, 3),
        (be.TLSVerificationError("self-signed"), Reason.POOL_NOT_READY, 2),
        (be.AuthenticationFailedError("bad password"), Reason.POOL_NOT_READY, 2),
        (be.SubnetNotFoundError("no subnet"), Reason.POOL_NOT_READY, 2),
        (be.InvalidRequestError("rejected"), Reason.POOL_NOT_READY, 2),
        (be.BackendUnavailableError("down"), Reason.ALLOCATION_FAILED, 1),
        (be.ConflictError("lost race"), Reason.ALLOCATION_FAILED, 1),
    ],
)
def test_claim_error_from(exc: be.BackendError, reason: str, delay: float) -> None:
    error = claim_error_from(
        exc, DISPLAY, retry_seconds=1, config_error_seconds=2, exhausted_seconds=3
    )
    assert (error.reason, error.delay) == (reason, delay)
    assert error.message.startswith(DISPLAY)
    if isinstance(exc, be.SubnetExhaustedError):
        # One text, whatever the IPAM said: a waiting claim's condition never flaps.
        assert error.message == exhausted_message(DISPLAY)
        assert "full" not in error.message
    else:
        assert exc.message in error.message
    assert (TLS_HINT in error.message) is isinstance(exc, be.TLSVerificationError)


def test_exhausted_message_names_the_pool_and_the_wait() -> None:
    assert exhausted_message(DISPLAY) == exhausted_message(DISPLAY)
    assert DISPLAY in exhausted_message(DISPLAY)
    assert "released" in exhausted_message(DISPLAY)


def test_location_of_is_compact_json_of_the_location_fields_only() -> None:
    pool = parse_pool(phpipam_pool(sectionId=3, hostnameSuffix="lab", gateway="10.0.0.1"))
    text = location_of(pool)
    assert text == (
        '{"appId":"capi","endpoint":"https://ipam.example.com","sectionId":3,'
        '"subnet":"10.0.0.0/29"}'
    )
    body = phpipam_pool()
    body.update(kind="InfobloxIPPool")
    body["spec"] = {
        "endpoint": "https://ib.example.com",
        "subnet": "10.1.0.0/24",
        "networkView": "nv",
        "credentialsRef": {"name": "creds"},
        "wapiVersion": "2.12",
    }
    recorded = json.loads(location_of(parse_pool(body)))
    assert recorded == {
        "endpoint": "https://ib.example.com",
        "networkView": "nv",
        "subnet": "10.1.0.0/24",
    }
    assert set(recorded) <= set(LOCATION_FIELDS["InfobloxIPPool"])


def test_with_location_keeps_the_pool_unless_a_different_location_was_recorded() -> None:
    pool = parse_pool(phpipam_pool(sectionId=3, hostnameSuffix="lab"))
    for location in (None, "", "not json", "[1, 2]", location_of(pool)):
        assert with_location(pool, location) is pool, location
    old = json.dumps(
        {"endpoint": "https://old.example.com", "appId": "legacy", "subnetId": 7, "other": "x"}
    )
    moved = with_location(pool, old)
    assert moved is not pool
    assert moved.key == pool.key and moved.credentials_secret == "creds"
    spec = wire(moved.spec)
    assert spec["endpoint"] == "https://old.example.com"
    assert spec["appId"] == "legacy" and spec["subnetId"] == 7
    # The recorded location is the whole location: current location fields it lacks go.
    assert "subnet" not in spec and "sectionId" not in spec
    # What is not a location field is the pool's, never the record's.
    assert spec["hostnameSuffix"] == "lab" and "other" not in spec
    assert wire(pool.spec)["endpoint"] == "https://ipam.example.com"  # the pool is not changed


def test_claim_status_on_a_v1beta1_schema_without_status_v1beta2() -> None:
    body = claim(version="v1beta1")
    failed = capi.claim_status(
        capi.Claim.from_body(body),
        ready=False,
        reason=Reason.POOL_NOT_READY,
        message="m",
        v1beta2_kept=False,
    )
    assert set(failed) == {"conditions"}
    (condition,) = failed["conditions"]
    assert condition["status"] == "False" and condition["severity"] == "Warning"
    assert "observedGeneration" not in condition  # CAPI v1beta1 conditions have none
    bound = capi.claim_status(
        capi.Claim.from_body(body),
        ready=True,
        reason=Reason.ALLOCATED,
        message="m",
        address_ref="c1",
        v1beta2_kept=False,
    )
    assert set(bound) == {"addressRef", "conditions"}
    assert "severity" not in bound["conditions"][0]
    kept = capi.claim_status(
        capi.Claim.from_body(body), ready=True, reason=Reason.ALLOCATED, message="m"
    )
    assert kept["v1beta2"]["conditions"][0]["observedGeneration"] == 1


def test_ready_of_falls_back_to_the_v1beta1_conditions() -> None:
    legacy = {"type": "Ready", "status": "False", "reason": Reason.POOL_EXHAUSTED}
    newer = {"type": "Ready", "status": "True", "reason": Reason.ALLOCATED}
    body = claim(version="v1beta1", status={"conditions": [legacy]})
    assert capi.ready_of(body) == ("False", Reason.POOL_EXHAUSTED)
    body["status"]["v1beta2"] = {"conditions": [newer]}
    assert capi.ready_of(body) == ("True", Reason.ALLOCATED)
    body["status"]["v1beta2"] = {}
    assert capi.ready_of(body) == ("False", Reason.POOL_EXHAUSTED)
    # Only v1beta1 claims read status.v1beta2.
    v1beta2 = claim(status={"conditions": [legacy], "v1beta2": {"conditions": [newer]}})
    assert capi.ready_of(v1beta2) == ("False", Reason.POOL_EXHAUSTED)
    assert capi.ready_of(claim()) == (None, None)


# -- not ours, gone -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        claim(kind="InClusterIPPool"),
        claim(group="other.example.com"),
        claim(group=""),
        claim(kind="InClusterIPPool", finalizers=(capi.CLAIM_FINALIZER,), deleting=True),
        claim(kind="InClusterIPPool", address_ref="c1", finalizers=(capi.CLAIM_FINALIZER,)),
    ],
    ids=["other-kind", "other-group", "no-group", "foreign-deleting", "foreign-bound"],
)
def test_a_claim_that_is_not_ours_is_never_written(world: World, body: dict[str, Any]) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_cluster(NS, "c")
    world.kube.add_claim(body)
    assert world.reconcile() == Result.done()
    assert world.kube.writes == []
    assert world.kube.reads == [("get_claim", "ns/c1")]
    assert world.ipam.calls == []
    assert world.stored()["metadata"]["finalizers"] == body["metadata"]["finalizers"]


def test_a_claim_that_is_gone_or_names_no_pool_is_done(world: World) -> None:
    assert world.reconcile("missing") == Result.done()
    body = claim()
    del body["spec"]["poolRef"]["kind"]
    world.kube.add_claim(body)
    assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == []


# -- waiting ------------------------------------------------------------------------------


def test_a_paused_claim_writes_nothing_and_reads_no_cluster(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim(cluster="c", annotations={capi.PAUSED_ANNOTATION: ""}))
    # Woken by its own update (the annotation removed): not parked, no timer.
    assert world.reconcile() == Result.done()
    assert world.kube.writes == []
    assert world.kube.read("get_cluster") == [] and world.kube.read("get_pool") == []
    assert world.ipam.calls == []


@pytest.mark.parametrize(
    "cluster",
    [{"spec": {"paused": True}}, {"metadata": {"annotations": {capi.PAUSED_ANNOTATION: ""}}}],
    ids=["spec.paused", "annotation"],
)
def test_a_claim_of_a_paused_cluster_is_parked_under_the_cluster(
    world: World, cluster: dict[str, Any]
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_cluster(NS, "c", **cluster)
    world.kube.add_claim(claim(cluster="c"))
    decision = world.reconcile()
    assert decision == Result.wait(cluster_token(NS, "c"))
    assert world.kube.writes == []
    assert world.kube.read("get_pool") == [] and world.ipam.calls == []
    # The Cluster named by the label counts as well.
    world.kube.add_claim(claim("c2", status={}))
    world.stored("c2")["metadata"]["labels"] = {capi.CLUSTER_NAME_LABEL: "c"}
    assert world.reconcile("c2") == Result.wait(cluster_token(NS, "c"))
    assert world.kube.writes == []


def test_a_missing_cluster_is_shown_once(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim(cluster="c"))
    decision = world.reconcile()
    assert decision == Result.wait(cluster_token(NS, "c"))
    assert world.kube.ops() == ["claim.status", "event"]
    condition = ready(world.stored())
    assert (condition["status"], condition["reason"]) == ("False", Reason.ALLOCATION_FAILED)
    assert "Cluster ns/c not found" in condition["message"]
    assert world.kube.events[0][:2] == ("Warning", Reason.ALLOCATION_FAILED)
    assert (
        world.ipam.calls == []
        and capi.CLAIM_FINALIZER not in world.stored()["metadata"]["finalizers"]
    )
    assert world.ctx.metrics.pending_claims() == {"ns/c1": Reason.ALLOCATION_FAILED}
    world.reset()
    assert world.reconcile() == decision
    assert world.kube.writes == []
    # The Cluster appears: the claim is bound.
    world.kube.add_cluster(NS, "c")
    assert world.reconcile() == Result.done()
    assert ready(world.stored())["reason"] == Reason.ALLOCATED
    assert world.ctx.metrics.pending_claims() == {}


@pytest.mark.parametrize(
    ("pool", "fragment"),
    [
        (None, f"{DISPLAY} not found"),
        (
            phpipam_pool(deleting=True, finalizers=(capi.POOL_FINALIZER,), status=pool_condition()),
            f"{DISPLAY} is being deleted",
        ),
        (
            phpipam_pool(
                generation=2,
                status=pool_condition(
                    "False", Reason.AUTHENTICATION_FAILED, "login refused", generation=2
                ),
            ),
            f"{DISPLAY} is not ready: login refused",
        ),
    ],
    ids=["missing", "deleting", "not-ready"],
)
def test_a_claim_waits_for_its_pool_without_asking_the_ipam(
    world: World, pool: dict[str, Any] | None, fragment: str
) -> None:
    if pool is not None:
        world.kube.add_pool(pool)
    world.kube.add_claim(claim())
    decision = world.reconcile()
    assert decision.wake_on == (POOL_TOKEN,)
    assert decision.after is None  # woken by the pool's own reconcile; the resync is the net
    condition = ready(world.stored())
    assert (condition["status"], condition["reason"]) == ("False", Reason.POOL_NOT_READY)
    assert condition["message"] == fragment
    assert world.kube.ops() == ["claim.status", "event"]
    assert world.ipam.calls == [] and world.built == []
    assert world.kube.read("read_secret") == []
    # Nothing was allocated: the contract's finalizer is not needed yet.
    assert world.stored()["metadata"]["finalizers"] == []
    world.reset()
    assert world.reconcile() == decision
    assert world.kube.writes == []


@pytest.mark.parametrize(
    "status",
    [
        None,  # never checked yet
        pool_condition(generation=1),  # checked Ready for its previous spec
        pool_condition("False", Reason.AUTHENTICATION_FAILED, "old spec", generation=1),
    ],
    ids=["unchecked", "stale-ready", "stale-failure"],
)
def test_a_pool_not_checked_for_its_current_spec_is_waited_for_quietly(
    world: World, status: dict[str, Any] | None
) -> None:
    world.kube.add_pool(phpipam_pool(generation=2, status=status))
    world.kube.add_claim(claim())
    decision = world.reconcile()
    assert decision == Result.wait(POOL_TOKEN)
    # Its check wakes the claim within moments: nothing to show meanwhile.
    assert world.kube.writes == [] and world.ipam.calls == [] and world.built == []
    # Checked Ready for the current spec: the claim is bound.
    world.kube.pools[(NS, KIND, POOL)]["status"] = pool_condition(generation=2)
    assert world.reconcile() == Result.done()
    assert [call[0] for call in world.ipam.calls] == ["allocate"]


# -- allocation -----------------------------------------------------------------------------


def test_the_finalizer_goes_on_before_the_ipam_is_asked(world: World) -> None:
    pool = phpipam_pool(status=pool_condition(), hostnameSuffix="lab.example")
    world.kube.add_pool(pool)
    world.kube.add_cluster(NS, "c")
    world.kube.add_claim(claim(cluster="c"))
    assert world.reconcile() == Result.done()
    assert [step for step in world.kube.timeline if step[0] != "read"] == [
        ("kube", "claim.finalizer", "ns/c1"),
        ("backend", "allocate", "c1.ns.lab.example"),
        ("kube", "address.create", "ns/c1"),
        ("kube", "claim.status", "ns/c1"),
    ]  # no Event: a claim allocated at once has nothing to tell beyond its condition
    assert world.kube.of("claim.finalizer")[0].detail == (capi.CLAIM_FINALIZER, True)
    address = world.kube.addresses[(NS, "c1")]
    annotations = address["metadata"]["annotations"]
    assert annotations[capi.HOSTNAME_ANNOTATION] == "c1.ns.lab.example"
    assert annotations[capi.LOCATION_ANNOTATION] == location_of(parse_pool(pool))
    assert address["spec"] == {
        "address": "10.0.0.2",
        "prefix": 29,
        "gateway": "10.0.0.1",
        "claimRef": {"name": "c1"},
        "poolRef": {"apiGroup": capi.GROUP, "kind": KIND, "name": POOL},
    }
    assert address["metadata"]["labels"] == {capi.CLUSTER_NAME_LABEL: "c"}
    stored = world.stored()
    assert stored["status"]["addressRef"] == {"name": "c1"}
    condition = ready(stored)
    assert (condition["status"], condition["reason"]) == ("True", Reason.ALLOCATED)
    assert condition["message"] == f"address 10.0.0.2/29 from {DISPLAY}"
    assert world.kube.events == []  # allocated at once: the condition tells it, no Event
    assert world.ipam.entries == {"c1.ns.lab.example": "10.0.0.2"}


def test_a_pass_after_our_own_write_waits_for_its_watch_event_before_acting(
    world: World,
) -> None:
    bind(world)
    expectations = world.ctx.cache.expectations
    key = ("ipaddresses", NS, "c1")
    expectations.wrote(key, "42")  # our write's answer; the store has an older version
    decision = world.reconcile()
    assert decision.wake_on == (expectations.token(key),)
    assert decision.after is not None and 0 < decision.after <= 5.0
    assert world.kube.writes == [] and world.ipam.calls == []
    assert expectations.observed(key, "42")  # the watch brings it: the pass acts again
    assert world.reconcile() == Result.done()


def test_a_bound_claim_costs_no_write_no_backend_call_and_no_cluster_read(world: World) -> None:
    world.kube.add_cluster(NS, "c")
    bind(world, cluster="c")
    # Even a paused Cluster is not read: nothing needs doing.
    world.kube.add_cluster(NS, "c", spec={"paused": True})
    for _ in range(2):
        assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == [] and world.built == []
    assert world.kube.read("get_cluster") == [] and world.kube.read("get_pool") == []


def test_a_claim_bound_by_someone_else_with_the_right_status_is_not_written(
    world: World,
) -> None:
    world.kube.add_cluster(NS, "c", spec={"paused": True})
    body = ours(cluster="c", address_ref="c1")
    message = f"address 10.0.0.5/29 from {DISPLAY}"
    body["status"] = capi.claim_status(
        capi.Claim.from_body(body),
        ready=True,
        reason=Reason.ALLOCATED,
        message=message,
        address_ref="c1",
    )
    world.kube.add_claim(body)
    address = capi.build_ip_address(
        capi.Claim.from_body(body),
        version="v1beta2",
        pool_uid="uid-pool",
        address="10.0.0.5",
        prefix=29,
        gateway=None,
        hostname="c1.ns",
    )
    world.kube.add_address(address)
    assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == []
    assert world.kube.reads == [("get_claim", "ns/c1"), ("get_ip_address", "ns/c1")]


def moved(world: World, *, finalizer: bool = True) -> None:
    """Bind c1 (of Cluster c) in another cluster, then recreate the claim as clusterctl move does.

    The IPAM entry names the source cluster as its owner; the claim comes without status.
    """
    world.kube.add_cluster(NS, "c")
    bind(world, cluster="c")
    world.ipam.owners["c1.ns"] = EntryOwner(OTHER_CLUSTER, "ns/c1")  # made by the source
    del world.kube.claims[(NS, "c1")]
    world.kube.add_claim(
        claim(cluster="c", finalizers=(capi.CLAIM_FINALIZER,) if finalizer else ())
    )


def test_a_moved_claim_gets_its_status_back_once_its_cluster_is_not_paused(world: World) -> None:
    moved(world)
    entries = dict(world.ipam.entries)
    world.kube.add_cluster(NS, "c", spec={"paused": True})
    assert world.reconcile() == Result.wait(cluster_token(NS, "c"))
    assert world.kube.writes == [] and world.ipam.calls == []
    world.reset()
    world.kube.add_cluster(NS, "c")
    assert world.reconcile() == Result.done()
    assert len(world.kube.of("claim.status")) == 1
    # The pause was checked before the IPAM call and the write.
    timeline = world.kube.timeline
    assert timeline.index(("read", "get_cluster", "ns/c")) < timeline.index(
        ("backend", "allocate", "c1.ns")
    )
    assert timeline.index(("backend", "allocate", "c1.ns")) < timeline.index(
        ("kube", "claim.status", "ns/c1")
    )
    stored = world.stored()
    assert stored["status"]["addressRef"] == {"name": "c1"}
    assert ready(stored)["reason"] == Reason.ALLOCATED
    # One IPAM call: the same entry, its owner written anew (this cluster); nothing created.
    assert [c[:2] for c in world.ipam.calls] == [("allocate", "c1.ns")]
    assert world.ipam.entries == entries
    assert world.ipam.owners["c1.ns"] == EntryOwner(CLUSTER_ID, "ns/c1")
    assert world.ipam.stamped == ["c1.ns"]
    assert world.kube.of("address.create") == []
    assert world.ctx.metrics.allocations.labels(f"{NS}/{POOL}", KIND, "success")._value.get() == 1
    world.reset()
    assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == []  # bound with status: no call


def test_a_moved_claim_without_the_finalizer_gets_it_back(world: World) -> None:
    moved(world, finalizer=False)
    assert world.reconcile() == Result.done()
    assert world.kube.ops()[:2] == ["claim.finalizer", "claim.status"]
    assert capi.CLAIM_FINALIZER in world.stored()["metadata"]["finalizers"]
    # The finalizer before the IPAM call (the contract), then one call.
    timeline = world.kube.timeline
    assert timeline.index(("kube", "claim.finalizer", "ns/c1")) < timeline.index(
        ("backend", "allocate", "c1.ns")
    )
    assert [c[:2] for c in world.ipam.calls] == [("allocate", "c1.ns")]


# -- owners (issue 36): one IPAM, many management clusters ---------------------------------


def test_another_clusters_entry_under_the_hostname_is_refused_with_hostname_taken(
    world: World,
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ipam.entries["c1.ns"] = "10.0.0.4"
    world.ipam.owners["c1.ns"] = EntryOwner(OTHER_CLUSTER, "ns/c1")  # same names, no suffix
    world.kube.add_claim(claim())
    delay = world.ctx.settings.requeue_config_error_seconds
    assert world.reconcile() == Result.requeue_after(delay)  # a person must act: slowly
    condition = ready(world.stored())
    assert (condition["status"], condition["reason"]) == ("False", "HostnameTaken")
    message = condition["message"]
    for part in ("c1.ns", "10.0.0.4", OTHER_CLUSTER, "ns/c1", "spec.hostnameSuffix", DISPLAY):
        assert part in message, part
    assert world.kube.events == [("Warning", "HostnameTaken", message)]
    # Nothing taken, changed or registered; no IPAddress.
    assert world.ipam.entries == {"c1.ns": "10.0.0.4"}
    assert world.ipam.owners["c1.ns"] == EntryOwner(OTHER_CLUSTER, "ns/c1")
    assert world.ipam.stamped == [] and world.kube.addresses == {}
    metrics = world.ctx.metrics
    taken = metrics.allocations.labels(f"{NS}/{POOL}", KIND, "HostnameTaken")
    assert taken._value.get() == 1
    assert metrics.pending_claims() == {"ns/c1": "HostnameTaken"}
    # Quiet waiting: the next pass asks the IPAM again and writes nothing.
    world.reset()
    assert world.reconcile() == Result.requeue_after(delay)
    assert world.kube.writes == [] and world.kube.events == []
    assert [c[:2] for c in world.ipam.calls] == [("allocate", "c1.ns")]
    assert taken._value.get() == 2
    # The other cluster's entry goes: the claim gets an address of its own.
    del world.ipam.entries["c1.ns"], world.ipam.owners["c1.ns"]
    world.reset()
    assert world.reconcile() == Result.done()
    assert ready(world.stored())["reason"] == Reason.ALLOCATED
    assert world.ipam.owners["c1.ns"] == EntryOwner(CLUSTER_ID, "ns/c1")
    assert metrics.pending_claims() == {}


def test_another_claims_entry_of_this_cluster_is_refused_too(world: World) -> None:
    # Claim m1 of namespace prod on a pool with suffix "ns" and claim c1 of namespace ns on
    # a pool without one meet at one hostname: the second is refused, never bound to it.
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ipam.entries["c1.ns"] = "10.0.0.2"
    world.ipam.owners["c1.ns"] = EntryOwner(CLUSTER_ID, "prod/m1")
    world.kube.add_claim(claim())
    world.reconcile()
    condition = ready(world.stored())
    assert condition["reason"] == "HostnameTaken"
    assert f"claim prod/m1 of management cluster {CLUSTER_ID}" in condition["message"]
    assert world.kube.addresses == {}


@pytest.mark.parametrize(
    "owner",
    [EntryOwner("", "ns/c1"), None],
    ids=["previous-release-entry", "reservation"],
)
def test_an_entry_of_the_previous_release_or_a_reservation_is_adopted_and_stamped(
    world: World, owner: EntryOwner | None
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ipam.entries["c1.ns"] = "10.0.0.5"
    if owner is not None:
        world.ipam.owners["c1.ns"] = owner
    world.kube.add_claim(claim())
    assert world.reconcile() == Result.done()
    assert world.kube.addresses[(NS, "c1")]["spec"]["address"] == "10.0.0.5"
    assert world.ipam.owners["c1.ns"] == EntryOwner(CLUSTER_ID, "ns/c1")  # upgraded
    assert world.ipam.stamped == ["c1.ns"]


def test_a_release_names_the_owner_and_leaves_another_clusters_entry_alone(
    world: World,
) -> None:
    bind(world)
    address = world.kube.addresses[(NS, "c1")]["spec"]["address"]
    # Since bound, another management cluster holds the hostname (its entry at .6).
    world.ipam.entries["c1.ns"] = "10.0.0.6"
    world.ipam.owners["c1.ns"] = EntryOwner(OTHER_CLUSTER, "ns/c1")
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {"c1.ns": "10.0.0.6"}  # not ours: not released
    assert world.kube.addresses == {} and (NS, "c1") not in world.kube.claims
    assert address != "10.0.0.6"


def test_a_release_of_our_entry_at_the_ipaddress_address_deletes_it(world: World) -> None:
    bind(world)
    world.ipam.owners["c1.ns"] = EntryOwner("", "ns/c1")  # written by the previous release
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {} and world.ipam.owners == {}


def test_a_rebuilt_claim_whose_hostname_another_cluster_holds_elsewhere_waits(
    world: World,
) -> None:
    moved(world)
    held = world.kube.addresses[(NS, "c1")]["spec"]["address"]
    # The entry at the IPAddress's address is gone; another cluster registered that address
    # under another name meanwhile.
    del world.ipam.entries["c1.ns"], world.ipam.owners["c1.ns"]
    world.ipam.entries["x.other"] = held
    world.ipam.owners["x.other"] = EntryOwner(OTHER_CLUSTER, "other/x")
    delay = world.ctx.settings.requeue_config_error_seconds
    assert world.reconcile() == Result.requeue_after(delay)
    condition = ready(world.stored())
    assert condition["reason"] == Reason.ALLOCATION_FAILED
    assert held in condition["message"] and "x.other" in condition["message"]
    assert "addressRef" not in world.stored()["status"]
    assert world.ipam.entries == {"x.other": held}


def test_a_rebuilt_claim_whose_entry_is_gone_registers_its_address_again(world: World) -> None:
    moved(world)
    held = world.kube.addresses[(NS, "c1")]["spec"]["address"]
    world.ipam.entries.clear()
    world.ipam.owners.clear()
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {"c1.ns": held}  # the address its IPAddress names
    assert world.ipam.owners["c1.ns"] == EntryOwner(CLUSTER_ID, "ns/c1")
    assert world.stored()["status"]["addressRef"] == {"name": "c1"}


def test_an_ipaddress_of_that_name_that_is_not_the_claims_is_never_taken_over(
    world: World,
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    other = capi.build_ip_address(
        capi.Claim.from_body(claim(pool="other-pool")),
        version="v1beta2",
        pool_uid="x",
        address="10.9.9.9",
        prefix=24,
        gateway=None,
        hostname="c1.ns",
    )
    world.kube.add_address(other)
    world.kube.add_claim(claim())
    decision = world.reconcile()
    assert decision.after == world.ctx.settings.requeue_config_error_seconds
    condition = ready(world.stored())
    assert condition["reason"] == Reason.ALLOCATION_FAILED
    assert "IPAddress ns/c1 already exists" in condition["message"]
    assert "10.0.0.2 stays registered as c1.ns" in condition["message"]
    assert world.kube.addresses[(NS, "c1")]["spec"]["address"] == "10.9.9.9"
    assert world.kube.of("address.create") == []
    assert "addressRef" not in world.stored()["status"]


@pytest.mark.parametrize(
    ("error", "reason", "delay"),
    [
        (be.AuthenticationFailedError("login refused"), Reason.POOL_NOT_READY, 60),
        (be.BackendUnavailableError("connection refused"), Reason.ALLOCATION_FAILED, 10),
    ],
)
def test_backend_failures_are_shown_and_retried(
    world: World, error: be.BackendError, reason: str, delay: float
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())
    world.ipam.error = error
    assert world.reconcile() == Result.requeue_after(delay)
    condition = ready(world.stored())
    assert (condition["reason"], condition["message"]) == (reason, f"{DISPLAY}: {error.message}")
    assert capi.CLAIM_FINALIZER in world.stored()["metadata"]["finalizers"]
    assert world.kube.addresses == {}
    world.reset()
    assert world.reconcile() == Result.requeue_after(delay)
    assert world.kube.writes == []  # the same failure is not written again


def test_a_missing_secret_keeps_the_claim_waiting_with_pool_not_ready(world: World) -> None:
    world.kube.add_pool(phpipam_pool(secret="nope", status=pool_condition()))
    world.kube.add_claim(claim())
    assert world.reconcile() == Result.requeue_after(60)
    condition = ready(world.stored())
    assert condition["reason"] == Reason.POOL_NOT_READY
    assert "Secret ns/nope not found" in condition["message"]
    assert world.ipam.calls == []


def test_an_exhausted_pool_is_asked_once_per_hold_and_shown_once(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ipam.cidr = "10.0.0.0/30"  # hosts .1 (the gateway) and .2
    world.ipam.entries["someone.else"] = "10.0.0.2"
    world.kube.add_claim(claim())
    parked = Result.wait(POOL_TOKEN)
    probe = (pool_key(NS, KIND, POOL), world.ctx.settings.requeue_exhausted_seconds)
    assert world.reconcile() == parked  # parked under the pool: no timer of its own
    assert world.queue.added == [probe]  # the pool probes its IPAM for the waiting claims
    assert world.kube.ops() == ["claim.finalizer", "claim.status", "event"]
    condition = ready(world.stored())
    assert (condition["reason"], condition["message"]) == (
        Reason.POOL_EXHAUSTED,
        exhausted_message(DISPLAY),
    )
    assert [c[0] for c in world.ipam.calls] == ["allocate"]
    world.reset()
    # The gate is closed: no backend call, and the same condition is not written again.
    assert world.reconcile() == parked
    assert world.kube.writes == [] and world.ipam.calls == []
    # Another claim of the pool gets its finalizer and waits the same way.
    world.kube.add_claim(claim("c2"))
    world.reconcile("c2")
    assert world.ipam.calls == []
    assert ready(world.stored("c2"))["reason"] == Reason.POOL_EXHAUSTED
    world.reset()
    # After the hold one claim asks again; still full: still nothing to write.
    world.now += 6
    world.reconcile()
    world.reconcile("c2")
    assert [c[0] for c in world.ipam.calls] == ["allocate"]
    assert world.kube.writes == []
    # An address is freed: the next look binds the claim.
    world.ipam.entries.clear()
    world.now += 6
    assert world.reconcile() == Result.done()
    assert ready(world.stored())["reason"] == Reason.ALLOCATED


def test_a_conflict_on_the_claim_is_retried_soon_without_a_status_write(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())

    def conflict(*_: Any) -> None:
        raise ApiException(status=409, reason="Conflict")

    monkeypatch.setattr(world.kube, "set_claim_finalizer", conflict)
    assert world.reconcile() == Result.requeue_after(1.0)
    assert world.kube.writes == [] and world.ipam.calls == []


# -- v1beta1 claims on schemas that prune status.v1beta2 ---------------------------------------


@pytest.mark.parametrize("prunes", [True, False])
def test_a_v1beta1_claim_is_written_once_whatever_the_schema_keeps(
    monkeypatch: pytest.MonkeyPatch, prunes: bool
) -> None:
    world = World(monkeypatch, version="v1beta1")
    world.kube.prune_v1beta2 = prunes
    world.kube.add_claim(claim(version="v1beta1"))  # its pool is missing
    decision = world.reconcile()
    assert decision.wake_on == (POOL_TOKEN,)
    assert world.ctx.versions.v1beta2_kept is (not prunes)
    (write,) = world.kube.of("claim.status")
    assert "v1beta2" in write.detail  # the first write tells what the schema keeps
    assert ("v1beta2" in world.stored()["status"]) is not prunes
    assert capi.ready_of(world.stored()) == ("False", Reason.POOL_NOT_READY)
    for _ in range(3):
        world.reset()
        assert world.reconcile() == decision
        assert world.kube.writes == []
    # Another claim is written without status.v1beta2 when the schema prunes it.
    world.kube.add_claim(claim("c2", version="v1beta1"))
    world.reconcile("c2")
    (write,) = world.kube.of("claim.status")
    assert ("v1beta2" in write.detail) is not prunes
    # Bound, then looked at again: no write either.
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    assert world.reconcile() == Result.done()
    assert world.kube.addresses[(NS, "c1")]["apiVersion"] == f"{capi.GROUP}/v1beta1"
    assert capi.ready_of(world.stored()) == ("True", Reason.ALLOCATED)
    world.reset()
    assert world.reconcile() == Result.done()
    assert world.kube.writes == []


# -- release ------------------------------------------------------------------------------


def test_release_goes_where_the_allocation_went(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition(), hostnameSuffix="old.example"))
    bind(world)
    recorded = location_of(parse_pool(world.kube.pools[(NS, KIND, POOL)]))
    # The pool's spec is changed where immutability is not enforced.
    pool = world.kube.pools[(NS, KIND, POOL)]
    pool["spec"].update(endpoint="https://new.example.com", hostnameSuffix="new.example")
    pool["metadata"]["generation"] = 2
    # An exhausted gate is opened by a release.
    world.ctx.exhausted.hold((NS, KIND, POOL))
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.ipam.calls == [("release", "c1.ns.old.example", recorded)]
    assert world.ipam.entries == {}
    assert world.kube.ops() == [
        "address.finalizer",
        "address.delete",
        "claim.finalizer",
    ]  # no Event: the claim is going away
    assert world.kube.of("address.finalizer")[0].detail == (capi.ADDRESS_FINALIZER, False)
    assert world.kube.of("claim.finalizer")[0].detail == (capi.CLAIM_FINALIZER, False)
    assert world.kube.addresses == {} and (NS, "c1") not in world.kube.claims
    assert world.kube.events == []
    assert world.queue.added == [(pool_key(NS, KIND, POOL), 0.0)]
    assert world.queue.woken == [(POOL_TOKEN, 1)]  # one address freed: one waiter tries
    assert not world.ctx.exhausted.held((NS, KIND, POOL))


def test_an_unbound_claim_being_deleted_still_asks_the_pool(world: World) -> None:
    # A crash between the IPAM write and the IPAddress create: only the hostname knows.
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ipam.entries["c1.ns"] = "10.0.0.3"
    world.kube.add_claim(ours(deleting=True))
    assert world.reconcile() == Result.done()
    pool = parse_pool(world.kube.pools[(NS, KIND, POOL)])
    assert world.ipam.calls == [("release", "c1.ns", location_of(pool))]
    assert world.ipam.entries == {}
    assert world.kube.ops() == ["claim.finalizer"]
    assert world.kube.events == []
    assert (NS, "c1") not in world.kube.claims
    assert world.queue.woken == [(POOL_TOKEN, 1)]  # one address freed: one waiter tries


def test_an_unbound_claim_never_registered_is_let_go(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(ours(deleting=True))
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert world.kube.events == []  # nothing to release is a release that went well
    assert (NS, "c1") not in world.kube.claims


def _cache_lists_no_addresses(world: World) -> None:
    """Make the operator's IPAddress cache answer "absent" for every IPAddress.

    As a cache that missed an ADDED, or dropped an object on a late DELETED of an older
    one of its name (issue 32): the API server still has the IPAddress.
    """
    world.ctx.claims.cache.addresses.fill([])


def test_an_ipaddress_absent_from_the_cache_but_in_the_api_is_released(world: World) -> None:
    # The upgrade loss (issue 32): the cache said "absent", the IPAM had the entry, and the
    # claim was let go as ReleaseSkipped with its entry and its IPAddress left behind.
    bind(world)
    _cache_lists_no_addresses(world)
    world.delete()
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert world.ipam.entries == {}
    assert ("get_ip_address", f"{NS}/c1") in world.kube.reads  # asked the API server
    assert ("get_claim", f"{NS}/c1") in world.kube.reads
    assert world.kube.ops() == ["address.finalizer", "address.delete", "claim.finalizer"]
    assert world.kube.addresses == {} and world.kube.events == []


def test_an_unbound_claims_ipaddress_absent_from_the_cache_is_deleted(world: World) -> None:
    # A leader stopped between the IPAddress's create and the status write: the claim has no
    # status.addressRef, the cache has not seen the IPAddress yet.
    bind(world)
    del world.stored()["status"]
    _cache_lists_no_addresses(world)
    world.delete()
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert world.ipam.entries == {}
    assert world.kube.ops() == ["address.finalizer", "address.delete", "claim.finalizer"]
    assert world.kube.addresses == {} and world.kube.events == []


def test_a_bound_claim_whose_ipaddress_is_gone_without_evidence_of_a_move_is_released(
    world: World,
) -> None:
    bind(world)
    del world.kube.addresses[(NS, "c1")]  # gone, and nothing says it was moved
    world.delete()
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert world.ipam.entries == {}
    assert world.kube.ops() == ["claim.finalizer"]
    assert world.kube.events == []
    assert (NS, "c1") not in world.kube.claims


@pytest.mark.parametrize("on", ["claim", "address"])
def test_a_claim_moved_by_clusterctl_is_let_go_leaving_the_ipam_entry(
    world: World, on: str
) -> None:
    bind(world)
    # clusterctl move annotates what it deletes (real-cluster.md 13c); the cache has not
    # seen the annotation: the API server's objects decide.
    if on == "claim":
        world.stored()["metadata"]["annotations"] = {capi.MOVE_ANNOTATION: ""}
        del world.kube.addresses[(NS, "c1")]
    else:
        world.kube.addresses[(NS, "c1")]["metadata"]["annotations"][capi.MOVE_ANNOTATION] = ""
        _cache_lists_no_addresses(world)
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.ipam.calls == []
    assert world.kube.ops() == ["claim.finalizer", "event"]
    kind, reason, message = world.kube.events[0]
    assert (kind, reason) == ("Warning", "ReleaseSkipped")
    assert capi.MOVE_ANNOTATION in message and "ns/c1" in message
    assert world.ipam.entries == {"c1.ns": "10.0.0.2"}  # it belongs to the moved claim now
    assert (NS, "c1") not in world.kube.claims
    if on == "address":
        assert (NS, "c1") in world.kube.addresses  # clusterctl's to delete, not ours
    assert world.queue.woken == []


@pytest.mark.parametrize("problem", ["invalid", "another claim's"])
def test_an_ipaddress_not_the_claims_is_kept_and_the_hostname_entry_released(
    world: World, problem: str
) -> None:
    bind(world)
    stored = world.kube.addresses[(NS, "c1")]
    if problem == "invalid":
        stored["spec"]["prefix"] = "wide"  # not an integer: fails the IPAddress schema
        expected = "not a valid IPAddress"
    else:
        stored["spec"]["claimRef"]["name"] = "c2"
        expected = "another claim's (c2)"
    kept = copy.deepcopy(stored)
    world.delete()
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert world.ipam.entries == {}  # the entry of c1's hostname: this claim's
    assert world.kube.addresses == {(NS, "c1"): kept}  # not ours to delete
    assert world.kube.ops() == ["event", "claim.finalizer"]
    kind, reason, message = world.kube.events[0]
    assert (kind, reason) == ("Warning", Reason.ADDRESS_CONFLICT)
    assert expected in message and f"IPAddress {NS}/c1" in message


def test_a_claim_gone_from_the_api_is_not_released_from_the_cache(world: World) -> None:
    bind(world)
    _cache_lists_no_addresses(world)
    world.delete()
    stale = Claim.from_body(copy.deepcopy(world.stored()))  # as a lagging cache has it
    world.stored()["metadata"]["finalizers"] = []  # another pass let it go meanwhile
    assert _release(world.ctx.claims, stale) == Result.done()
    assert world.ipam.calls == [] and world.kube.writes == []


@pytest.mark.parametrize("case", ["orphan", "moved", "claim-exists", "live", "live-gc"])
def test_an_ipaddress_of_ours_whose_claim_is_gone_is_released(world: World, case: str) -> None:
    # 1f7aac2 allocated for a claim deleted before its finalizer write landed: the claim went
    # at once, its IPAddress was collected (deletionTimestamp) and is held by ProtectAddress.
    # Or the claim went without its finalizer (13e, or removed by hand) while the pool still
    # owns its IPAddress: the garbage collector leaves that live ("live"), dropping the claim
    # from its owners ("live-gc", real-cluster.md 13f).
    bind(world)
    address = world.kube.addresses[(NS, "c1")]
    if not case.startswith("live"):
        address["metadata"]["deletionTimestamp"] = DELETED_AT
    if case == "live-gc":
        refs = address["metadata"]["ownerReferences"]
        address["metadata"]["ownerReferences"] = [r for r in refs if r["kind"] != "IPAddressClaim"]
    if case == "moved":
        address["metadata"]["annotations"][capi.MOVE_ANNOTATION] = ""
    if case != "claim-exists":
        del world.kube.claims[(NS, "c1")]
    assert world.reconcile() == Result.done()
    if case in ("orphan", "live", "live-gc"):
        assert [c[0] for c in world.ipam.calls] == ["release"]
        assert world.ipam.entries == {} and world.kube.addresses == {}
        assert world.kube.ops() == ["address.finalizer", "address.delete"]
    else:
        assert world.ipam.calls == [] and world.kube.writes == []
        assert world.ipam.entries == {"c1.ns": "10.0.0.2"}


def test_every_release_decision_is_one_info_line(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="bridge.reconcilers.claims")

    def lines() -> list[tuple[str, str]]:
        found = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.getMessage().startswith("release of claim ns/")
        ]
        caplog.clear()
        return found

    bind(world)
    world.kube.add_cluster(NS, "c", spec={"paused": True})
    world.kube.add_claim(claim("c2", cluster="c", finalizers=(capi.CLAIM_FINALIZER,)))
    world.delete("c2")
    assert world.reconcile("c2") == Result.wait(cluster_token(NS, "c"))
    [(level, text)] = lines()
    assert level == "INFO" and text.startswith("release of claim ns/c2: waiting: until woken by")

    world.delete()
    world.ipam.error = be.BackendUnavailableError("IPAM down")
    world.reconcile()
    [(level, text)] = lines()
    assert level == "INFO" and "ns/c1: waiting: AllocationFailed" in text
    world.ipam.error = None
    assert world.reconcile() == Result.done()
    [(level, text)] = lines()
    assert level == "INFO" and text.startswith("release of claim ns/c1: released: released")

    bind(world, "c3")
    world.stored("c3")["metadata"]["annotations"] = {capi.MOVE_ANNOTATION: ""}
    world.delete("c3")
    assert world.reconcile("c3") == Result.done()
    [(level, text)] = lines()
    assert level == "INFO" and text.startswith("release of claim ns/c3: skipped: claim ns/c3")


def test_a_force_removed_address_still_waits_while_the_cluster_is_paused(world: World) -> None:
    world.kube.add_cluster(NS, "c")
    bind(world, cluster="c")
    del world.kube.addresses[(NS, "c1")]
    world.kube.add_cluster(NS, "c", spec={"paused": True})
    world.delete()
    assert world.reconcile() == Result.wait(cluster_token(NS, "c"))
    assert world.kube.writes == [] and world.ipam.calls == []
    assert capi.CLAIM_FINALIZER in world.stored()["metadata"]["finalizers"]


def test_a_paused_claim_is_not_released(world: World) -> None:
    bind(world)
    world.stored()["metadata"]["annotations"] = {capi.PAUSED_ANNOTATION: ""}
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == []
    assert (NS, "c1") in world.kube.addresses


def test_a_claim_whose_cluster_is_gone_is_still_released(world: World) -> None:
    world.kube.add_cluster(NS, "c")
    bind(world, cluster="c")
    del world.kube.clusters[(NS, "c")]
    world.delete()
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    assert (NS, "c1") not in world.kube.claims


def test_release_is_skipped_when_the_pool_is_gone(world: World) -> None:
    bind(world)
    del world.kube.pools[(NS, KIND, POOL)]
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.ipam.calls == [] and world.built == []
    assert world.kube.ops() == ["address.finalizer", "address.delete", "claim.finalizer", "event"]
    kind, reason, message = world.kube.events[0]
    assert (kind, reason) == ("Warning", "ReleaseSkipped")
    assert message == f"{DISPLAY} is gone; address 10.0.0.2 could not be released in the IPAM"
    assert world.kube.addresses == {} and (NS, "c1") not in world.kube.claims
    assert world.ipam.entries == {"c1.ns": "10.0.0.2"}
    assert world.queue.added == [(pool_key(NS, KIND, POOL), 0.0)]


def test_a_claim_being_deleted_without_our_finalizer_is_left_alone(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim(deleting=True, finalizers=("someone.else/keep",)))
    assert world.reconcile() == Result.done()
    assert world.kube.writes == [] and world.ipam.calls == []


def test_a_failed_release_keeps_the_claim_and_says_why(world: World) -> None:
    bind(world)
    world.delete()
    world.ipam.error = be.BackendUnavailableError("IPAM down")
    assert world.reconcile() == Result.requeue_after(10)
    assert capi.CLAIM_FINALIZER in world.stored()["metadata"]["finalizers"]
    assert (NS, "c1") in world.kube.addresses
    condition = ready(world.stored())
    assert (condition["status"], condition["reason"]) == ("False", Reason.ALLOCATION_FAILED)
    assert world.queue.woken == [] and world.queue.added == []
    world.ipam.error = None
    world.reset()
    assert world.reconcile() == Result.done()
    assert (NS, "c1") not in world.kube.claims


def test_a_refused_event_never_stops_a_release(world: World) -> None:
    bind(world)
    world.delete()
    world.kube.event_error = ApiException(status=403, reason="Forbidden")
    assert world.reconcile() == Result.done()
    assert (NS, "c1") not in world.kube.claims and world.kube.addresses == {}


# -- requested address, several subnets, grace period, Global pools (issue 12) ---------------

REQUESTED = capi.REQUESTED_ADDRESS_ANNOTATION


def requesting(world: World, address: str, name: str = "c1") -> Result:
    """Add a ready pool (when missing) and a claim asking for ``address``; reconcile it."""
    if (NS, KIND, POOL) not in world.kube.pools:
        world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim(name, annotations={REQUESTED: address}))
    return world.reconcile(name)


def test_a_requested_address_is_registered_under_the_claims_hostname(world: World) -> None:
    assert requesting(world, "10.0.0.5") == Result.done()
    assert world.ipam.entries == {"c1.ns": "10.0.0.5"}
    assert world.kube.addresses[(NS, "c1")]["spec"]["address"] == "10.0.0.5"
    assert ready(world.stored())["reason"] == Reason.ALLOCATED


def test_a_requested_address_held_by_another_fails_naming_it_and_waits(world: World) -> None:
    world.ipam.entries["db-1.infra"] = "10.0.0.5"
    decision = requesting(world, "10.0.0.5")
    assert decision == Result.requeue_after(world.ctx.settings.requeue_config_error_seconds)
    condition = ready(world.stored())
    assert condition["reason"] == Reason.ALLOCATION_FAILED
    assert "10.0.0.5" in condition["message"] and "db-1.infra" in condition["message"]
    assert world.ipam.entries == {"db-1.infra": "10.0.0.5"}  # nothing registered
    assert (NS, "c1") not in world.kube.addresses
    # Looking again changes nothing and writes nothing.
    world.reset()
    world.reconcile()
    assert world.kube.writes == []


@pytest.mark.parametrize("address", ["10.9.9.9", "not-an-ip"])
def test_a_requested_address_outside_the_pool_or_malformed_fails(
    world: World, address: str
) -> None:
    decision = requesting(world, address)
    assert decision == Result.requeue_after(world.ctx.settings.requeue_config_error_seconds)
    condition = ready(world.stored())
    assert condition["reason"] == Reason.ALLOCATION_FAILED and address in condition["message"]
    assert world.ipam.entries == {}
    if address == "not-an-ip":
        assert [c[0] for c in world.ipam.calls] == []  # refused before the IPAM is asked


def test_a_requested_address_is_tried_even_behind_the_exhaustion_gate(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.ctx.exhausted.hold((NS, KIND, POOL))
    world.kube.add_claim(claim(annotations={REQUESTED: "10.0.0.6"}))
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {"c1.ns": "10.0.0.6"}


def test_claims_fill_the_first_subnet_then_the_second_with_its_prefix_and_gateway(
    world: World,
) -> None:
    world.ipam.cidr, world.ipam.gateway = "10.0.0.0/30", "10.0.0.1"  # one address to give
    world.ipam.more = [("10.0.1.0/29", "10.0.1.6")]
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    for name in ("c1", "c2"):
        world.kube.add_claim(claim(name))
        assert world.reconcile(name) == Result.done()
    first, second = (world.kube.addresses[(NS, n)]["spec"] for n in ("c1", "c2"))
    assert (first["address"], first["prefix"], first["gateway"]) == ("10.0.0.2", 30, "10.0.0.1")
    assert (second["address"], second["prefix"], second["gateway"]) == ("10.0.1.1", 29, "10.0.1.6")


def test_release_with_a_grace_period_quarantines_the_entry(world: World) -> None:
    world.kube.add_pool(phpipam_pool(addressReuseGracePeriodSeconds=120, status=pool_condition()))
    world.kube.add_claim(claim())
    world.reconcile()
    world.reset()
    world.delete()
    assert world.reconcile() == Result.done()
    assert (NS, "c1") not in world.kube.claims and (NS, "c1") not in world.kube.addresses
    assert world.ipam.entries == {}
    hostname, until = world.ipam.quarantined["10.0.0.2"]
    assert hostname == "quarantined.c1.ns" and until > 1e9
    assert world.kube.events == []  # a release that went as it should posts no Event
    assert all(token != POOL_TOKEN for token in world.queue.woken)  # nothing was freed
    # A new claim does not get the quarantined address.
    world.kube.add_claim(claim("c2"))
    world.reconcile("c2")
    assert world.kube.addresses[(NS, "c2")]["spec"]["address"] == "10.0.0.3"


GLOBAL = "GlobalPHPIPAMIPPool"


def test_a_global_pool_serves_claims_of_two_namespaces(world: World) -> None:
    world.kube.add_secret("ipam", "creds", {"username": "u", "password": "p"})
    body = phpipam_pool("shared", status=pool_condition())
    body["kind"] = GLOBAL
    del body["metadata"]["namespace"]
    body["spec"]["credentialsRef"]["namespace"] = "ipam"
    world.kube.add_pool(body)
    for namespace in ("team-a", "team-b"):
        world.kube.add_claim(claim("m1", namespace, kind=GLOBAL, pool="shared"))
        assert reconcile_claim(world.ctx.claims, namespace, "m1") == Result.done()
    assert world.ipam.entries == {"m1.team-a": "10.0.0.2", "m1.team-b": "10.0.0.3"}
    address = world.kube.addresses[("team-b", "m1")]
    owner = address["metadata"]["ownerReferences"][1]
    assert (owner["kind"], owner["name"], owner["uid"]) == (GLOBAL, "shared", "uid-shared")
    assert address["spec"]["poolRef"]["kind"] == GLOBAL
    assert world.kube.read("get_pool")[0] == f"/{GLOBAL}/shared"


def test_a_claim_of_a_missing_global_pool_waits_under_the_pools_token(world: World) -> None:
    world.kube.add_claim(claim(kind=GLOBAL, pool="shared"))
    assert world.reconcile() == Result.wait(pool_token("", GLOBAL, "shared"))
    assert ready(world.stored())["message"] == f"{GLOBAL} shared not found"


# -- races at the Kubernetes boundary: each write's outcome decides ---------------------------


def test_a_claim_found_gone_at_its_finalizer_write_stops_before_the_ipam(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())
    original = world.kube.set_claim_finalizer

    def deleted_meanwhile(body: Any, finalizer: str, present: bool) -> Any:
        world.kube.claims.pop((NS, "c1"), None)  # deleted (nothing held it) after the read
        return original(body, finalizer, present)

    monkeypatch.setattr(world.kube, "set_claim_finalizer", deleted_meanwhile)
    assert world.reconcile() == Result.done()
    assert world.ipam.calls == [] and world.ipam.entries == {}
    assert world.kube.addresses == {}


def test_an_ipaddress_create_answering_409_adopts_the_claims_own(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    bind(world)
    address = world.kube.addresses[(NS, "c1")]
    world.stored()["status"] = {}  # e.g. its status write was lost before a restart
    # A lagging view: the claim's IPAddress is not seen, so the create answers 409.
    monkeypatch.setattr(world.kube, "get_ip_address", lambda *_: None)
    assert world.reconcile() == Result.done()
    assert ready(world.stored())["reason"] == Reason.ALLOCATED
    assert world.stored()["status"]["addressRef"]["name"] == "c1"
    assert world.kube.addresses[(NS, "c1")] == address  # adopted as it is
    assert not [e for e in world.kube.events if e[0] == "Warning"]
    assert [c[0] for c in world.ipam.calls] == ["allocate"]
    assert len(world.ipam.entries) == 1


def test_an_ipaddress_create_answering_409_with_a_foreign_one_is_an_error(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    bind(world)
    world.kube.addresses[(NS, "c1")]["spec"]["address"] = "10.0.0.7"  # not what the IPAM gave
    world.stored()["status"] = {}
    monkeypatch.setattr(world.kube, "get_ip_address", lambda *_: None)
    assert world.reconcile() != Result.done()
    assert ready(world.stored())["reason"] == Reason.ALLOCATION_FAILED
    assert "does not belong" in ready(world.stored())["message"]


def test_a_release_whose_finalizer_write_met_a_conflict_reads_the_claim_not_releasing_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Item 9 of issue 37: a 409 on the finalizer removal used to retry the whole release
    # (an IPAM call and 3 API calls) every second; it reads the claim and decides from it.
    bind(world)
    world.delete()
    original = world.kube.delete_ip_address

    def and_claim_changed(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        world.stored()["metadata"]["resourceVersion"] = "changed-by-someone"
        return result

    monkeypatch.setattr(world.kube, "delete_ip_address", and_claim_changed)
    assert world.reconcile() == Result.done()
    assert (NS, "c1") not in world.kube.claims and world.ipam.entries == {}
    assert [c[0] for c in world.ipam.calls] == ["release"]  # once
    assert world.kube.read("get_claim").count(f"{NS}/c1") >= 1  # read again after the 409
    assert world.kube.events == []  # no ReleaseSkipped: the release happened
    labels = (f"{NS}/{POOL}", KIND)
    assert world.ctx.metrics.releases.labels(*labels, "success")._value.get() == 1
    assert world.ctx.metrics.releases.labels(*labels, "skipped")._value.get() == 0


@pytest.mark.parametrize("then", ["gone", "let-go", "conflicts"])
def test_a_conflict_after_a_release_decides_from_the_claim_read_again(
    world: World, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    bind(world)
    world.delete()
    original = world.kube.set_claim_finalizer
    removals: list[str] = []

    def conflicting(claim_: Claim, finalizer: str, present: bool) -> Any:
        removals.append(claim_.resource_version)
        if then == "conflicts" or len(removals) == 1:
            stored = world.stored()["metadata"]
            stored["resourceVersion"] = world.kube._rv()  # another writer, each time
            if then == "gone":
                del world.kube.claims[(NS, "c1")]
            elif then == "let-go":
                stored["finalizers"] = []
        return original(claim_, finalizer, present)

    monkeypatch.setattr(world.kube, "set_claim_finalizer", conflicting)
    result = world.reconcile()
    assert [c[0] for c in world.ipam.calls] == ["release"]
    if then == "conflicts":  # 409s persist: the pass is retried, nothing counted
        assert result == Result.requeue_after(1.0)
        assert len(removals) == 5 and len(set(removals)) == 5  # each on the claim read again
        assert world.ctx.metrics.releases.labels(f"{NS}/{POOL}", KIND, "success")._value.get() == 0
    else:
        assert result == Result.done() and len(removals) == 1
        assert (NS, "c1") not in world.kube.claims or not world.stored()["metadata"]["finalizers"]


def test_a_pool_deleted_between_a_claims_look_and_its_finalizer_write_is_kept(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition(), finalizers=(capi.POOL_FINALIZER,)))
    world.kube.add_claim(claim())
    original = world.kube.set_claim_finalizer
    guard: list[Result] = []

    def pool_deleted_meanwhile(body: Any, finalizer: str, present: bool) -> Any:
        # The pool's deletion arrives and its guard runs while the claim is about to write.
        world.kube.pools[(NS, KIND, POOL)]["metadata"]["deletionTimestamp"] = DELETED_AT
        guard.append(pool_service.reconcile_pool(world.ctx.pools, NS, KIND, POOL))
        return original(body, finalizer, present)

    monkeypatch.setattr(world.kube, "set_claim_finalizer", pool_deleted_meanwhile)
    world.reconcile()
    assert guard and guard[0] != Result.done()  # the guard waited for the claim
    stored = world.kube.pools[(NS, KIND, POOL)]
    assert capi.POOL_FINALIZER in stored["metadata"]["finalizers"]
    assert "c1" in ready(stored)["message"]


def test_a_pool_deleted_before_the_cache_shows_it_waits_for_the_cache(world: World) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition(), finalizers=(capi.POOL_FINALIZER,)))
    world.kube.add_claim(claim())
    stored = world.kube.pools[(NS, KIND, POOL)]
    # What claims decide from: the pool as it was before its deletion (its event not seen yet).
    world.ctx.cache.pools.fill([((KIND, NS, POOL), copy.deepcopy(stored))])
    stored["metadata"]["deletionTimestamp"] = DELETED_AT
    guard = pool_service.reconcile_pool(world.ctx.pools, NS, KIND, POOL)  # e.g. queued by a release
    world.reconcile()  # the claim still sees the pool live, and registers in it
    assert guard != Result.done()
    if world.ipam.entries:  # never an entry in a pool that let go
        assert capi.POOL_FINALIZER in world.kube.pools[(NS, KIND, POOL)]["metadata"]["finalizers"]


def test_a_claim_deleted_while_its_status_is_written_is_queued_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())
    original = world.kube.patch_claim_status

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        # Deleted between the allocation and the status write: the write, guarded by the
        # resourceVersion read, meets 409; the claim read again shows the deletion.
        world.delete()
        return original(*args, **kwargs)

    monkeypatch.setattr(world.kube, "patch_claim_status", deleted_meanwhile)
    assert world.reconcile() == Result.done()
    assert (claim_key(NS, "c1"), 0.0) in world.queue.added
    monkeypatch.setattr(world.kube, "patch_claim_status", original)
    assert world.reconcile() == Result.done()  # the pass the queue runs again releases it
    assert (NS, "c1") not in world.kube.claims and world.ipam.entries == {}


def test_a_claim_gone_at_its_status_write_gets_no_event(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_claim(claim())  # its pool is missing: a Warning status is due
    original = world.kube.patch_claim_status

    def gone(*args: Any, **kwargs: Any) -> Any:
        world.kube.claims.pop((NS, "c1"), None)
        return original(*args, **kwargs)

    monkeypatch.setattr(world.kube, "patch_claim_status", gone)
    world.reconcile()
    assert world.kube.events == []


def test_a_condition_another_writer_added_before_the_status_write_is_kept(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status write is guarded by the resourceVersion read: a 409 re-reads and merges."""
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())
    original = world.kube.patch_claim_status
    other = {"type": "Audited", "status": "True", "reason": "Checked", "message": "by another"}
    calls: list[str | None] = []

    def another_writer_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("resource_version"))
        if len(calls) == 1:  # another writer's status write lands between read and write
            meta = world.stored()["metadata"]
            world.stored().setdefault("status", {})["conditions"] = [other]
            meta["resourceVersion"] = world.kube._rv()
        return original(*args, **kwargs)

    monkeypatch.setattr(world.kube, "patch_claim_status", another_writer_first)
    assert world.reconcile() == Result.done()
    conditions = world.stored()["status"]["conditions"]
    assert other in conditions
    assert [c["status"] for c in conditions if c["type"] == "Ready"] == ["True"]
    assert len(calls) == 2 and calls[0] != calls[1] and None not in calls


# -- a claim gone after its address was registered (issue 37: the storm leak) ---------------


@pytest.mark.parametrize("found", ["404", "409-then-gone", "409-then-made-again"])
def test_a_claim_found_gone_after_its_address_was_registered_is_undone_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, found: str
) -> None:
    # real-cluster.md 13e: our finalizer write answered 200, then a DELETE in flight removed
    # the claim anyway; the pass registered an address and created the IPAddress, and its
    # status write found the claim gone. It used to take that 404 as "done": a leak.
    caplog.set_level("INFO", logger="bridge.reconcilers.claims")
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())
    original = world.kube.patch_claim_status

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        del world.kube.claims[(NS, "c1")]
        if found == "409-then-made-again":  # made again under its name: another uid
            world.kube.add_claim(claim())
            world.stored()["metadata"]["uid"] = "uid-c1-again"
        if found == "404":
            return original(*args, **kwargs)
        return KubeWrite(Outcome.CONFLICT)  # the write met 409: the claim is read again

    monkeypatch.setattr(world.kube, "patch_claim_status", deleted_meanwhile)
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["allocate", "release"]
    assert world.ipam.entries == {}
    assert world.kube.addresses == {}
    assert world.kube.ops()[-2:] == ["address.finalizer", "address.delete"]
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("release of")]
    assert line.startswith(
        "release of claim ns/c1: released: its claim is gone (found by a write of ours); "
        "IPAddress c1 deleted; released 10.0.0.2 in"
    )


@pytest.mark.parametrize("gone", [True, False])
def test_a_claim_gone_before_its_ipaddress_could_be_created_releases_its_entry_at_once(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, gone: bool
) -> None:
    # 13e, then the IPAddress create refused (403: the namespace is being terminated): no
    # IPAddress names the entry, so no later pass could find it; this pass releases it.
    caplog.set_level("INFO", logger="bridge.reconcilers.claims")
    world.kube.add_pool(phpipam_pool(status=pool_condition()))
    world.kube.add_claim(claim())

    def refused(*args: Any, **kwargs: Any) -> Any:
        if gone:
            del world.kube.claims[(NS, "c1")]
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(world.kube, "create_ip_address", refused)
    if not gone:  # the claim is still there: the error is the queue's to retry, entry kept
        with pytest.raises(ApiException):
            world.reconcile()
        assert [c[0] for c in world.ipam.calls] == ["allocate"]
        assert len(world.ipam.entries) == 1
        return
    assert world.reconcile() == Result.done()
    assert [c[0] for c in world.ipam.calls] == ["allocate", "release"]
    assert world.ipam.entries == {} and world.kube.addresses == {}
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("release of")]
    assert line.startswith("release of claim ns/c1: released: its claim is gone and its")


def test_a_claim_gone_when_its_finalizer_is_put_back_undoes_its_binding(world: World) -> None:
    bind(world)
    world.stored()["metadata"]["finalizers"] = []  # e.g. removed by hand
    world.ctx.claims.cache.claims.fill([((NS, "c1"), copy.deepcopy(world.stored()))])
    del world.kube.claims[(NS, "c1")]  # and the claim deleted since: the cache lags
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {} and world.kube.addresses == {}


@pytest.mark.parametrize("case", ["paused", "foreign-pool", "moved"])
def test_a_live_ipaddress_whose_claim_is_gone_is_left_when_not_ours_to_release(
    world: World, case: str
) -> None:
    world.kube.add_cluster(NS, "c")
    bind(world, cluster="c")
    address = world.kube.addresses[(NS, "c1")]
    assert address["metadata"]["labels"] == {capi.CLUSTER_NAME_LABEL: "c"}
    if case == "paused":  # clusterctl move deletes the claims before it annotates IPAddresses
        world.kube.add_cluster(NS, "c", spec={"paused": True})
    elif case == "foreign-pool":
        address["spec"]["poolRef"]["kind"] = "InClusterIPPool"
        address["spec"]["poolRef"]["apiGroup"] = "ipam.cluster.x-k8s.io"
    else:
        address["metadata"]["annotations"][capi.MOVE_ANNOTATION] = ""
    del world.kube.claims[(NS, "c1")]
    result = world.reconcile()
    assert world.ipam.calls == [] and world.kube.writes == []
    assert (NS, "c1") in world.kube.addresses and world.ipam.entries == {"c1.ns": "10.0.0.2"}
    if case == "paused":
        assert result == Result.wait(cluster_token(NS, "c"))
        world.kube.add_cluster(NS, "c")  # unpaused: the wait ends, the orphan is released
        assert world.reconcile() == Result.done()
        assert world.ipam.entries == {} and world.kube.addresses == {}


def test_ipaddress_events_queue_the_claim_their_claim_ref_names(world: World) -> None:
    # controller-runtime's Owns(): the garbage collector's patch of an IPAddress whose claim
    # went (13f) used to queue nothing, and the IPAddress and its entry stayed for ever.
    bind(world)
    sink = AddressEvents(world.ctx)
    cache = world.ctx.cache.addresses
    body = copy.deepcopy(world.kube.addresses[(NS, "c1")])
    key = (NS, "c1")
    cache.fill([(key, copy.deepcopy(body))])
    expected = ("ipaddresses", NS, "c1")

    # Our own write's echo queues nothing.
    body["metadata"]["resourceVersion"] = "echo"
    world.ctx.cache.expectations.wrote(expected, "echo")
    sink.event(Event("MODIFIED", key, copy.deepcopy(body), cache.apply(key, copy.deepcopy(body))))
    assert world.queue.added == []

    # The claim went; the garbage collector drops it from the owners: the claim is queued.
    del world.kube.claims[(NS, "c1")]
    refs = body["metadata"]["ownerReferences"]
    body["metadata"]["ownerReferences"] = [r for r in refs if r["kind"] != "IPAddressClaim"]
    body["metadata"]["resourceVersion"] = "gc"
    sink.event(Event("MODIFIED", key, copy.deepcopy(body), cache.apply(key, copy.deepcopy(body))))
    assert world.queue.added == [(claim_key(NS, "c1"), 0.0)]

    # Its pass releases the IPAddress (the API server confirms the claim is gone).
    world.kube.addresses[(NS, "c1")] = copy.deepcopy(body)
    assert world.reconcile() == Result.done()
    assert world.ipam.entries == {} and world.kube.addresses == {}

    # A listing queues the claim of every IPAddress (start-up: what went while no leader ran).
    world.queue.added.clear()
    sink.listed(Listed([((NS, "other"), {**body, "metadata": {"namespace": NS, "name": "x"}})]))
    assert world.queue.added == [(claim_key(NS, "c1"), 0.0)]


# -- binding checks the owner's uid and the deletion (issue 37, item 3) ---------------------


@pytest.mark.parametrize("predecessor", ["live", "deleting"])
def test_a_claim_made_again_under_its_name_is_never_bound_to_its_predecessors_ipaddress(
    world: World, predecessor: str
) -> None:
    bind(world)
    old = world.kube.addresses[(NS, "c1")]
    if predecessor == "deleting":
        old["metadata"]["deletionTimestamp"] = DELETED_AT  # collected, held by ProtectAddress
    # CAPV's names are deterministic: the claim is deleted and made again (another uid).
    del world.kube.claims[(NS, "c1")]
    world.kube.add_claim(claim())
    world.stored()["metadata"]["uid"] = "uid-c1-again"
    first = world.reconcile()
    assert "status" not in world.stored() or not world.stored()["status"].get("addressRef")
    assert world.kube.of("claim.status") == []  # never Ready against the old IPAddress
    assert first == Result.requeue_after(0.0)
    assert world.kube.addresses == {} and world.ipam.entries == {}  # released, deleted
    assert world.reconcile() == Result.done()  # then an address of its own
    new = world.kube.addresses[(NS, "c1")]
    [owner] = [r for r in new["metadata"]["ownerReferences"] if r["kind"] == "IPAddressClaim"]
    assert owner["uid"] == "uid-c1-again"
    assert ready(world.stored())["reason"] == Reason.ALLOCATED


def test_an_own_ipaddress_vanishing_without_protect_address_is_not_bound(world: World) -> None:
    bind(world)
    address = world.kube.addresses[(NS, "c1")]
    address["metadata"]["finalizers"] = ["someone.else/keep"]
    address["metadata"]["deletionTimestamp"] = DELETED_AT
    world.stored()["status"] = {}  # e.g. a moved claim, rebuilt from its IPAddress
    assert world.reconcile() == Result.done()  # its DELETED event queues the claim (Owns())
    assert world.kube.writes == [] and world.ipam.calls == []
    # Held by our ProtectAddress, it still binds: the contract keeps it while the claim lives.
    address["metadata"]["finalizers"] = [capi.ADDRESS_FINALIZER]
    assert world.reconcile() == Result.done()
    assert world.stored()["status"]["addressRef"]["name"] == "c1"


def test_an_ipaddress_whose_deletion_of_ours_is_on_its_way_is_waited_for_not_read(
    world: World,
) -> None:
    # A release's own IPAddress writes (its finalizer off, then its deletion) queue the claim
    # (Owns()); that pass waits for the deletion's event instead of asking the API server.
    bind(world)
    body = copy.deepcopy(world.kube.addresses[(NS, "c1")])
    world.ctx.cache.addresses.fill([((NS, "c1"), body)])
    world.ctx.cache.claims.fill([])
    del world.kube.claims[(NS, "c1")], world.kube.addresses[(NS, "c1")]
    key = ("ipaddresses", NS, "c1")
    world.ctx.cache.expectations.wrote(key, GONE)
    result = world.reconcile()
    assert result.wake_on == (world.ctx.cache.expectations.token(key),)
    assert world.kube.reads == [] and world.kube.writes == [] and world.ipam.calls == []
