"""Contract completeness: pause, pool deletion, clusterctl move, exhaustion, IPv6, security.

Each test runs the real operator (`mock_kubernetes.Sandbox`) against the emulated Kubernetes
API and a mock phpIPAM on 127.0.0.1, and checks one user-visible promise of DESIGN.md
sections 2, 3, 5 and 6 (the pain points of ``capi-ipam-contract.md`` section 7).
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from integration_env import CREDENTIALS, NAMESPACE, PHPIPAM_SEED
from moving import PHPIPAM_MOVE, assert_only_owners_rewritten, clusterctl_move

from backends.phpipam import RESERVED_NETWORK_HOSTNAME
from bridge.capi import (
    CLAIM_FINALIZER,
    CLUSTER_NAME_LABEL,
    GROUP,
    PAUSED_ANNOTATION,
    POOL_FINALIZER,
)
from bridge.settings import Settings
from mock_kubernetes.sandbox import REPO_ROOT, Sandbox, wait_for
from mock_kubernetes.store import ApiError
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__: list[str] = []

POOLS = f"{GROUP}/v1alpha1"
CLUSTERS = "cluster.x-k8s.io/v1beta2"
#: kopf's progress annotations on claims (see ``bridge.handlers.lifecycle``).
#: The promise of DESIGN.md section 2: a claim resumes within seconds of being unpaused.
UNPAUSE_BOUND_SECONDS = 10.0


# -- helpers ------------------------------------------------------------------------------


def hosts(server: MockPhpipamServer, subnet_id: int) -> dict[str, str]:
    """Return ``{hostname: ip}`` of the non-gateway rows of a mock subnet."""
    return {
        str(a.hostname): str(a.ip)
        for a in server.store.subnet_addresses(subnet_id)
        if not a.is_gateway
    }


def allocations(server: MockPhpipamServer) -> list[str]:
    """Return the allocating requests (POST to ``addresses/first_free``) the mock answered."""
    return [
        f"{e.method} {e.path}"
        for e in server.store.requests(writes_only=True)
        if e.method == "POST" and "first_free" in e.path
    ]


def wait_paused(sandbox: Sandbox, name: str) -> dict[str, Any]:
    """Give the operator time to see a paused claim; return it (it must be left alone).

    A paused claim costs no write (no progress annotations, no status): what shows that the
    operator saw it and waited is that nothing happened to it.
    """
    time.sleep(1.5)
    claim = sandbox.get_claim(NAMESPACE, name)
    assert claim is not None
    return claim


def cluster(
    sandbox: Sandbox, name: str, *, paused: bool = False, annotated: bool = False
) -> dict[str, Any]:
    """Create a CAPI Cluster, paused by ``spec.paused`` and/or the paused annotation."""
    annotations = {PAUSED_ANNOTATION: ""} if annotated else {}
    return sandbox.apply(
        {
            "apiVersion": CLUSTERS,
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "spec": {"paused": paused},
        }
    )


def unpause_cluster(sandbox: Sandbox, name: str) -> None:
    """Clear both pause markers of a Cluster."""
    sandbox.kube.patch(
        CLUSTERS,
        "clusters",
        name,
        {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}, "spec": {"paused": False}},
        NAMESPACE,
    )


def pool_events(sandbox: Sandbox, name: str, reason: str) -> list[dict[str, Any]]:
    """Return the Events of a pool with ``reason``."""
    return [
        e
        for e in sandbox.events(NAMESPACE)
        if (e.get("involvedObject") or {}).get("name") == name
        and (e.get("involvedObject") or {}).get("kind") == "PHPIPAMIPPool"
        and e.get("reason") == reason
    ]


def condition(body: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the Ready condition of a pool or v1beta2 claim ({} when none)."""
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == "Ready":
            return dict(item)
    return {}


@pytest.fixture
def pool(sandbox: Sandbox, phpipam: MockPhpipamServer) -> str:
    """A Ready phpIPAM pool ``pool`` on subnet 7 (10.20.0.0/24, gateway 10.20.0.1)."""
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    return "pool"


