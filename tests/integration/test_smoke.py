from integration_env import CREDENTIALS, NAMESPACE

from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer


def test_one_claim_end_to_end(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.claim(NAMESPACE, "m1", "pool")
    (claim,) = sandbox.wait_claims_bound(NAMESPACE, 1)
    (address,) = sandbox.addresses(NAMESPACE)
    assert claim["status"]["addressRef"] == {"name": "m1"}
    assert address["spec"]["address"] == "10.20.0.2"
    assert [a.hostname for a in phpipam.store.subnet_addresses(7) if not a.is_gateway] == [
        "m1.test"
    ]
    sandbox.delete_claim(NAMESPACE, "m1")
    sandbox.wait_gone(NAMESPACE)
    assert [a.hostname for a in phpipam.store.subnet_addresses(7) if not a.is_gateway] == []


def test_operator_stops_with_a_clear_message_without_capi_crds(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from mock_kubernetes.server import EmulatedKubernetes

    with EmulatedKubernetes() as kube:
        env = {
            **os.environ,
            "KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
            "IPAM_BRIDGE_METRICS_PORT": "0",
            "IPAM_BRIDGE_HEALTH_PORT": "0",
        }
        result = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "run", "--standalone"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert "ipam.cluster.x-k8s.io is not served (are CAPI's CRDs installed?)" in (
        result.stdout + result.stderr
    )
