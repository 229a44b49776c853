"""pools: pool checks, the deletion guard and the Secrets' finalizer, with fakes."""

from __future__ import annotations

import json
import threading
from typing import Any, cast

import pytest
from fakes import (
    DELETED_AT,
    FakeBackend,
    FakeIPAM,
    FakeKube,
    FakeQueue,
    claim,
    install_backend,
    ours,
    phpipam_pool,
    pool_condition,
)

from backends import errors as be
from backends.flowcontrol import FlowControl
from bridge import capi
from bridge.capi import Reason
from bridge.models import IPPool
from bridge.objects.client import ObjectClient
from bridge.objects.keys import pool_token
from bridge.operator import Operator
from bridge.reconcilers.context import ServedVersions
from bridge.reconcilers.errors import PoolError
from bridge.reconcilers.pool_backends import parse_pool, with_location
from bridge.reconcilers.pools import (
    CREDENTIALS_FINALIZER,
    SECRETS_ANNOTATION,
    needs_check,
    purge_quarantined,
    reconcile_pool,
    users_of,
)
from bridge.runtime.workqueue import Result
from bridge.settings import Settings

NS = "ns"
KIND = "PHPIPAMIPPool"
TOKEN = pool_token(NS, KIND, "pool")
POOL_ENDPOINT = "https://ipam.example.com"  # the fake pools' spec.endpoint
PROTECT = (capi.POOL_FINALIZER, True)


class World:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kube = FakeKube()
        self.ipam = FakeIPAM(timeline=self.kube.timeline)
        self.built = install_backend(monkeypatch, self.ipam)
        self.queue = FakeQueue()
        self.ctx = Operator(
            settings=Settings(),
            kube=cast(ObjectClient, self.kube),
            versions=ServedVersions("v1beta2"),
            flow=FlowControl(clock=lambda: 0.0),
            queue=self.queue,
        )
        self.kube.add_secret(NS, "creds", {"username": "u", "password": "p"})

    def reconcile(self, name: str = "pool", kind: str = KIND, namespace: str = NS) -> Result:
        return reconcile_pool(self.ctx.pools, namespace, kind, name)

    def stored(self, name: str = "pool", kind: str = KIND) -> dict[str, Any]:
        return self.kube.pools[(NS, kind, name)]

    def ready(self, name: str = "pool") -> dict[str, Any]:
        return next(c for c in self.stored(name)["status"]["conditions"] if c["type"] == "Ready")

    def delete(self, name: str = "pool", kind: str = KIND) -> None:
        self.stored(name, kind)["metadata"]["deletionTimestamp"] = DELETED_AT

    def reset(self) -> None:
        self.kube.writes.clear()
        self.kube.reads.clear()
        self.kube.timeline.clear()
        self.ipam.calls.clear()
        self.queue.added.clear()
        self.queue.woken.clear()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    return World(monkeypatch)


def infoblox_pool(name: str, secret: str, namespace: str = NS, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{capi.GROUP}/v1alpha1",
        "kind": "InfobloxIPPool",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
        "spec": {
            "endpoint": "https://ib.example.com",
            "subnet": "10.1.0.0/24",
            "credentialsRef": {"name": secret},
        },
    }


# -- needs_check ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "listing", "expected"),
    [
        (phpipam_pool(status=pool_condition()), False, False),
        (phpipam_pool(status=pool_condition("False", "AuthenticationFailed")), False, False),
        (phpipam_pool(status=pool_condition()), True, True),
        (phpipam_pool(status=pool_condition(), deleting=True), False, True),
        (phpipam_pool(), False, True),  # new, or moved without status
        (phpipam_pool(status={"observedGeneration": 1}), False, True),  # no Ready yet
        (phpipam_pool(generation=2, status=pool_condition(generation=1)), False, True),
    ],
    ids=["steady", "steady-failing", "listing", "deleting", "no-status", "no-ready", "spec"],
)
def test_needs_check(body: dict[str, Any], listing: bool, expected: bool) -> None:
    assert needs_check(IPPool.from_body(body), listing=listing) is expected


def test_our_own_status_write_needs_no_check(world: World) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    assert needs_check(IPPool.from_body(world.stored()), listing=False) is False


# -- backend_for ----------------------------------------------------------------------------


