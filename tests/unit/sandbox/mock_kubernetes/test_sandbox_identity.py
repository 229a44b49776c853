"""Sandbox(identity=...): the operator's kubeconfig carries a restricted identity from deploy/."""

from __future__ import annotations

import json

import kubernetes.client
import pytest
import requests
import yaml
from kubernetes.client.rest import ApiException

from mock_kubernetes.rbac import deploy_objects
from mock_kubernetes.sandbox import Sandbox

GROUP = "ipam.cluster.x-k8s.io"


def operator_account() -> tuple[str, str]:
    (deployment,) = [o for o in deploy_objects() if o["kind"] == "Deployment"]
    return (
        deployment["metadata"]["namespace"],
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
    )


def test_sandbox_runs_the_operator_as_deploys_service_account() -> None:
    namespace, account = operator_account()
    with Sandbox(identity="operator", start_operator=False) as sandbox:
        assert sandbox.identity.name == f"system:serviceaccount:{namespace}:{account}"
        kubeconfig = yaml.safe_load((sandbox.workdir / "kubeconfig").read_text())
        assert kubeconfig["users"][0]["user"] == {"token": sandbox.identity.token}
        assert sandbox.kube.get("v1", "namespaces", namespace) is not None

        # The test's helpers stay admin.
        sandbox.namespace("team")
        sandbox.claim("team", "m1", "pool")
        assert sandbox.get_claim("team", "m1") is not None

        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(sandbox.workdir / "kubeconfig"), client_configuration=config
        )
        with kubernetes.client.ApiClient(config) as client:
            custom = kubernetes.client.CustomObjectsApi(client)
            listed = custom.list_cluster_custom_object(GROUP, sandbox.version, "ipaddressclaims")
            assert [c["metadata"]["name"] for c in listed["items"]] == ["m1"]
            with pytest.raises(ApiException) as error:
                custom.delete_namespaced_custom_object(
                    GROUP, sandbox.version, "team", "ipaddressclaims", "m1"
                )
        assert error.value.status == 403
        assert (
            f'User "{sandbox.identity.name}" cannot delete'
            in json.loads(error.value.body)["message"]
        )
        # Nothing runs as the admin by accident: requests without a token are refused.
        anonymous = requests.get(sandbox.kube.url + "/api/v1/namespaces", timeout=5)
        assert anonymous.status_code == 401
        assert sandbox.kube.access_log.permissions(sandbox.identity) == {
            (GROUP, "ipaddressclaims", "list"),
            (GROUP, "ipaddressclaims", "delete"),
        }


def test_sandbox_default_identity_is_the_admin() -> None:
    with Sandbox(start_operator=False) as sandbox:
        assert sandbox.identity is sandbox.kube.admin
        assert requests.get(sandbox.kube.url + "/api/v1/namespaces", timeout=5).status_code == 200


def test_sandbox_rejects_an_unknown_identity_name() -> None:
    with pytest.raises(ValueError, match="identity must be"):
        Sandbox(identity="root")