@pytest.fixture
def slow_pause(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """A sandbox with the production delays (resync, requeues): an unpause is noticed through
    the Cluster watch, not through a short test delay, so "resumes within seconds of
    unpausing" is measured as users get it.
    """
    names = ("requeue_seconds", "requeue_exhausted_seconds", "resync_seconds")
    return make_sandbox(
        settings={
            f"IPAM_BRIDGE_{name.upper()}": str(Settings.model_fields[name].default)
            for name in names
        }
    )


# -- 1. pause -----------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["claim-annotation", "cluster-spec", "cluster-annotation"])
def test_paused_claim_waits_and_resumes_within_seconds(
    slow_pause: Sandbox, phpipam: MockPhpipamServer, source: str
) -> None:
    sandbox = slow_pause
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.wait_pool_ready(NAMESPACE, "pool")
    if source == "claim-annotation":
        sandbox.claim(NAMESPACE, "m1", "pool", annotations={PAUSED_ANNOTATION: ""})
    elif source == "cluster-spec":  # found through spec.clusterName
        cluster(sandbox, "c1", paused=True)
        sandbox.claim(NAMESPACE, "m1", "pool", cluster="c1")
    else:  # found through the (deprecated) cluster-name label
        cluster(sandbox, "c1", annotated=True)
        sandbox.claim(NAMESPACE, "m1", "pool", labels={CLUSTER_NAME_LABEL: "c1"})

    claim = wait_paused(sandbox, "m1")
    assert CLAIM_FINALIZER not in (claim["metadata"].get("finalizers") or [])  # nothing written
    assert not claim.get("status")
    assert sandbox.addresses(NAMESPACE) == []
    assert allocations(phpipam) == []
    assert hosts(phpipam, 7) == {}

    started = time.monotonic()
    if source == "claim-annotation":
        sandbox.kube.patch(
            f"{GROUP}/v1beta2",
            "ipaddressclaims",
            "m1",
            {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}},
            NAMESPACE,
        )
    else:
        unpause_cluster(sandbox, "c1")
    (bound,) = sandbox.wait_claims_bound(NAMESPACE, 1, timeout=UNPAUSE_BOUND_SECONDS + 5)
    elapsed = time.monotonic() - started
    assert elapsed < UNPAUSE_BOUND_SECONDS, f"bound {elapsed:.1f}s after unpausing"
    assert bound["status"]["addressRef"] == {"name": "m1"}
    assert hosts(phpipam, 7) == {"m1.test": "10.20.0.2"}


def test_paused_cluster_blocks_release_until_unpaused(
    slow_pause: Sandbox, phpipam: MockPhpipamServer
) -> None:
    sandbox = slow_pause
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    cluster(sandbox, "c1")
    sandbox.claim(NAMESPACE, "m1", "pool", cluster="c1")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    sandbox.kube.patch(CLUSTERS, "clusters", "c1", {"spec": {"paused": True}}, NAMESPACE)

    sandbox.delete_claim(NAMESPACE, "m1")
    claim = wait_paused(sandbox, "m1")
    assert claim["metadata"].get("deletionTimestamp")
    assert hosts(phpipam, 7) == {"m1.test": "10.20.0.2"}
    assert [a["metadata"]["name"] for a in sandbox.addresses(NAMESPACE)] == ["m1"]

    started = time.monotonic()
    unpause_cluster(sandbox, "c1")
    sandbox.wait_gone(NAMESPACE, timeout=UNPAUSE_BOUND_SECONDS + 5)
    elapsed = time.monotonic() - started
    assert elapsed < UNPAUSE_BOUND_SECONDS, f"released {elapsed:.1f}s after unpausing"
    assert hosts(phpipam, 7) == {}