def test_backend_for_reuses_the_client_until_spec_or_secret_change(world: World) -> None:
    pool = parse_pool(phpipam_pool())
    first = world.ctx.clients.backend_for(pool)
    assert world.ctx.clients.backend_for(pool) is first
    assert len(world.built) == 1
    assert world.kube.read("read_secret") == ["ns/creds", "ns/creds"]  # read every time
    world.kube.secrets[(NS, "creds")]["data"]["password"] = "rotated"
    second = world.ctx.clients.backend_for(pool)
    assert second is not first and world.built == [first, second]
    assert world.built[0].closed and not world.built[1].closed


def test_backend_for_names_the_missing_secret_or_ca_key(world: World) -> None:
    with pytest.raises(PoolError) as missing:
        world.ctx.clients.backend_for(parse_pool(phpipam_pool(secret="nope")))
    assert missing.value.reason == Reason.CREDENTIALS_NOT_FOUND
    assert missing.value.needs_person
    assert "Secret ns/nope not found" in missing.value.message
    world.kube.add_secret(NS, "ca", {"other.pem": "x"})
    with_ca = parse_pool(phpipam_pool(tls={"caSecretRef": {"name": "ca", "key": "bundle.pem"}}))
    with pytest.raises(PoolError) as no_key:
        world.ctx.clients.backend_for(with_ca)
    assert no_key.value.reason == Reason.CREDENTIALS_NOT_FOUND
    assert "ns/ca" in no_key.value.message and "'bundle.pem'" in no_key.value.message
    assert world.built == []
    world.kube.secrets[(NS, "ca")]["data"]["bundle.pem"] = "PEM"
    assert world.ctx.clients.backend_for(with_ca) is world.built[0]


def test_backend_for_a_secret_being_deleted_still_works(world: World) -> None:
    world.kube.add_secret(
        NS, "creds", {"token": "t"}, finalizers=(CREDENTIALS_FINALIZER,), deleting=True
    )
    assert world.ctx.clients.backend_for(parse_pool(phpipam_pool())) is world.built[0]


def test_a_recorded_location_gets_its_own_client(world: World) -> None:
    pool = parse_pool(phpipam_pool())
    current = cast(FakeBackend, world.ctx.clients.backend_for(pool))
    old = with_location(pool, json.dumps({"endpoint": "https://old.example.com", "appId": "a"}))
    elsewhere = cast(FakeBackend, world.ctx.clients.backend_for(old))
    assert elsewhere.location != current.location
    # The docstring: "the cache key includes its spec, so another location gets its own
    # client". The current client must stay open (another worker may be using it).
    assert not current.closed
    assert world.ctx.clients.backend_for(pool) is current


# -- live pools -----------------------------------------------------------------------------


def test_a_new_pool_is_protected_checked_and_wakes_its_claims(world: World) -> None:
    world.kube.add_secret(NS, "ca", {"ca.crt": "PEM"})
    world.kube.add_pool(phpipam_pool(tls={"caSecretRef": {"name": "ca"}}))
    world.ipam.entries["someone"] = "10.0.0.2"
    world.ctx.exhausted.hold((NS, KIND, "pool"))
    assert world.reconcile() == Result.done()
    assert world.kube.ops() == [
        "pool.finalizer",
        "pool.annotate",  # the Secrets it protects, remembered before they are protected
        "secret.finalizer",
        "secret.finalizer",
        "pool.status",
        "event",
    ]
    assert world.kube.of("pool.finalizer")[0].detail == PROTECT
    assert [w.target for w in world.kube.of("secret.finalizer")] == ["ns/creds", "ns/ca"]
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    assert world.kube.secret_finalizers(NS, "ca") == [CREDENTIALS_FINALIZER]
    status = world.stored()["status"]
    assert status["ipAddresses"] == {"total": 6, "used": 2, "free": 4}
    assert (status["subnet"], status["prefix"], status["gateway"]) == (
        "10.0.0.0/29",
        29,
        "10.0.0.1",
    )
    assert status["observedGeneration"] == 1
    assert (world.ready()["status"], world.ready()["reason"]) == ("True", Reason.POOL_READY)
    assert world.kube.events[0][:2] == ("Normal", Reason.POOL_READY)
    assert world.queue.woken == [TOKEN]
    assert [c[0] for c in world.ipam.calls] == ["describe_subnets"]
    # A check that finds free addresses opens the exhaustion gate.
    assert not world.ctx.exhausted.held((NS, KIND, "pool"))
    # The periodic refresh of a pool that did not change writes nothing.
    world.reset()
    assert world.reconcile() == Result.done()
    assert world.kube.writes == []
    assert [c[0] for c in world.ipam.calls] == ["describe_subnets"]
    # Still Ready, with free addresses: one claim waiting for an address (if any) tries.
    assert world.queue.woken == [(TOKEN, 1)]


