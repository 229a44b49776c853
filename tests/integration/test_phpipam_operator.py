"""The real operator against the emulated Kubernetes API and mock phpIPAM over HTTP, end to end."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED

import bridge.operator as operator_module
from bridge.handlers.lifecycle import KOPF_ANNOTATION_PREFIX
from bridge.reconcilers.claims import ClaimDeps
from bridge.runtime.workqueue import Result
from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

__all__: list[str] = []

GROUP = "ipam.cluster.x-k8s.io"
CLAIM_FINALIZER = "ipam.cluster.x-k8s.io/ReleaseAddress"
ADDRESS_FINALIZER = "ipam.cluster.x-k8s.io/ProtectAddress"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
#: The phpIPAM app with ``security: ssl_code`` and its static code (see conftest's seed).
CODE_APP = "capicode"
APP_CODE = next(a["code"] for a in PHPIPAM_SEED["apps"] if a["id"] == CODE_APP)
#: Subnet 7 of the seed.
SUBNET_7 = ipaddress.ip_network("10.20.0.0/24")
GATEWAY_7 = "10.20.0.1"
#: The settings of tests that wait on errors a person must fix: retried every second.
QUICK_CONFIG_RETRY = {"IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "1"}
#: Prefix of kopf's bookkeeping annotations (never written on claims: it has no handler
#: that would store progress or a last-handled state).
KOPF_PREFIX = KOPF_ANNOTATION_PREFIX


# -- helpers ---------------------------------------------------------------------------------


def ready(body: Mapping[str, Any] | None, *, legacy: bool = False) -> dict[str, Any]:
    """Return the Ready condition of an object ({} when absent).

    For a v1beta1 claim the metav1 condition lives in ``status.v1beta2.conditions``;
    ``legacy=True`` returns the CAPI v1beta1 one from ``status.conditions``.
    """
    status = (body or {}).get("status") or {}
    conditions = status.get("conditions") or []
    if (body or {}).get("apiVersion") == f"{GROUP}/v1beta1" and not legacy:
        conditions = (status.get("v1beta2") or {}).get("conditions") or []
    return next((dict(c) for c in conditions if c.get("type") == "Ready"), {})


def events_of(
    sandbox: Sandbox,
    kind: str,
    name: str,
    reason: str | None = None,
) -> list[dict[str, Any]]:
    """Return the Events whose involvedObject is ``kind``/``name`` (optionally of ``reason``)."""
    return [
        e
        for e in sandbox.events(NAMESPACE)
        if (e.get("involvedObject") or {}).get("kind") == kind
        and (e.get("involvedObject") or {}).get("name") == name
        and (reason is None or e.get("reason") == reason)
    ]


def told(sandbox: Sandbox, kind: str, name: str, reason: str, text: str) -> list[dict[str, Any]]:
    """Return the Events of ``reason`` on ``kind``/``name`` whose message contains ``text``."""
    return [e for e in events_of(sandbox, kind, name, reason) if text in str(e.get("message"))]


def wait_event(
    sandbox: Sandbox, kind: str, name: str, reason: str, *, timeout: float = 10.0
) -> dict[str, Any]:
    """Wait for an Event of ``reason`` on ``kind``/``name`` and return it."""
    found = wait_for(
        lambda: events_of(sandbox, kind, name, reason),
        timeout=timeout,
        message=f"event {reason} on {kind} {name}",
    )
    return dict(found[0])


def rows(phpipam: MockPhpipamServer, subnet_id: int) -> dict[str, str]:
    """Return the subnet's non-gateway rows in the mock as ``{hostname: ip}``."""
    return {
        str(a.hostname): str(a.ip)
        for a in phpipam.store.subnet_addresses(subnet_id)
        if not a.is_gateway
    }


def usage(phpipam: MockPhpipamServer, subnet_id: int) -> dict[str, int]:
    """Return the mock's own usage of a subnet in the pool status' shape."""
    raw = phpipam.store.usage(subnet_id)
    assert raw is not None
    return {"total": int(raw["maxhosts"]), "used": int(raw["used"]), "free": int(raw["freehosts"])}


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster(sandbox: Sandbox, name: str) -> dict[str, Any]:
    """Create a CAPI ``Cluster`` (v1beta2) in the test namespace."""
    return sandbox.apply(
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {},
        }
    )


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def assert_condition_fields(
    condition: Mapping[str, Any], status: str, reason: str, generation: int
) -> None:
    """Assert a metav1 condition carries every field CAPI's v1beta2 schema requires."""
    assert condition["type"] == "Ready"
    assert condition["status"] == status
    assert condition["reason"] == reason
    assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", condition["reason"])
    assert isinstance(condition["message"], str) and condition["message"]
    assert condition["observedGeneration"] == generation
    transition = datetime.datetime.fromisoformat(condition["lastTransitionTime"])
    assert transition.tzinfo is not None
    assert transition <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5)
    assert "severity" not in condition