def test_missing_cluster_waits_and_vanished_cluster_does_not_block_release(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str
) -> None:
    # A claim naming a Cluster that does not exist waits, saying so.
    sandbox.claim(NAMESPACE, "m1", pool, cluster="c1")
    waiting = sandbox.wait_claim_reason(NAMESPACE, "m1", "AllocationFailed")
    assert "c1" in condition(waiting)["message"]
    assert allocations(phpipam) == []
    cluster(sandbox, "c1")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    assert hosts(phpipam, 7) == {"m1.test": "10.20.0.2"}

    # Cluster teardown: the Cluster goes first, the claim's release must still happen.
    sandbox.kube.delete(CLUSTERS, "clusters", "c1", NAMESPACE)
    assert sandbox.kube.get(CLUSTERS, "clusters", "c1", NAMESPACE) is None
    sandbox.delete_claim(NAMESPACE, "m1")
    sandbox.wait_gone(NAMESPACE, timeout=15)
    assert hosts(phpipam, 7) == {}


def test_without_cluster_crd_claims_are_served(phpipam: MockPhpipamServer) -> None:
    with Sandbox(cluster_crd=False) as sandbox:
        sandbox.namespace(NAMESPACE)
        with pytest.raises(ApiError, match="no resource"):
            cluster(sandbox, "c1")

        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        sandbox.claim(NAMESPACE, "plain", "pool")
        sandbox.claim(NAMESPACE, "named", "pool", cluster="c1")
        sandbox.wait_claims_bound(NAMESPACE, 1)
        assert sandbox.ready(sandbox.get_claim(NAMESPACE, "plain"))[0] == "True"
        named = sandbox.wait_claim_reason(NAMESPACE, "named", "AllocationFailed")
        assert "c1" in condition(named)["message"]
        assert hosts(phpipam, 7) == {"plain.test": "10.20.0.2"}
        sandbox.delete_claim(NAMESPACE, "plain")
        sandbox.delete_claim(NAMESPACE, "named")
        sandbox.wait_gone(NAMESPACE, timeout=15)
        assert hosts(phpipam, 7) == {}


# -- 2. pool deletion protection ----------------------------------------------------------


def test_pool_with_addresses_is_protected_until_its_claims_are_gone(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str
) -> None:
    body = sandbox.pool(NAMESPACE, pool)
    assert body is not None and POOL_FINALIZER in body["metadata"]["finalizers"]
    for name in ("m1", "m2"):
        sandbox.claim(NAMESPACE, name, pool)
    sandbox.wait_claims_bound(NAMESPACE, 2)

    sandbox.kube.delete(POOLS, "phpipamippools", pool, NAMESPACE)
    blocked = sandbox.wait_pool_ready(NAMESPACE, pool, reason="DeletionBlocked")
    assert blocked["metadata"].get("deletionTimestamp")
    assert POOL_FINALIZER in blocked["metadata"]["finalizers"]
    message = condition(blocked)["message"]
    assert "m1" in message and "m2" in message
    (event,) = wait_for(
        lambda: pool_events(sandbox, pool, "DeletionBlocked"),
        timeout=10,
        message="DeletionBlocked event",
    )
    assert event["type"] == "Warning" and "m1" in event["message"]

    # A new claim on a pool being deleted gets nothing, and says why.
    sandbox.claim(NAMESPACE, "late", pool)
    late = sandbox.wait_claim_reason(NAMESPACE, "late", "PoolNotReady")
    assert "deleted" in condition(late)["message"]

    # Claims of the deleting pool still release what they hold; then the pool goes.
    sandbox.delete_claim(NAMESPACE, "m1")
    sandbox.delete_claim(NAMESPACE, "m2")
    wait_for(
        lambda: not [a for a in sandbox.addresses(NAMESPACE)], timeout=15, message="addresses gone"
    )
    assert hosts(phpipam, 7) == {}
    started = time.monotonic()
    wait_for(lambda: sandbox.pool(NAMESPACE, pool) is None, timeout=15, message="pool gone")
    assert time.monotonic() - started < 10
    sandbox.delete_claim(NAMESPACE, "late")
    sandbox.wait_gone(NAMESPACE, timeout=15)
    assert allocations(phpipam) == ["POST /api/capi/addresses/first_free/7/"] * 2