def test_usage_changes_are_written_without_an_event(world: World) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    world.ready()["lastTransitionTime"] = transition = "2020-01-01T00:00:00Z"
    world.reset()
    world.ipam.entries["someone"] = "10.0.0.2"
    world.reconcile()
    (write,) = world.kube.of("pool.status")
    assert write.detail["ipAddresses"] == {"total": 6, "used": 2, "free": 4}
    # Usage lives in status fields: the conditions are not written again.
    assert set(write.detail) == {"ipAddresses", "subnets"}
    assert world.ready()["message"] == "subnet 10.0.0.0/29 found; usage in status.ipAddresses"
    assert world.ready()["lastTransitionTime"] == transition  # not a transition
    assert world.kube.events == []


IN_SYNC = {
    "type": "InSync",
    "status": "True",
    "reason": "InSync",
    "message": "the IPAM and the cluster agree",
    "lastTransitionTime": "2020-01-01T00:00:00Z",
}


def audit_writes_during_the_check(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the drift audit write ``InSync`` while the pool's IPAM call runs."""
    describe = FakeBackend.describe_subnets

    def with_audit(backend: FakeBackend) -> Any:
        stored = world.stored()
        conditions = stored.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c["type"] != "InSync"] + [dict(IN_SYNC)]
        stored["metadata"]["resourceVersion"] = world.kube._rv()
        return describe(backend)

    monkeypatch.setattr(FakeBackend, "describe_subnets", with_audit)


def test_a_ready_write_never_drops_the_audits_condition_written_meanwhile(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool())
    audit_writes_during_the_check(world, monkeypatch)
    world.reconcile()
    types = [c["type"] for c in world.stored()["status"]["conditions"]]
    assert sorted(types) == ["InSync", "Ready"]
    assert world.ready()["status"] == "True"
    # The first write met 409 (the audit wrote since the pool was read); the second merged.
    assert [w.op for w in world.kube.writes].count("pool.status") == 1
    assert ("read", "get_pool", f"{NS}/{KIND}/pool") in world.kube.timeline[1:]