# -- 1. many claims, then deleting some ---------------------------------------------------------


def test_fifty_claims_bound_then_twenty_released(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    pool = sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    pool_uid = sandbox.pool(NAMESPACE, "pool")["metadata"]["uid"]  # type: ignore[index]
    assert pool_uid == pool["metadata"]["uid"]
    names = [f"m-{i:02d}" for i in range(50)]

    # A claim naming a Cluster that does not exist yet waits, and says why.
    sandbox.claim(NAMESPACE, names[0], "pool", cluster="wl1")
    waiting = sandbox.wait_claim_reason(NAMESPACE, names[0], "AllocationFailed")
    assert ready(waiting)["status"] == "False"
    assert "wl1" in ready(waiting)["message"]
    event = wait_event(sandbox, "IPAddressClaim", names[0], "AllocationFailed")
    assert event["type"] == "Warning" and "wl1" in event["message"]
    assert sandbox.addresses(NAMESPACE) == []
    assert rows(phpipam, 7) == {}

    cluster(sandbox, "wl1")
    for name in names[1:]:
        sandbox.claim(NAMESPACE, name, "pool", cluster="wl1")
    claims = {
        c["metadata"]["name"]: c for c in sandbox.wait_claims_bound(NAMESPACE, 50, timeout=60)
    }
    addresses = {a["metadata"]["name"]: a for a in sandbox.addresses(NAMESPACE)}
    assert sorted(claims) == names
    assert sorted(addresses) == names

    ips = [a["spec"]["address"] for a in addresses.values()]
    assert len(set(ips)) == 50
    assert all(ipaddress.ip_address(ip) in SUBNET_7 for ip in ips)
    assert GATEWAY_7 not in ips
    assert all(
        ip not in (str(SUBNET_7.network_address), str(SUBNET_7.broadcast_address)) for ip in ips
    )

    for name in names:
        claim, address = claims[name], addresses[name]
        meta = address["metadata"]
        assert meta["namespace"] == NAMESPACE
        assert address["spec"] == {
            "address": address["spec"]["address"],
            "prefix": 24,
            "gateway": GATEWAY_7,
            "claimRef": {"name": name},
            "poolRef": claim["spec"]["poolRef"],
        }
        assert sorted(meta["ownerReferences"], key=lambda r: r["kind"]) == [
            {
                "apiVersion": f"{GROUP}/v1beta2",
                "kind": "IPAddressClaim",
                "name": name,
                "uid": claim["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            },
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "PHPIPAMIPPool",
                "name": "pool",
                "uid": pool_uid,
                "controller": False,
                "blockOwnerDeletion": True,
            },
        ]
        assert meta["finalizers"] == [ADDRESS_FINALIZER]
        assert meta["labels"][CLUSTER_NAME_LABEL] == "wl1"

        assert CLAIM_FINALIZER in claim["metadata"]["finalizers"]
        assert claim["status"]["addressRef"] == {"name": name}
        assert_condition_fields(
            ready(claim), "True", "AddressAllocated", claim["metadata"]["generation"]
        )
        assert address["spec"]["address"] in ready(claim)["message"]

    # The IPAM holds exactly these 50 hostnames, with the IPAddresses' addresses, each
    # written once.
    assert rows(phpipam, 7) == {
        f"{name}.{NAMESPACE}": addresses[name]["spec"]["address"] for name in names
    }
    allocations = [
        r
        for r in phpipam.store.requests()
        if r.method == "POST" and "/addresses/first_free/" in r.path
    ]
    assert [r.status for r in allocations] == [201] * 50
    # A claim allocated at once has nothing to tell beyond its Ready condition: no Event.
    assert events_of(sandbox, "IPAddressClaim", "m-49", "AddressAllocated") == []

    # Delete 20: exactly their rows go, their IPAddresses go, the other 30 stay as they were.
    deleted, kept = names[0:40:2], [n for n in names if n not in names[0:40:2]]
    assert len(deleted) == 20 and len(kept) == 30
    ids_before = {a.hostname: a.id for a in phpipam.store.subnet_addresses(7)}
    kept_addresses = {n: addresses[n]["metadata"] for n in kept}
    phpipam.store.clear_journal()
    for name in deleted:
        sandbox.delete_claim(NAMESPACE, name)
    wait_for(
        lambda: not {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)} & set(deleted),
        timeout=30,
        message="20 claims deleted",
    )
    remaining = {a["metadata"]["name"]: a for a in sandbox.addresses(NAMESPACE)}
    assert sorted(remaining) == kept
    for name in kept:
        assert remaining[name]["metadata"]["uid"] == kept_addresses[name]["uid"]
        assert (
            remaining[name]["metadata"]["resourceVersion"]
            == kept_addresses[name]["resourceVersion"]
        )
        assert remaining[name]["spec"] == addresses[name]["spec"]
    assert rows(phpipam, 7) == {
        f"{name}.{NAMESPACE}": addresses[name]["spec"]["address"] for name in kept
    }
    writes = phpipam.store.requests(writes_only=True)
    assert all(w.method == "DELETE" and w.status == 200 for w in writes)
    deleted_ids = sorted(int(re.findall(r"/addresses/(\d+)/$", w.path)[0]) for w in writes)
    assert deleted_ids == sorted(ids_before[f"{n}.{NAMESPACE}"] for n in deleted)
    still_bound = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
    assert sorted(still_bound) == kept
    assert all(ready(c)["reason"] == "AddressAllocated" for c in still_bound.values())

    # Pool status follows the IPAM's usage (gateway row included, as phpIPAM counts it).
    expected = usage(phpipam, 7)
    assert expected == {
        "total": SUBNET_7.num_addresses - 2,
        "used": 31,
        "free": SUBNET_7.num_addresses - 2 - 31,
    }
    status = wait_for(
        lambda: (
            (s := (sandbox.pool(NAMESPACE, "pool") or {}).get("status") or {})
            and s.get("ipAddresses") == expected
            and s
        ),
        timeout=10,
        message="pool usage matching the mock",
    )
    assert status["subnet"] == "10.20.0.0/24"
    assert status["prefix"] == 24
    assert status["gateway"] == GATEWAY_7
    assert ready({"status": status})["status"] == "True"
    assert ready({"status": status})["reason"] == "PoolReady"


# -- 2. a CAPI 1.6-1.10 management cluster (v1beta1 only) --------------------------------------


def test_v1beta1_only_capi(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    sandbox = make_sandbox(capi_versions=("v1beta1",))
    assert sandbox.version == "v1beta1"
    # First a claim whose pool does not exist: a False condition, with severity.
    sandbox.claim(NAMESPACE, "early", "pool")
    waiting = sandbox.wait_claim_reason(NAMESPACE, "early", "PoolNotReady")
    assert waiting["apiVersion"] == f"{GROUP}/v1beta1"
    legacy = ready(waiting, legacy=True)
    assert legacy["status"] == "False"
    assert legacy["reason"] == "PoolNotReady"
    assert legacy["severity"] == "Warning"
    assert legacy["message"] and legacy["lastTransitionTime"]
    current = ready(waiting)
    assert_condition_fields(current, "False", "PoolNotReady", waiting["metadata"]["generation"])

    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "later", "pool")
    claims = {c["metadata"]["name"]: c for c in sandbox.wait_claims_bound(NAMESPACE, 2)}
    pool_uid = sandbox.pool(NAMESPACE, "pool")["metadata"]["uid"]  # type: ignore[index]
    for name, claim in claims.items():
        assert claim["apiVersion"] == f"{GROUP}/v1beta1"
        legacy = ready(claim, legacy=True)
        assert legacy["status"] == "True"
        assert legacy["reason"] == "AddressAllocated"
        assert "severity" not in legacy
        assert_condition_fields(
            ready(claim), "True", "AddressAllocated", claim["metadata"]["generation"]
        )
        assert claim["status"]["addressRef"] == {"name": name}

        address = sandbox.kube.get(f"{GROUP}/v1beta1", "ipaddresses", name, NAMESPACE)
        assert address is not None
        assert address["apiVersion"] == f"{GROUP}/v1beta1"
        assert address["spec"]["claimRef"] == {"name": name}
        assert address["spec"]["poolRef"] == claim["spec"]["poolRef"]
        assert address["spec"]["prefix"] == 24
        assert {
            (r["apiVersion"], r["kind"], r["uid"], r["controller"])
            for r in address["metadata"]["ownerReferences"]
        } == {
            (f"{GROUP}/v1beta1", "IPAddressClaim", claim["metadata"]["uid"], True),
            (f"{GROUP}/v1alpha1", "PHPIPAMIPPool", pool_uid, False),
        }
    assert rows(phpipam, 7) == {
        f"{n}.{NAMESPACE}": a["spec"]["address"]
        for n, a in ((a["metadata"]["name"], a) for a in sandbox.addresses(NAMESPACE))
    }
    sandbox.delete_claim(NAMESPACE, "early")
    sandbox.delete_claim(NAMESPACE, "later")
    sandbox.wait_gone(NAMESPACE, timeout=20)
    assert rows(phpipam, 7) == {}


# -- 3. bad input: visible, contained, recoverable ----------------------------------------------


WRONG_PASSWORD = "Wr0ng-pa55-never-logged"


@dataclass(frozen=True)
class BadPool:
    """One way to get a pool wrong, and how to fix it."""

    id: str
    #: The pool's Ready reason, and a fragment of its message naming the cause (``{port}``:
    #: the closed port the test picked).
    reason: str
    cause: str
    #: The Ready reason of a claim on that pool.
    claim_reason: str
    #: Pool spec fields (from the mock and a closed port) and Secret data (None: no Secret)
    #: of the broken pool.
    spec: Callable[[MockPhpipamServer, int], dict[str, Any]]
    credentials: Mapping[str, str] | None
    #: The fix (given the mock and the closed port). The pool's IPAM location (endpoint,
    #: subnetId, subnet) is immutable (the CRD's CEL rules): a wrong location is fixed on the
    #: IPAM's side, as a person would without recreating the pool. A mock server it returns is
    #: stopped after the test.
    fix: Callable[[Sandbox, MockPhpipamServer, int], object]
    #: The subnet the claim's address comes from once fixed.
    fixed_subnet: int


BAD_POOLS = [
    BadPool(
        "missing-secret",
        "CredentialsNotFound",
        "bad-credentials",
        "PoolNotReady",
        lambda m, _: {"endpoint": m.url, "subnet_id": 7},
        None,
        lambda sb, m, _: sb.secret(NAMESPACE, "bad-credentials", CREDENTIALS),
        7,
    ),
    BadPool(
        "wrong-password",
        "AuthenticationFailed",
        "Invalid username or password",
        "PoolNotReady",
        lambda m, _: {"endpoint": m.url, "subnet_id": 7},
        {"username": CREDENTIALS["username"], "password": WRONG_PASSWORD},
        lambda sb, m, _: sb.kube.patch(
            "v1",
            "secrets",
            "bad-credentials",
            {"data": {"password": b64(CREDENTIALS["password"])}},
            NAMESPACE,
        ),
        7,
    ),
    BadPool(
        "unknown-subnet-id",
        "SubnetNotFound",
        "999",
        "PoolNotReady",
        lambda m, _: {"endpoint": m.url, "subnet_id": 999},
        CREDENTIALS,
        # The subnet the pool names is created in phpIPAM.
        lambda sb, m, _: m.store.add_subnet(
            "10.20.3.0/28", section_id=3, subnet_id=999, gateway="10.20.3.1"
        ),
        999,
    ),
    BadPool(
        "unknown-cidr",
        "SubnetNotFound",
        "10.99.0.0/24",
        "PoolNotReady",
        lambda m, _: {"endpoint": m.url, "subnet": "10.99.0.0/24"},
        CREDENTIALS,
        lambda sb, m, _: m.store.add_subnet(
            "10.99.0.0/24", section_id=3, subnet_id=11, gateway="10.99.0.1"
        ),
        11,
    ),
    BadPool(
        # An unreachable IPAM: the pool says BackendUnavailable and keeps checking; its claims
        # wait for it (PoolNotReady, naming the pool's cause) instead of each asking the IPAM.
        "unreachable",
        "BackendUnavailable",
        "127.0.0.1:{port}",
        "PoolNotReady",
        lambda m, port: {"endpoint": f"http://127.0.0.1:{port}/api", "subnet_id": 7},
        CREDENTIALS,
        # phpIPAM comes up at the pool's endpoint (the same data as the good pool's).
        lambda sb, m, port: MockPhpipamServer(m.store, port=port).__enter__(),
        7,
    ),
]


@pytest.mark.parametrize("case", BAD_POOLS, ids=[c.id for c in BAD_POOLS])
def test_bad_pool_is_reported_contained_and_recovers(
    case: BadPool,
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    request: pytest.FixtureRequest,
) -> None:
    sandbox = make_sandbox(settings=QUICK_CONFIG_RETRY)
    port = closed_port()
    cause = case.cause.format(port=port)
    sandbox.phpipam_pool(
        NAMESPACE, "good", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "ok-1", "good")
    sandbox.phpipam_pool(
        NAMESPACE,
        "bad",
        credentials=case.credentials,
        secret="bad-credentials",
        **case.spec(phpipam, port),
    )
    sandbox.claim(NAMESPACE, "stuck", "bad")

    # The pool says what is wrong, in its condition and in a Warning event.
    pool = sandbox.wait_pool_ready(NAMESPACE, "bad", reason=case.reason)
    assert ready(pool)["status"] == "False"
    assert cause in ready(pool)["message"]
    event = wait_event(sandbox, "PHPIPAMIPPool", "bad", case.reason)
    assert event["type"] == "Warning" and cause in event["message"]

    # So does the claim, naming the same cause.
    claim = sandbox.wait_claim_reason(NAMESPACE, "stuck", case.claim_reason)
    assert ready(claim)["status"] == "False"
    assert cause in ready(claim)["message"]
    # (A claim created right after its pool may first find it missing in the operator's
    # cache and be told so: wait for the Event that names the cause.)
    (event,) = wait_for(
        lambda: told(sandbox, "IPAddressClaim", "stuck", case.claim_reason, cause),
        timeout=10,
        message="the claim's Event naming the cause",
    )
    assert event["type"] == "Warning"

    # The claim waits for its pool (parked: no retries, no writes of its own) while the
    # operator keeps serving the good pool.
    # (The claim's condition carries the pool's message, which may settle once after the
    # pool's first failure; then nothing is written while nothing changes.)
    time.sleep(1.5)
    stuck_version = sandbox.get_claim(NAMESPACE, "stuck")["metadata"]["resourceVersion"]  # type: ignore[index]
    time.sleep(2)
    sandbox.claim(NAMESPACE, "ok-2", "good")
    sandbox.wait_claim_reason(NAMESPACE, "ok-2", "AddressAllocated", timeout=10)
    assert sandbox.operator_running
    assert ready(sandbox.pool(NAMESPACE, "good"))["reason"] == "PoolReady"
    # One event per transition, not one per retry.
    assert len(events_of(sandbox, "PHPIPAMIPPool", "bad", case.reason)) == 1
    assert len(told(sandbox, "IPAddressClaim", "stuck", case.claim_reason, cause)) == 1
    # Nothing leaked: no IPAddress and no IPAM row for the stuck claim.
    assert sandbox.kube.get(f"{GROUP}/v1beta2", "ipaddresses", "stuck", NAMESPACE) is None
    assert [a for a in phpipam.store.all_addresses() if a.hostname == f"stuck.{NAMESPACE}"] == []
    assert set(rows(phpipam, 7)) == {f"ok-1.{NAMESPACE}", f"ok-2.{NAMESPACE}"}
    stuck = sandbox.get_claim(NAMESPACE, "stuck")
    assert stuck is not None and stuck["metadata"]["resourceVersion"] == stuck_version
    assert CLAIM_FINALIZER not in (stuck["metadata"].get("finalizers") or [])
    if case.id == "wrong-password":
        # Every login with the wrong password counts towards phpIPAM's lock-out (more than
        # 10 failures in 5 minutes blocks the operator's IP, good credentials included).
        failed = [
            r
            for r in phpipam.store.requests()
            if r.method == "POST" and r.path.endswith("/user/") and r.status != 200
        ]
        assert len(failed) == 1

    # Fixed: the pool becomes Ready and the waiting claim is bound. (The PoolReady event is
    # checked by test_recovery_seen_by_the_refresher_is_reported: here either the refresher
    # or the pool handler may see the recovery first.)
    fixed = case.fix(sandbox, phpipam, port)
    if isinstance(fixed, MockPhpipamServer):
        request.addfinalizer(lambda: fixed.__exit__(None, None, None))
    pool = sandbox.wait_pool_ready(NAMESPACE, "bad", timeout=15)
    assert ready(pool)["status"] == "True"
    claim = sandbox.wait_claim_reason(NAMESPACE, "stuck", "AddressAllocated", timeout=15)
    assert claim["status"]["addressRef"] == {"name": "stuck"}
    address = sandbox.kube.get(f"{GROUP}/v1beta2", "ipaddresses", "stuck", NAMESPACE)
    assert address is not None
    assert rows(phpipam, case.fixed_subnet)[f"stuck.{NAMESPACE}"] == address["spec"]["address"]


def test_recovery_seen_by_the_refresher_is_reported(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer
) -> None:
    # The pool handler retries only after 30 s: the periodic refresher (every second) is the
    # one that sees the Secret appear. It must say so (an Event) and keep refreshing after.
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "30"})
    sandbox.phpipam_pool(NAMESPACE, "late", endpoint=phpipam.url, subnet_id=7)
    sandbox.wait_pool_ready(NAMESPACE, "late", reason="CredentialsNotFound")
    sandbox.secret(NAMESPACE, "late-credentials", CREDENTIALS)
    sandbox.wait_pool_ready(NAMESPACE, "late", timeout=10)
    event = wait_event(sandbox, "PHPIPAMIPPool", "late", "PoolReady")
    assert event["type"] == "Normal"
    sandbox.claim(NAMESPACE, "after", "late")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    expected = usage(phpipam, 7)
    assert expected["used"] == 2  # the gateway and "after"
    wait_for(
        lambda: (
            ((sandbox.pool(NAMESPACE, "late") or {}).get("status") or {}).get("ipAddresses")
            == expected
        ),
        timeout=10,
        message="pool usage refreshed after the recovery",
    )