def test_unused_pool_is_deleted_at_once(
    sandbox: Sandbox, phpipam: MockPhpipamServer, pool: str
) -> None:
    sandbox.kube.delete(POOLS, "phpipamippools", pool, NAMESPACE)
    wait_for(lambda: sandbox.pool(NAMESPACE, pool) is None, timeout=10, message="pool gone")
    assert pool_events(sandbox, pool, "DeletionBlocked") == []


# -- 3. clusterctl move -------------------------------------------------------------------


def test_crds_carry_the_clusterctl_labels() -> None:
    for kind in ("phpipamippools", "infobloxippools"):
        path = Path(REPO_ROOT) / "crds" / f"ipam.cluster.x-k8s.io_{kind}.yaml"
        labels = yaml.safe_load(path.read_text(encoding="utf-8"))["metadata"]["labels"]
        assert labels["clusterctl.cluster.x-k8s.io"] == ""
        assert labels["clusterctl.cluster.x-k8s.io/move-hierarchy"] == ""


#: What clusterctl move copies: (apiVersion, plural) in creation order (owners first).
MOVED = ((CLUSTERS, "clusters"), *PHPIPAM_MOVE)


@pytest.mark.parametrize("labelled", [True, False], ids=["pool-moved", "pool-shared"])
def test_clusterctl_move_rebuilds_status_and_allocates_nothing(
    make_sandbox: Callable[..., Sandbox], phpipam: MockPhpipamServer, labelled: bool
) -> None:
    labels = {CLUSTER_NAME_LABEL: "c1"} if labelled else {}
    source = make_sandbox()
    cluster(source, "c1")
    source.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS, labels=labels
    )
    for i in range(5):
        source.claim(NAMESPACE, f"m{i}", "pool", cluster="c1")
    source.wait_claims_bound(NAMESPACE, 5)
    source.wait_pool_ready(NAMESPACE, "pool")
    wait_for(
        lambda: (
            ((source.pool(NAMESPACE, "pool") or {}).get("status") or {})
            .get("ipAddresses", {})
            .get("used")
            == 6
        ),
        timeout=10,
        message="pool usage",
    )
    before = {a["metadata"]["name"]: a["spec"] for a in source.addresses(NAMESPACE)}
    in_ipam = hosts(phpipam, 7)
    assert len(set(in_ipam.values())) == 5
    pool_before = source.pool(NAMESPACE, "pool")
    assert pool_before is not None
    assert pool_before["metadata"]["labels"] == labels

    # clusterctl move: pause, copy to the target, delete at the source without finalizers.
    source.kube.patch(CLUSTERS, "clusters", "c1", {"spec": {"paused": True}}, NAMESPACE)
    phpipam.store.clear_journal()
    target = make_sandbox(start_operator=False)
    # A pool without the cluster-name label is copied but stays at the source.
    clusterctl_move(source, target, MOVED, keep=() if labelled else ("phpipamippools", "secrets"))
    target.start_operator()
    # A claim the source operator still holds (its finalizer) when its Cluster is gone goes
    # without freeing its (moved) address: it carries clusterctl's delete-for-move.
    source.wait_gone(NAMESPACE, timeout=15)
    assert hosts(phpipam, 7) == in_ipam  # nothing was released at the source
    unpause_cluster(target, "c1")

    claims = target.wait_claims_bound(NAMESPACE, 5, timeout=20)
    assert sorted(c["status"]["addressRef"]["name"] for c in claims) == sorted(before)
    after = {a["metadata"]["name"]: a["spec"] for a in target.addresses(NAMESPACE)}
    assert after == before
    moved_pool = target.wait_pool_ready(NAMESPACE, "pool")
    assert moved_pool["status"]["subnet"] == "10.20.0.0/24"
    assert moved_pool["status"]["gateway"] == "10.20.0.1"
    assert moved_pool["metadata"]["labels"] == labels
    wait_for(
        lambda: (
            ((target.pool(NAMESPACE, "pool") or {}).get("status") or {})
            .get("ipAddresses", {})
            .get("used")
            == 6
        ),
        timeout=10,
        message="pool usage",
    )
    assert hosts(phpipam, 7) == in_ipam
    assert allocations(phpipam) == []
    # No entry created or deleted: the target wrote itself as each entry's owner, once.
    assert_only_owners_rewritten(phpipam, target, 5)

    # The moved claims are released in the IPAM by the target.
    target.delete_claim(NAMESPACE, "m0")
    wait_for(lambda: "m0.test" not in hosts(phpipam, 7), timeout=15, message="m0 released")
    assert len(hosts(phpipam, 7)) == 4