def test_a_failure_write_never_drops_the_audits_condition_written_meanwhile(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    world.ipam.error = be.BackendUnavailableError("IPAM down")
    audit_writes_during_the_check(world, monkeypatch)
    world.reconcile()
    conditions = {c["type"]: c for c in world.stored()["status"]["conditions"]}
    assert conditions["InSync"] == IN_SYNC
    assert conditions["Ready"]["status"] == "False"


def test_the_ready_message_does_not_change_with_usage(world: World) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    before = dict(world.ready())
    for i in range(3):
        world.ipam.entries[f"host-{i}"] = f"10.0.0.{i + 2}"
        world.reconcile()
        assert world.ready() == before
    assert world.stored()["status"]["ipAddresses"]["used"] == 4


@pytest.mark.parametrize(
    ("secret", "error", "reason", "delay"),
    [
        ("nope", None, Reason.CREDENTIALS_NOT_FOUND, 60),
        ("creds", be.AuthenticationFailedError("login refused"), "AuthenticationFailed", 60),
        ("creds", be.SubnetNotFoundError("no such subnet"), Reason.SUBNET_NOT_FOUND, 60),
        ("creds", be.BackendUnavailableError("timed out"), Reason.BACKEND_UNAVAILABLE, 10),
    ],
)
def test_a_failing_pool_is_shown_once_and_wakes_its_claims_once(
    world: World, secret: str, error: be.BackendError | None, reason: str, delay: float
) -> None:
    world.kube.add_pool(phpipam_pool(secret=secret))
    world.ipam.error = error
    assert world.reconcile() == Result.requeue_after(delay)
    assert world.kube.ops()[0] == "pool.finalizer"
    assert world.kube.ops()[-2:] == ["pool.status", "event"]
    condition = world.ready()
    assert (condition["status"], condition["reason"]) == ("False", reason)
    assert world.stored()["status"]["observedGeneration"] == 1
    assert world.kube.events[0][:2] == ("Warning", reason)
    # Claims that waited for the pool's first check learn what it found (PoolNotReady).
    assert world.queue.woken == [TOKEN]
    world.reset()
    assert world.reconcile() == Result.requeue_after(delay)
    assert world.kube.writes == []
    assert world.queue.woken == []  # the same failure again: nobody to tell
    # Fixed: Ready, one Event, the waiting claims are woken.
    world.kube.add_secret(NS, secret, {"username": "u", "password": "p"})
    world.ipam.error = None
    assert world.reconcile() == Result.done()
    assert world.ready()["status"] == "True"
    assert [e[:2] for e in world.kube.events] == [("Normal", Reason.POOL_READY)]
    assert world.queue.woken == [TOKEN]


def test_an_invalid_pool_is_shown_without_asking_any_ipam(world: World) -> None:
    world.kube.add_pool(phpipam_pool(endpoint="ftp://nowhere"))
    assert world.reconcile() == Result.requeue_after(60)
    assert world.ready()["reason"] == Reason.INVALID_SPEC
    assert world.ipam.calls == [] and world.kube.of("secret.finalizer") == []


def test_a_pool_that_is_gone_drops_its_client_and_wakes_its_claims(world: World) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    world.ctx.exhausted.hold((NS, KIND, "pool"))
    del world.kube.pools[(NS, KIND, "pool")]
    world.reset()
    assert world.reconcile() == Result.done()
    assert world.kube.writes == []
    assert world.built[0].closed and len(world.ctx.backends) == 0
    assert world.queue.woken == [TOKEN]
    assert len(world.ctx.exhausted) == 0  # nothing of the pool stays in memory


# -- the deletion guard ---------------------------------------------------------------------


def test_users_of_counts_claims_carrying_release_address_and_ipaddresses(world: World) -> None:
    kube = world.kube
    kube.add_claim(ours(name="holding"))  # between its IPAM write and its IPAddress
    kube.add_claim(ours(name="bound", address_ref="bound"))
    kube.add_claim(claim(name="waiting"))  # no finalizer: holds nothing
    kube.add_claim(ours(name="other-pool", pool="other"))
    kube.add_claim(ours(name="other-kind", kind="InfobloxIPPool"))
    kube.add_claim(ours(name="elsewhere", namespace="other"))
    for name, pool in (("bound", "pool"), ("orphan", "pool"), ("x", "other")):
        kube.add_address(
            capi.build_ip_address(
                capi.Claim.from_body(claim(name=name, pool=pool)),
                version="v1beta2",
                pool_uid="u",
                address="10.0.0.9",
                prefix=29,
                gateway=None,
                hostname=f"{name}.ns",
            )
        )
    assert users_of(world.ctx.pools, NS, KIND, "pool") == [
        "IPAddress bound",
        "IPAddress orphan",
        "IPAddressClaim bound",
        "IPAddressClaim holding",
    ]
    assert users_of(world.ctx.pools, NS, "InfobloxIPPool", "pool") == ["IPAddressClaim other-kind"]
    assert users_of(world.ctx.pools, NS, KIND, "nothing") == []


def test_a_pool_being_deleted_waits_for_what_may_hold_an_entry(world: World) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    world.kube.add_claim(ours(name="holding"))
    world.kube.add_claim(claim(name="waiting"))
    world.delete()
    world.reset()
    decision = world.reconcile()
    assert decision == Result.requeue_after(world.ctx.settings.requeue_config_error_seconds)
    assert world.kube.ops() == ["pool.status", "event"]
    condition = world.ready()
    assert (condition["status"], condition["reason"]) == ("False", Reason.DELETION_BLOCKED)
    assert (
        "1 object(s)" in condition["message"] and "IPAddressClaim holding" in condition["message"]
    )
    assert "waiting" not in condition["message"]
    assert capi.POOL_FINALIZER in world.stored()["metadata"]["finalizers"]
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    assert world.queue.woken == [TOKEN]  # its waiting claims learn that it goes
    assert world.ipam.calls == []
    world.reset()
    assert world.reconcile() == decision
    assert world.kube.writes == []
    # The claim is released: the pool goes, its Secret is let go, its client closed.
    del world.kube.claims[(NS, "holding")]
    world.reset()
    assert world.reconcile() == Result.done()
    assert world.kube.ops() == ["secret.finalizer", "pool.finalizer"]
    assert world.kube.of("pool.finalizer")[0].detail == (capi.POOL_FINALIZER, False)
    assert (NS, KIND, "pool") not in world.kube.pools
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert world.built[0].closed and len(world.ctx.backends) == 0


def test_a_long_list_of_users_is_shortened(world: World) -> None:
    world.kube.add_pool(phpipam_pool(deleting=True, finalizers=(capi.POOL_FINALIZER,)))
    for index in range(7):
        world.kube.add_claim(ours(name=f"c{index}"))
    world.reconcile()
    message = world.ready()["message"]
    assert "7 object(s)" in message and "IPAddressClaim c4" in message
    assert "IPAddressClaim c5" not in message and "and 2 more" in message


def test_a_deleted_pools_secrets_are_let_go_only_when_no_other_pool_reads_them(
    world: World,
) -> None:
    kube = world.kube
    for name in ("shared", "ca-a", "own"):
        kube.add_secret(NS, name, {"username": "u", "password": "p", "ca.crt": "PEM"})
    kube.add_secret("other", "ca-a", {"username": "u", "password": "p"})
    kube.add_pool(phpipam_pool("a", secret="shared", tls={"caSecretRef": {"name": "ca-a"}}))
    kube.add_pool(phpipam_pool("b", secret="own"))
    kube.add_pool(infoblox_pool("ib", "shared"))  # another kind reads "shared"
    kube.add_pool(infoblox_pool("elsewhere", "ca-a", namespace="other"))
    for name, kind, namespace in (
        ("a", KIND, NS),
        ("b", KIND, NS),
        ("ib", "InfobloxIPPool", NS),
        ("elsewhere", "InfobloxIPPool", "other"),
    ):
        world.reconcile(name, kind, namespace)
    for name in ("shared", "ca-a", "own"):
        assert kube.secret_finalizers(NS, name) == [CREDENTIALS_FINALIZER], name
    world.delete("a")
    world.reset()
    assert world.reconcile("a") == Result.done()
    assert [w.target for w in kube.of("secret.finalizer")] == ["ns/ca-a"]
    assert kube.secret_finalizers(NS, "shared") == [CREDENTIALS_FINALIZER]
    assert kube.secret_finalizers(NS, "ca-a") == []
    assert kube.secret_finalizers("other", "ca-a") == [CREDENTIALS_FINALIZER]
    # The last pool that reads a Secret lets it go.
    world.delete("ib", "InfobloxIPPool")
    world.reconcile("ib", "InfobloxIPPool")
    assert kube.secret_finalizers(NS, "shared") == []
    assert kube.secret_finalizers(NS, "own") == [CREDENTIALS_FINALIZER]


def test_a_secret_being_deleted_gets_no_new_finalizer_but_keeps_its_own(world: World) -> None:
    world.kube.add_secret(NS, "creds", {"token": "t"}, deleting=True)
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert world.ready()["status"] == "True"  # still readable for releases


def test_a_secret_no_pool_reads_any_more_is_let_go(world: World) -> None:
    world.kube.add_secret(NS, "new-creds", {"username": "u", "password": "p2"})
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    # Credentials rotated into another Secret (credentialsRef is mutable).
    pool = world.stored()
    pool["spec"]["credentialsRef"] = {"name": "new-creds"}
    pool["metadata"]["generation"] = 2
    world.reconcile()
    world.delete()
    world.reconcile()
    assert (NS, KIND, "pool") not in world.kube.pools
    assert world.kube.secret_finalizers(NS, "new-creds") == []
    assert world.kube.secret_finalizers(NS, "creds") == []


def test_two_pools_sharing_a_secret_deleted_at_once_let_it_go(world: World) -> None:
    kube = world.kube
    for name in ("a", "b"):
        kube.add_pool(phpipam_pool(name))
        world.reconcile(name)
        world.delete(name)
    assert kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    # Worker 1 reconciles pool a; while it lists the other pools, worker 2 starts on b (and
    # must wait for a's decision about the shared Secret: the namespace lock).
    workers: list[threading.Thread] = []

    def worker_2(namespace: str) -> None:
        if not workers:
            workers.append(threading.Thread(target=world.reconcile, args=("b",)))
            workers[0].start()
            workers[0].join(0.2)  # it gets as far as the lock, no further

    kube.on_list_pools = worker_2
    world.reconcile("a")
    workers[0].join(5)
    assert len(workers) == 1 and not workers[0].is_alive()
    assert kube.pools == {}  # both pools are gone...
    assert kube.secret_finalizers(NS, "creds") == []  # ...and nothing holds their Secret


def test_a_deleted_pool_whose_secret_changed_meanwhile_stays_until_it_is_let_go(
    world: World,
) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    world.delete()
    # The Secret changes between the read and the write of its finalizer (409 Conflict).
    world.kube.secret_conflicts[(NS, "creds")] = 1
    world.reset()
    assert world.reconcile() == Result.requeue_after(1.0)  # retried soon, no crash
    assert (NS, KIND, "pool") in world.kube.pools  # ProtectPool kept: it remembers the Secret
    assert capi.POOL_FINALIZER in world.stored()["metadata"]["finalizers"]
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    assert world.kube.ops() == []
    # The retry lets the Secret go, then the pool.
    assert world.reconcile() == Result.done()
    assert world.kube.ops() == ["secret.finalizer", "pool.finalizer"]
    assert (NS, KIND, "pool") not in world.kube.pools
    assert world.kube.secret_finalizers(NS, "creds") == []


def test_a_secret_that_changed_before_its_protection_is_protected_on_a_retry(
    world: World,
) -> None:
    world.kube.add_pool(phpipam_pool())
    world.kube.secret_conflicts[(NS, "creds")] = 1
    assert world.reconcile() == Result.requeue_after(1.0)
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert world.ipam.calls == []  # no check of a pool whose Secret is not protected yet
    assert world.reconcile() == Result.done()
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    assert world.ready()["status"] == "True"


def test_a_secret_no_longer_read_that_changed_meanwhile_stays_remembered(world: World) -> None:
    world.kube.add_secret(NS, "new-creds", {"username": "u", "password": "p2"})
    world.kube.add_pool(phpipam_pool())
    world.reconcile()
    pool = world.stored()
    pool["spec"]["credentialsRef"] = {"name": "new-creds"}
    pool["metadata"]["generation"] = 2
    world.kube.secret_conflicts[(NS, "creds")] = 1
    assert world.reconcile() == Result.requeue_after(1.0)
    # The old Secret keeps its finalizer, and the pool's annotation still names it.
    assert world.kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]
    assert "creds" in world.stored()["metadata"]["annotations"][SECRETS_ANNOTATION].split(",")
    world.delete()
    world.reconcile()
    assert (NS, KIND, "pool") not in world.kube.pools
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert world.kube.secret_finalizers(NS, "new-creds") == []