def test_claim_for_missing_pool_waits_then_binds(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    sandbox.claim(NAMESPACE, "orphan", "later")
    claim = sandbox.wait_claim_reason(NAMESPACE, "orphan", "PoolNotReady")
    assert ready(claim)["status"] == "False"
    assert "later" in ready(claim)["message"] and "not found" in ready(claim)["message"]
    event = wait_event(sandbox, "IPAddressClaim", "orphan", "PoolNotReady")
    assert event["type"] == "Warning" and "later" in event["message"]
    assert sandbox.addresses(NAMESPACE) == []
    assert phpipam.store.requests() == []

    sandbox.phpipam_pool(
        NAMESPACE, "later", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    claim = sandbox.wait_claim_reason(NAMESPACE, "orphan", "AddressAllocated", timeout=10)
    (address,) = sandbox.addresses(NAMESPACE)
    assert claim["status"]["addressRef"] == {"name": "orphan"}
    assert rows(phpipam, 7) == {f"orphan.{NAMESPACE}": address["spec"]["address"]}
    assert wait_event(sandbox, "IPAddressClaim", "orphan", "AddressAllocated")["type"] == "Normal"


def test_exhausted_subnet_then_freed(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    # Subnet 9 is a /30: two usable hosts.
    sandbox.phpipam_pool(
        NAMESPACE, "tiny", endpoint=phpipam.url, subnet_id=9, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "x1", "tiny")
    sandbox.claim(NAMESPACE, "x2", "tiny")
    sandbox.wait_claims_bound(NAMESPACE, 2)
    first = {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}
    assert sorted(first.values()) == ["10.20.1.1", "10.20.1.2"]

    sandbox.claim(NAMESPACE, "x3", "tiny")
    claim = sandbox.wait_claim_reason(NAMESPACE, "x3", "PoolExhausted")
    assert ready(claim)["status"] == "False"
    assert "tiny" in ready(claim)["message"]
    event = wait_event(sandbox, "IPAddressClaim", "x3", "PoolExhausted")
    assert event["type"] == "Warning"
    assert sandbox.kube.get(f"{GROUP}/v1beta2", "ipaddresses", "x3", NAMESPACE) is None
    assert set(rows(phpipam, 9)) == {f"x1.{NAMESPACE}", f"x2.{NAMESPACE}"}
    wait_for(
        lambda: (
            ((sandbox.pool(NAMESPACE, "tiny") or {}).get("status") or {}).get("ipAddresses")
            == {"total": 2, "used": 2, "free": 0}
        ),
        timeout=10,
        message="pool shows 0 free",
    )

    sandbox.delete_claim(NAMESPACE, "x1")
    claim = sandbox.wait_claim_reason(NAMESPACE, "x3", "AddressAllocated", timeout=10)
    address = sandbox.kube.get(f"{GROUP}/v1beta2", "ipaddresses", "x3", NAMESPACE)
    assert address is not None and address["spec"]["address"] == first["x1"]
    assert claim["status"]["addressRef"] == {"name": "x3"}
    assert rows(phpipam, 9) == {f"x2.{NAMESPACE}": first["x2"], f"x3.{NAMESPACE}": first["x1"]}


# -- 4. restart -----------------------------------------------------------------------------


def test_restart_costs_no_backend_write(
    sandbox: Sandbox, phpipam: MockPhpipamServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    names = [f"r-{i}" for i in range(10)]
    for name in names:
        sandbox.claim(NAMESPACE, name, "pool")
    before = {c["metadata"]["name"]: c for c in sandbox.wait_claims_bound(NAMESPACE, 10)}
    addresses = {a["metadata"]["name"]: a for a in sandbox.addresses(NAMESPACE)}
    mock_before = {(a.id, str(a.ip), a.hostname) for a in phpipam.store.all_addresses()}

    sandbox.stop_operator()
    phpipam.store.clear_journal()
    seen: list[str] = []
    original = operator_module.reconcile_claim

    def spy(ctx: ClaimDeps, namespace: str, name: str) -> Result:
        decision = original(ctx, namespace, name)
        seen.append(name)
        return decision

    monkeypatch.setattr(operator_module, "reconcile_claim", spy)
    sandbox.start_operator()

    wait_for(
        lambda: set(names) <= set(seen),
        timeout=20,
        message="every claim looked at by the restarted operator",
    )
    # The operator talks to the IPAM again (the pool check), so silence is not an outage.
    wait_for(
        lambda: any(r.path.endswith("/subnets/7/usage/") for r in phpipam.store.requests()),
        timeout=10,
        message="a pool check after the restart",
    )
    assert phpipam.store.requests(writes_only=True) == []
    assert [r for r in phpipam.store.requests() if "/addresses/" in r.path] == []
    assert {(a.id, str(a.ip), a.hostname) for a in phpipam.store.all_addresses()} == mock_before
    after = {c["metadata"]["name"]: c for c in sandbox.claims(NAMESPACE)}
    for name in names:
        assert after[name]["status"]["addressRef"] == {"name": name}
        assert ready(after[name]) == ready(before[name])
    for address in sandbox.addresses(NAMESPACE):
        old = addresses[address["metadata"]["name"]]
        assert address["metadata"]["uid"] == old["metadata"]["uid"]
        assert address["spec"] == old["spec"]


# -- 5. claims of other providers ---------------------------------------------------------------


def test_claims_for_other_pools_are_ignored(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    sandbox.claim(NAMESPACE, "incluster", "some-pool", kind="InClusterIPPool")
    sandbox.apply(
        {
            "apiVersion": f"{GROUP}/v1beta2",
            "kind": "IPAddressClaim",
            "metadata": {"name": "other-group", "namespace": NAMESPACE},
            "spec": {
                "poolRef": {"apiGroup": "ipam.example.com", "kind": "PHPIPAMIPPool", "name": "pool"}
            },
        }
    )
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "ours", "pool")
    # Created after the foreign claims: once it is bound the operator has seen them.
    sandbox.wait_claim_reason(NAMESPACE, "ours", "AddressAllocated")
    for name in ("incluster", "other-group"):
        claim = sandbox.get_claim(NAMESPACE, name)
        assert claim is not None
        assert not claim["metadata"].get("finalizers")
        assert not [
            k
            for k in claim["metadata"].get("annotations") or {}
            if k.startswith(KOPF_PREFIX) or "kopf" in k
        ]
        assert not claim.get("status")
        assert events_of(sandbox, "IPAddressClaim", name) == []
    assert [a["metadata"]["name"] for a in sandbox.addresses(NAMESPACE)] == ["ours"]
    assert set(rows(phpipam, 7)) == {f"ours.{NAMESPACE}"}


# -- 6. app code token ----------------------------------------------------------------------


def test_app_code_token_needs_no_login(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    sandbox.phpipam_pool(
        NAMESPACE,
        "coded",
        endpoint=phpipam.url,
        app_id=CODE_APP,
        subnet_id=7,
        credentials={"token": APP_CODE},
    )
    for name in ("t1", "t2", "t3"):
        sandbox.claim(NAMESPACE, name, "coded")
    sandbox.wait_claims_bound(NAMESPACE, 3)
    assert set(rows(phpipam, 7)) == {f"t{i}.{NAMESPACE}" for i in (1, 2, 3)}
    sandbox.delete_claim(NAMESPACE, "t1")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "t1") is None, timeout=10, message="t1 released")
    assert set(rows(phpipam, 7)) == {f"t{i}.{NAMESPACE}" for i in (2, 3)}
    journal = phpipam.store.requests()
    assert journal
    assert all(r.path.startswith(f"/api/{CODE_APP}/") for r in journal)
    assert [r for r in journal if "/user" in r.path] == []
    assert all(r.status < 400 or "search_hostname" in r.path for r in journal)
    assert len([r for r in journal if r.method == "POST" and "first_free" in r.path]) == 3
    assert phpipam.store.find_user(CREDENTIALS["username"]).token is None  # type: ignore[union-attr]


# -- 7. secrets stay secret -----------------------------------------------------------------


#: Loggers of the test harness (emulated API, mock IPAM, web server), not the operator.
HARNESS_LOGGERS = ("aiohttp", "mock_phpipam", "mock_infoblox", "mock_kubernetes")


def test_no_secret_in_events_status_or_logs(
    sandbox: Sandbox, phpipam: MockPhpipamServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sandbox.phpipam_pool(
        NAMESPACE, "user", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE,
        "coded",
        endpoint=phpipam.url,
        app_id=CODE_APP,
        subnet_id=10,
        credentials={"token": APP_CODE},
    )
    sandbox.phpipam_pool(
        NAMESPACE,
        "wrong",
        endpoint=phpipam.url,
        subnet_id=7,
        credentials={"username": CREDENTIALS["username"], "password": WRONG_PASSWORD},
    )
    sandbox.claim(NAMESPACE, "u1", "user")
    sandbox.claim(NAMESPACE, "c1", "coded")
    sandbox.claim(NAMESPACE, "w1", "wrong")
    sandbox.wait_claims_bound(NAMESPACE, 2)
    sandbox.wait_claim_reason(NAMESPACE, "w1", "PoolNotReady")
    sandbox.wait_pool_ready(NAMESPACE, "wrong", reason="AuthenticationFailed")
    wait_event(sandbox, "IPAddressClaim", "w1", "PoolNotReady")
    wait_event(sandbox, "PHPIPAMIPPool", "wrong", "AuthenticationFailed")
    sandbox.delete_claim(NAMESPACE, "u1")
    sandbox.delete_claim(NAMESPACE, "c1")
    wait_for(
        lambda: {c["metadata"]["name"] for c in sandbox.claims(NAMESPACE)} == {"w1"},
        timeout=10,
        message="u1 and c1 released",
    )
    assert [e for e in sandbox.events(NAMESPACE) if e.get("reason") == "AddressReleased"] == []

    user = phpipam.store.find_user(CREDENTIALS["username"])
    assert user is not None and user.token  # the session token phpIPAM gave the operator
    secrets = [CREDENTIALS["password"], WRONG_PASSWORD, APP_CODE, user.token]
    secrets += [b64(s) for s in secrets]

    objects = (
        sandbox.events(NAMESPACE)
        + sandbox.claims(NAMESPACE)
        + sandbox.addresses(NAMESPACE)
        + [sandbox.pool(NAMESPACE, n) for n in ("user", "coded", "wrong")]
    )
    published = json.dumps(objects)
    operator_log = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}"
        for r in caplog.records
        if not r.name.startswith(HARNESS_LOGGERS)
    )
    # The checks look at real material: the failures and releases are in there.
    assert "AuthenticationFailed" in published and "PoolNotReady" in published
    assert any(r.name.startswith(("bridge", "backends")) for r in caplog.records)
    assert "Invalid username or password" in operator_log
    for secret in secrets:
        assert secret not in published
        assert secret not in operator_log