# -- 4. exhaustion ------------------------------------------------------------------------


def test_exhausted_pool_serves_waiting_claims_when_addresses_free_up(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    # Subnet 9 is a /30: 10.20.1.1 and 10.20.1.2 are its only host addresses.
    sandbox.phpipam_pool(
        NAMESPACE, "small", endpoint=phpipam.url, subnet_id=9, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "a", "small")
    sandbox.wait_claims_bound(NAMESPACE, 1)
    manual = phpipam.store.add_address(
        9, "10.20.1.2", hostname="printer.lab", description="registered by a person"
    )

    sandbox.claim(NAMESPACE, "b", "small")
    waiting = sandbox.wait_claim_reason(NAMESPACE, "b", "PoolExhausted")
    assert "small" in condition(waiting)["message"]
    wait_for(  # Events are posted in the background
        lambda: [e for e in sandbox.events(NAMESPACE) if e.get("reason") == "PoolExhausted"],
        timeout=20,
        message="a PoolExhausted Event",
    )

    # A person frees an address in the IPAM.
    started = time.monotonic()
    phpipam.store.delete_address(manual.id)
    sandbox.wait_claims_bound(NAMESPACE, 2, timeout=15)
    assert time.monotonic() - started < 10
    assert hosts(phpipam, 9) == {"a.test": "10.20.1.1", "b.test": "10.20.1.2"}

    # Another claim's deletion frees one.
    sandbox.claim(NAMESPACE, "c", "small")
    sandbox.wait_claim_reason(NAMESPACE, "c", "PoolExhausted")
    started = time.monotonic()
    sandbox.delete_claim(NAMESPACE, "a")
    wait_for(
        lambda: sandbox.ready(sandbox.get_claim(NAMESPACE, "c"))[0] == "True",
        timeout=15,
        message="claim c bound",
    )
    assert time.monotonic() - started < 10
    assert hosts(phpipam, 9) == {"b.test": "10.20.1.2", "c.test": "10.20.1.1"}
    spec = {a["metadata"]["name"]: a["spec"]["address"] for a in sandbox.addresses(NAMESPACE)}
    assert spec == {"b": "10.20.1.2", "c": "10.20.1.1"}


# -- 5. IPv6 ------------------------------------------------------------------------------


def test_ipv6_pool_end_to_end(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "v6", endpoint=phpipam.url, subnet_id=8, credentials=CREDENTIALS
    )
    ready = sandbox.wait_pool_ready(NAMESPACE, "v6")
    assert ready["status"]["subnet"] == "2001:db8:20::/64"
    assert ready["status"]["prefix"] == 64
    assert not ready["status"].get("gateway")
    for i in range(3):
        sandbox.claim(NAMESPACE, f"v{i}", "v6")
    sandbox.wait_claims_bound(NAMESPACE, 3)
    addresses = sandbox.addresses(NAMESPACE)
    network = ipaddress.ip_network("2001:db8:20::/64")
    found = set()
    for item in addresses:
        spec = item["spec"]
        assert spec["prefix"] == 64
        assert "gateway" not in spec
        ip = ipaddress.ip_address(spec["address"])
        assert ip in network and ip != network.network_address
        found.add(ip)
    assert len(found) == 3
    # phpIPAM offers the network address first; the client keeps that row reserved under a
    # placeholder hostname (never a claim's) and takes the next one.
    in_ipam = hosts(phpipam, 8)
    claimed = {h: ip for h, ip in in_ipam.items() if h != RESERVED_NETWORK_HOSTNAME}
    assert sorted(claimed) == ["v0.test", "v1.test", "v2.test"]
    assert sorted(claimed.values()) == sorted(str(ip) for ip in found)
    assert "2001:db8:20::" not in claimed.values()
    assert in_ipam.get(RESERVED_NETWORK_HOSTNAME, "2001:db8:20::") == "2001:db8:20::"
    for i in range(3):
        sandbox.delete_claim(NAMESPACE, f"v{i}")
    sandbox.wait_gone(NAMESPACE)
    assert set(hosts(phpipam, 8)) <= {RESERVED_NETWORK_HOSTNAME}


# -- 6. security --------------------------------------------------------------------------


def secret_forms(values: list[str]) -> list[str]:
    """Return each secret value in clear and base64 (as a Secret's ``data`` holds it)."""
    forms = []
    for value in values:
        forms += [value, base64.b64encode(value.encode()).decode()]
    return forms


def test_no_secret_in_logs_events_or_status(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_LOG_LEVEL": "DEBUG"})
    app_token = next(a["code"] for a in PHPIPAM_SEED["apps"] if a.get("code"))
    wrong = "Wr0ng-pa55word-never-logged"
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE,
        "coded",
        endpoint=phpipam.url,
        subnet_id=10,
        app_id="capicode",
        credentials={"token": app_token},
    )
    sandbox.phpipam_pool(
        NAMESPACE,
        "wrong",
        endpoint=phpipam.url,
        subnet_id=10,
        credentials={"username": CREDENTIALS["username"], "password": wrong},
    )
    for name, pool_name in (("m1", "pool"), ("m2", "coded"), ("m3", "wrong")):
        sandbox.claim(NAMESPACE, name, pool_name)
    sandbox.wait_claims_bound(NAMESPACE, 2)
    failed = sandbox.wait_pool_ready(NAMESPACE, "wrong", reason="AuthenticationFailed")
    assert condition(failed)["message"]
    sandbox.wait_claim_reason(NAMESPACE, "m3", "PoolNotReady")
    user = phpipam.store.find_user(CREDENTIALS["username"])
    assert user is not None and user.token
    session_token = user.token
    for name in ("m1", "m2"):
        sandbox.delete_claim(NAMESPACE, name)
    wait_for(lambda: len(sandbox.claims(NAMESPACE)) == 1, timeout=15, message="m1, m2 gone")
    # m3's pool cannot log in, so its release cannot be confirmed: removing the pool lets
    # it go (with a ReleaseSkipped warning).
    sandbox.kube.delete(POOLS, "phpipamippools", "wrong", NAMESPACE)
    wait_for(lambda: sandbox.pool(NAMESPACE, "wrong") is None, timeout=15, message="pool gone")
    sandbox.delete_claim(NAMESPACE, "m3")
    sandbox.wait_gone(NAMESPACE, timeout=15)
    sandbox.stop_operator()

    secrets = secret_forms([CREDENTIALS["password"], app_token, wrong, session_token])
    lines = [record.getMessage() for record in caplog.records]
    lines += [record.exc_text or "" for record in caplog.records]
    assert len(lines) > 50, "DEBUG logging was not captured"
    assert any("m1" in line for line in lines)
    texts = {
        "log": "\n".join(lines),
        "events": json.dumps(sandbox.events()),
        "pools": json.dumps([sandbox.pool(NAMESPACE, n) for n in ("pool", "coded")]),
        "wrong pool": json.dumps(failed),
        "claims": json.dumps(sandbox.claims()),
    }
    assert "AuthenticationFailed" in texts["events"]
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret appears in the {where}"


def test_pool_never_reads_a_secret_of_another_namespace(
    sandbox: Sandbox, phpipam: MockPhpipamServer
) -> None:
    sandbox.namespace("other")
    sandbox.secret("other", "shared-credentials", CREDENTIALS)
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, secret="shared-credentials"
    )
    # credentialsRef.namespace is for Global pools only: the CRD refuses it on a namespaced
    # pool (CEL), and the operator refuses it too (bridge.models.SecretRef) where CRD
    # validation is off.
    sandbox.phpipam_pool(
        NAMESPACE, "sneaky", endpoint=phpipam.url, subnet_id=7, secret="shared-credentials"
    )
    with pytest.raises(ApiError, match="only for Global pools"):
        sandbox.kube.patch(
            POOLS,
            "phpipamippools",
            "sneaky",
            {"spec": {"credentialsRef": {"name": "shared-credentials", "namespace": "other"}}},
            NAMESPACE,
        )
    sandbox.claim(NAMESPACE, "m1", "pool")
    pool_body = sandbox.wait_pool_ready(NAMESPACE, "pool", reason="CredentialsNotFound")
    assert f"{NAMESPACE}/shared-credentials" in condition(pool_body)["message"]
    sneaky = wait_for(
        lambda: (
            (p := sandbox.pool(NAMESPACE, "sneaky"))
            and condition(p).get("status") == "False"
            and condition(p).get("reason") in ("CredentialsNotFound", "InvalidSpec")
            and p
        ),
        timeout=15,
        message="sneaky pool refused",
    )
    assert "other" not in condition(sneaky)["message"].replace("another", "")
    sandbox.wait_claim_reason(NAMESPACE, "m1", "PoolNotReady")
    assert phpipam.store.requests() == []  # the other namespace's credentials never used

    sandbox.secret(NAMESPACE, "shared-credentials", CREDENTIALS)
    sandbox.wait_pool_ready(NAMESPACE, "pool", timeout=15)
    sandbox.wait_claims_bound(NAMESPACE, 1, timeout=15)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A self-signed CA for the HTTPS mock."""
    return trustme.CA()


@pytest.fixture
def https_phpipam(ca: trustme.CA) -> Iterator[MockPhpipamServer]:
    """The mock phpIPAM over HTTPS with a certificate for 127.0.0.1 signed by `ca`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED)), ssl_context=context) as server:
        yield server