def test_a_secret_let_go_by_a_deleted_pool_is_protected_again_by_a_new_reader(
    world: World,
) -> None:
    """A pool created while a deleted pool decides about their Secret keeps it protected."""
    kube = world.kube
    kube.add_pool(phpipam_pool("a"))
    world.reconcile("a")
    world.delete("a")
    created: list[threading.Thread] = []

    def new_reader(namespace: str) -> None:
        # Pool a has listed the pools (b is not among them): b is created and reconciled now.
        if not created:
            kube.add_pool(phpipam_pool("b"))
            created.append(threading.Thread(target=world.reconcile, args=("b",)))
            created[0].start()
            created[0].join(0.2)  # as far as the namespace lock, no further

    kube.on_list_pools = new_reader
    world.reconcile("a")
    created[0].join(5)
    assert not created[0].is_alive()
    assert (NS, KIND, "a") not in kube.pools
    assert kube.secret_finalizers(NS, "creds") == [CREDENTIALS_FINALIZER]  # b reads it


def test_a_pool_being_deleted_with_an_invalid_spec_still_goes(world: World) -> None:
    world.kube.add_pool(
        phpipam_pool(endpoint="ftp://x", deleting=True, finalizers=(capi.POOL_FINALIZER,))
    )
    assert world.reconcile() == Result.done()
    assert (NS, KIND, "pool") not in world.kube.pools


