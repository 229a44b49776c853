"""``ipam-bridge run`` (the real process) starts and serves, or stops saying why (issue 9, 10).

- In a cluster that has kopf's peering CRDs (another kopf operator installed them) but no
  ``ClusterKopfPeering`` for us, v0.1 started, served nothing and said nothing: the
  operator runs without kopf peering, with no option to set.
- The operator runs as ``deploy/``'s ServiceAccount with a bearer token in its kubeconfig:
  kopf logs in with that token (`kubeconfig.kopf_connection_info`); v0.1's kopf connected
  anonymously and was refused for ever.
- A start-up that cannot succeed (CAPI's CRDs missing, the token refused, RBAC refusing
  kopf's first list) ends the process with exit code 1 and a last line that says why, in
  the API server's words.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_env import CREDENTIALS, NAMESPACE, schemaless_crd

from mock_kubernetes.auth import Identity, service_account_user
from mock_kubernetes.rbac import RBACAuthorizer, deploy_identity, deploy_objects
from mock_kubernetes.sandbox import FAST_SETTINGS, Sandbox, crd_documents
from mock_kubernetes.server import EmulatedKubernetes
from mock_phpipam.server import MockPhpipamServer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(kubeconfig: Path, **settings: str) -> dict[str, str]:
    """This environment without any ``IPAM_BRIDGE_*`` setting, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPAM_BRIDGE_")}
    env.update(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1", **settings)
    return env


@pytest.fixture
def peering_cluster(tmp_path: Path) -> Iterator[Sandbox]:
    """An emulated cluster with kopf's peering CRDs and no peering object; no operator yet.

    The operator's kubeconfig carries the bearer token of ``deploy/``'s ServiceAccount, with
    ``deploy/``'s RBAC; requests without a token are refused.
    """
    with Sandbox(tmp_path, start_operator=False, identity="operator") as sandbox:
        sandbox.kube.declare_crd(
            schemaless_crd("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings", "Cluster")
        )
        sandbox.kube.declare_crd(schemaless_crd("kopf.dev", "v1", "KopfPeering", "kopfpeerings"))
        sandbox.namespace(NAMESPACE)
        yield sandbox


def test_default_run_serves_in_a_cluster_with_kopf_peering_crds(
    peering_cluster: Sandbox, phpipam: MockPhpipamServer, tmp_path: Path
) -> None:
    # Only the sandbox's quick timings; no peering or standalone setting, no flag.
    timings = {
        key: value
        for key, value in FAST_SETTINGS.items()
        if key not in ("IPAM_BRIDGE_STANDALONE", "IPAM_BRIDGE_NAMESPACE")
    }
    timings.update(
        IPAM_BRIDGE_METRICS_PORT=str(_free_port()),
        IPAM_BRIDGE_METRICS_ADDRESS="127.0.0.1",
        IPAM_BRIDGE_HEALTH_PORT="0",
    )
    env = _environment(peering_cluster.workdir / "kubeconfig", **timings)
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        peering_cluster.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
        )
        peering_cluster.claim(NAMESPACE, "m1", "pool")
        try:
            (claim,) = peering_cluster.wait_claims_bound(NAMESPACE, 1, timeout=60)
        except Exception:
            process.terminate()
            process.wait(timeout=30)
            pytest.fail("the claim was not bound:\n" + log_path.read_text(errors="replace"))
        assert claim["status"]["addressRef"] == {"name": "m1"}
        assert process.poll() is None
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
    output = log_path.read_text(errors="replace")
    assert "peering" not in output.lower(), output
    assert peering_cluster.kube.list("kopf.dev/v1", "clusterkopfpeerings") == []
    # the informers' watches ran as the ServiceAccount (its token), none was refused
    log = peering_cluster.kube.access_log
    mine = log.records(peering_cluster.identity)
    assert any(r.verb == "watch" and r.resource == "ipaddressclaims" for r in mine), mine
    assert log.records(allowed=False) == []


def test_run_without_capi_crds_exits_1_with_the_handlers_message(tmp_path: Path) -> None:
    with EmulatedKubernetes() as kube:
        env = _environment(
            kube.write_kubeconfig(tmp_path / "kubeconfig"),
            IPAM_BRIDGE_METRICS_PORT="0",
            IPAM_BRIDGE_HEALTH_PORT="0",
        )
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "ipam-bridge: start-up failed: API group ipam.cluster.x-k8s.io is not served "
        "(are CAPI's CRDs installed?)"
    )


def _run(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "run"],
        env=_environment(kubeconfig, IPAM_BRIDGE_METRICS_PORT="0", IPAM_BRIDGE_HEALTH_PORT="0"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rbac_refusing_kopfs_first_list_exits_1_with_the_api_servers_message(
    tmp_path: Path,
) -> None:
    nobody = Identity(service_account_user("ipam-bridge-system", "nobody"), RBACAuthorizer([]))
    with EmulatedKubernetes(crds=crd_documents(), identities=[nobody], require_token=True) as kube:
        result = _run(kube.write_kubeconfig(tmp_path / "kubeconfig", nobody))
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    # The start-up handler lists one claim: the refusal stops the process at once (before
    # the informers would retry it).
    assert last.startswith("ipam-bridge: start-up failed: the API server refused: "), last
    assert (
        'is forbidden: User "system:serviceaccount:ipam-bridge-system:nobody" cannot list '
        "resource" in last
    ), last


def test_an_unknown_token_exits_1_at_start_up(tmp_path: Path) -> None:
    stranger = Identity(service_account_user("ipam-bridge-system", "gone"))
    with EmulatedKubernetes(crds=crd_documents(), require_token=True) as kube:
        # a kubeconfig whose token the API server does not know (a deleted ServiceAccount)
        result = _run(kube.write_kubeconfig(tmp_path / "kubeconfig", stranger))
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("ipam-bridge: "), last
    assert "Unauthorized" in last, last


def test_a_cluster_id_that_cannot_be_read_exits_1_naming_the_setting(tmp_path: Path) -> None:
    # deploy/'s RBAC without its one rule on namespace kube-system: everything else is
    # granted, so the start-up gets as far as the management cluster's identity.
    objects = copy.deepcopy(deploy_objects())
    for obj in objects:
        if obj["kind"] == "ClusterRole":
            obj["rules"] = [r for r in obj["rules"] if "namespaces" not in r["resources"]]
    identity = deploy_identity(objects=objects)
    with EmulatedKubernetes(
        crds=crd_documents(), identities=[identity], require_token=True
    ) as kube:
        result = _run(kube.write_kubeconfig(tmp_path / "kubeconfig", identity))
        refused = [r for r in kube.access_log.records(allowed=False)]
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("ipam-bridge: start-up failed: IPAM_BRIDGE_CLUSTER_ID is empty"), last
    assert "kube-system" in last and "403" in last, last
    assert [(r.verb, r.resource, r.name) for r in refused] == [("get", "namespaces", "kube-system")]