def test_tls_is_verified_by_default_and_a_ca_secret_makes_it_work(
    sandbox: Sandbox, https_phpipam: MockPhpipamServer, ca: trustme.CA
) -> None:
    url = https_phpipam.url
    assert url.startswith("https://")
    sandbox.secret(NAMESPACE, "creds", CREDENTIALS)
    sandbox.secret(NAMESPACE, "ipam-ca", {"ca.crt": ca.cert_pem.bytes().decode()})
    sandbox.phpipam_pool(NAMESPACE, "default", endpoint=url, subnet_id=7, secret="creds")
    sandbox.phpipam_pool(
        NAMESPACE,
        "with-ca",
        endpoint=url,
        subnet_id=7,
        secret="creds",
        tls={"caSecretRef": {"name": "ipam-ca"}},
    )
    sandbox.phpipam_pool(
        NAMESPACE,
        "skip",
        endpoint=url,
        subnet_id=7,
        secret="creds",
        tls={"insecureSkipVerify": True},
    )

    refused = wait_for(
        lambda: (
            (p := sandbox.pool(NAMESPACE, "default"))
            and condition(p).get("status") == "False"
            and p
        ),
        timeout=20,
        message="default pool not Ready",
    )
    message = condition(refused)["message"].lower()
    assert "certificate" in message or "tls" in message or "ssl" in message, message
    sandbox.wait_pool_ready(NAMESPACE, "with-ca", timeout=20)
    sandbox.wait_pool_ready(NAMESPACE, "skip", timeout=20)
    assert condition(sandbox.pool(NAMESPACE, "default")).get("status") == "False"

    sandbox.claim(NAMESPACE, "m1", "with-ca")
    (claim,) = sandbox.wait_claims_bound(NAMESPACE, 1)
    assert claim["metadata"]["name"] == "m1"
    assert hosts(https_phpipam, 7) == {"m1.test": "10.20.0.2"}