def test_a_pool_with_claims_waiting_for_an_address_probes_its_ipam_until_they_are_served(
    world: World,
) -> None:
    world.kube.add_pool(phpipam_pool())
    world.reconcile()  # Ready
    world.ipam.cidr = "10.0.0.0/30"
    world.ipam.entries.update({"a.ns": "10.0.0.2"})  # .1 is the gateway: full
    world.queue.parked_keys[TOKEN] = {("claim", NS, "waiting")}
    world.reset()
    probe = Result.requeue_after(world.ctx.settings.requeue_exhausted_seconds)
    assert world.reconcile() == probe  # full, claims wait: look again soon
    assert world.queue.woken == []
    assert [c[0] for c in world.ipam.calls] == ["describe_subnets"]
    world.ipam.entries.clear()  # someone freed the address in the IPAM
    world.reset()
    assert world.reconcile() == probe
    assert world.queue.woken == [(TOKEN, 1)]  # one waiting claim tries; its success wakes the next
    world.queue.parked_keys.clear()
    assert world.reconcile() == Result.done()  # nobody waits: the periodic refresh is enough


# -- Global pools, quarantine purge (issue 12) ----------------------------------------------

GLOBAL = "GlobalPHPIPAMIPPool"


def global_pool(name: str = "shared", **kwargs: Any) -> dict[str, Any]:
    body = phpipam_pool(name, **kwargs)
    body["kind"] = GLOBAL
    del body["metadata"]["namespace"]
    body["spec"]["credentialsRef"]["namespace"] = "ipam"
    return body


def test_a_global_pool_protects_the_secret_of_the_namespace_it_names(world: World) -> None:
    world.kube.add_secret("ipam", "creds", {"username": "u", "password": "p"})
    world.kube.add_pool(global_pool())
    assert world.reconcile("shared", GLOBAL, "") == Result.done()
    stored = world.kube.pools[("", GLOBAL, "shared")]
    assert CREDENTIALS_FINALIZER in world.kube.secret_finalizers("ipam", "creds")
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert stored["metadata"]["annotations"]["ipam-bridge.io/secrets-in-use"] == "ipam/creds"
    assert capi.POOL_FINALIZER in stored["metadata"]["finalizers"]
    assert capi.ready_of(stored) == ("True", "PoolReady")
    assert world.kube.read("read_secret") == ["ipam/creds"]
    assert pool_token("", GLOBAL, "shared") in world.queue.woken


def test_a_global_pool_is_held_by_claims_of_every_namespace(world: World) -> None:
    world.kube.add_secret("ipam", "creds", {"username": "u", "password": "p"})
    world.kube.add_pool(global_pool())
    world.reconcile("shared", GLOBAL, "")
    world.kube.add_claim(ours(name="a", namespace="team-a", kind=GLOBAL, pool="shared"))
    world.kube.add_claim(ours(name="b", namespace="team-b", kind=GLOBAL, pool="shared"))
    world.kube.add_claim(ours(name="c", namespace="team-b", pool="shared"))  # namespaced kind
    assert users_of(world.ctx.pools, "", GLOBAL, "shared") == [
        "IPAddressClaim team-a/a",
        "IPAddressClaim team-b/b",
    ]
    world.kube.pools[("", GLOBAL, "shared")]["metadata"]["deletionTimestamp"] = DELETED_AT
    assert world.reconcile("shared", GLOBAL, "").after is not None
    assert capi.ready_of(world.kube.pools[("", GLOBAL, "shared")])[1] == "DeletionBlocked"
    for key in [("team-a", "a"), ("team-b", "b")]:
        del world.kube.claims[key]
    assert world.reconcile("shared", GLOBAL, "") == Result.done()
    assert ("", GLOBAL, "shared") not in world.kube.pools
    assert world.kube.secret_finalizers("ipam", "creds") == []


def test_a_namespaced_pool_keeps_a_secret_a_global_pool_still_reads(world: World) -> None:
    world.kube.add_secret("ipam", "creds", {"username": "u", "password": "p"})
    world.kube.add_pool(global_pool())
    world.kube.add_pool(phpipam_pool("local", "ipam"))
    world.reconcile("shared", GLOBAL, "")
    world.reconcile("local", KIND, "ipam")
    world.kube.pools[("ipam", KIND, "local")]["metadata"]["deletionTimestamp"] = DELETED_AT
    world.reconcile("local", KIND, "ipam")
    assert ("ipam", KIND, "local") not in world.kube.pools
    assert world.kube.secret_finalizers("ipam", "creds") == [CREDENTIALS_FINALIZER]


def test_pool_status_writes_keep_the_audits_condition(world: World) -> None:
    in_sync = {
        "type": "InSync",
        "status": "True",
        "reason": "NoDrift",
        "message": "no drift",
        "lastTransitionTime": DELETED_AT,
    }
    status = pool_condition()
    status["conditions"].append(in_sync)
    world.kube.add_pool(phpipam_pool(status=status))
    world.reconcile()
    assert in_sync in world.stored()["status"]["conditions"]
    world.ipam.error = be.SubnetNotFoundError("subnet gone")
    world.reconcile()
    assert in_sync in world.stored()["status"]["conditions"]
    assert capi.ready_of(world.stored()) == ("False", "SubnetNotFound")


def test_the_status_shows_each_subnet(world: World) -> None:
    world.ipam.more = [("10.0.1.0/29", None)]
    world.kube.add_pool(
        phpipam_pool(subnet=None, subnets=[{"subnet": "10.0.0.0/29"}, {"subnetId": 8}])
    )
    world.reconcile()
    status = world.stored()["status"]
    assert [s["cidr"] for s in status["subnets"]] == ["10.0.0.0/29", "10.0.1.0/29"]
    assert status["ipAddresses"] == {"total": 12, "used": 1, "free": 11}
    assert status["subnet"] == "10.0.0.0/29" and status["gateway"] == "10.0.0.1"


def test_purge_deletes_ended_quarantines_and_wakes_a_waiting_claim(world: World) -> None:
    world.kube.add_pool(phpipam_pool(addressReuseGracePeriodSeconds=60))
    world.ipam.quarantined = {"10.0.0.2": ("quarantined.a.ns", 0.0), "10.0.0.3": ("q", 9e12)}
    assert purge_quarantined(world.ctx.pools, NS, KIND, "pool") == ["10.0.0.2"]
    assert list(world.ipam.quarantined) == ["10.0.0.3"]
    assert (TOKEN, 1) in world.queue.woken
    world.reset()
    assert purge_quarantined(world.ctx.pools, NS, KIND, "pool") == []
    assert world.queue.woken == []
    assert purge_quarantined(world.ctx.pools, NS, KIND, "gone") == []


# -- typed pool: what the pool path writes stays as it was ------------------------------------


def test_an_invalid_pool_gets_its_status_once_and_no_write_after(world: World) -> None:
    world.kube.add_pool(phpipam_pool(endpoint="ftp://nowhere", generation=3))
    world.reconcile()
    [write] = world.kube.of("pool.status")
    ready = write.detail["conditions"][0]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        Reason.INVALID_SPEC,
        "spec.endpoint must be an http:// or https:// URL",
    )
    assert write.detail["observedGeneration"] == 3
    world.reset()
    world.reconcile()  # nothing changed: no API write at all
    assert world.kube.writes == []


def test_a_pool_whose_spec_stopped_parsing_lets_its_recorded_secrets_go(world: World) -> None:
    world.kube.add_secret(NS, "ca", {"ca.crt": "PEM"})
    world.kube.add_pool(phpipam_pool(tls={"caSecretRef": {"name": "ca"}}))
    world.reconcile()
    assert world.kube.secret_finalizers(NS, "ca") == [CREDENTIALS_FINALIZER]
    stored = world.stored()
    stored["spec"] = {"endpoint": "ftp://broken"}  # no credentialsRef any more
    world.reconcile()
    assert world.ready()["reason"] == Reason.INVALID_SPEC
    world.delete()
    assert world.reconcile() == Result.done()
    assert world.kube.secret_finalizers(NS, "creds") == []
    assert world.kube.secret_finalizers(NS, "ca") == []


@pytest.mark.parametrize(
    ("pool", "key", "expected"),
    [
        (phpipam_pool(), (NS, KIND, "pool"), "creds"),
        (phpipam_pool(tls={"caSecretRef": {"name": "ca"}}), (NS, KIND, "pool"), "ca,creds"),
        (
            {
                "kind": GLOBAL,
                "metadata": {"name": "shared"},
                "spec": {
                    "endpoint": "https://ipam.example.com",
                    "appId": "capi",
                    "subnetId": 7,
                    "credentialsRef": {"name": "creds", "namespace": "ipam"},
                    "tls": {"caSecretRef": {"name": "ca", "namespace": "certs"}},
                },
            },
            ("", GLOBAL, "shared"),
            "certs/ca,ipam/creds",
        ),
    ],
    ids=["namespaced", "namespaced-ca", "global"],
)
def test_the_secrets_annotation_is_written_as_before(
    world: World, pool: dict[str, Any], key: tuple[str, str, str], expected: str
) -> None:
    for namespace, name in ((NS, "ca"), ("ipam", "creds"), ("certs", "ca")):
        world.kube.add_secret(namespace, name, {"username": "u", "password": "p", "ca.crt": "P"})
    world.kube.add_pool(pool)
    world.reconcile(key[2], key[1], key[0])
    [write] = world.kube.of("pool.annotate")
    assert write.detail == ("ipam-bridge.io/secrets-in-use", expected)
    assert world.kube.pools[key]["metadata"]["annotations"] == {
        "ipam-bridge.io/secrets-in-use": expected
    }
