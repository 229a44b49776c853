"""The real kopf operator (in-process and as a subprocess) against the in-memory API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import kopf
import kopf.testing
import kubernetes.client
import pytest
from emulator_helpers import GROUP, WIDGETS

from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.auth import Identity, service_account_user
from mock_kubernetes.objects import wait_for
from mock_kubernetes.rbac import RBACAuthorizer

FINALIZER = "example.com/test-finalizer"
API_VERSION = f"{GROUP}/v2"


class Recorder:
    """What the handlers saw, shared with the test thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.deleted: list[str] = []


def build_operator(kube: EmulatedKubernetes, seen: Recorder) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info()

    @kopf.on.create(GROUP, "widgets", registry=registry)
    def create_fn(name: str, namespace: str, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-child", "namespace": namespace},
            "data": {"owner": name},
        }
        kopf.adopt(child, owner=body)
        with kube.api_client() as client:
            kubernetes.client.CoreV1Api(client).create_namespaced_config_map(namespace, child)
        patch.status["phase"] = "Ready"
        kopf.info(body, reason="Created", message=f"child {name}-child created")
        with seen.lock:
            seen.created.append(name)

    @kopf.on.delete(GROUP, "widgets", registry=registry)
    def delete_fn(name: str, **_: Any) -> None:
        with seen.lock:
            seen.deleted.append(name)

    return registry


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.watching.reconnect_backoff = 0.1
    settings.networking.error_backoffs = [0.1, 0.2]
    settings.posting.level = 0
    return settings


@pytest.fixture
def kube() -> Any:
    with EmulatedKubernetes(crds=[WIDGETS]) as emulator:
        yield emulator


def widget(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": 1},
    }


def test_kopf_runner_finalizer_create_delete_status_child(kube: EmulatedKubernetes) -> None:
    seen = Recorder()
    with kopf.testing.KopfRunner(
        ["run", "--standalone", "-A"],
        timeout=30,
        registry=build_operator(kube, seen),
        settings=operator_settings(),
    ) as runner:
        kube.create(widget("w1"))
        ready = kube.wait_for(
            API_VERSION,
            "widgets",
            name="w1",
            namespace="default",
            condition=lambda o: (o or {}).get("status", {}).get("phase") == "Ready",
        )
        assert FINALIZER in ready["metadata"]["finalizers"]
        child = kube.get("v1", "configmaps", "w1-child", "default")
        assert child is not None
        assert child["metadata"]["ownerReferences"][0]["uid"] == ready["metadata"]["uid"]
        kube.wait_for(
            "v1",
            "events",
            namespace="default",
            condition=lambda items: any(e.get("reason") == "Created" for e in items),
        )

        kube.delete(API_VERSION, "widgets", "w1", "default")
        kube.wait_for(
            API_VERSION, "widgets", name="w1", namespace="default", condition=lambda o: o is None
        )
        assert kube.get("v1", "configmaps", "w1-child", "default") is None  # collected
    assert runner.exit_code == 0 and runner.exception is None
    assert (seen.created, seen.deleted) == (["w1"], ["w1"])


def test_kopf_runner_handles_200_objects_in_seconds(kube: EmulatedKubernetes) -> None:
    seen = Recorder()
    count = 200
    names = [f"w{i:03}" for i in range(count)]
    with kopf.testing.KopfRunner(
        ["run", "--standalone", "-A"],
        timeout=60,
        registry=build_operator(kube, seen),
        settings=operator_settings(),
    ):
        started = time.monotonic()
        for name in names:
            kube.create(widget(name))
        kube.wait_for(
            API_VERSION,
            "widgets",
            timeout=60,
            condition=lambda items: (
                len([o for o in items if o.get("status", {}).get("phase") == "Ready"]) == count
            ),
        )
        for name in names:
            kube.delete(API_VERSION, "widgets", name, "default")
        kube.wait_for(API_VERSION, "widgets", timeout=60, condition=lambda items: not items)
        elapsed = time.monotonic() - started
    print(f"200 objects created, handled and deleted in {elapsed:.1f} s")
    assert sorted(seen.created) == names and sorted(seen.deleted) == names
    assert elapsed < 30


OPERATOR_MODULE = """
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.watching.reconnect_backoff = 0.1

@kopf.on.create("example.com", "widgets")
def create_fn(patch, **_):
    patch.status["phase"] = "Ready"
"""


def test_kopf_run_subprocess_with_kubeconfig(kube: EmulatedKubernetes, tmp_path: Path) -> None:
    module = tmp_path / "operator.py"
    module.write_text(textwrap.dedent(OPERATOR_MODULE))
    env = {**os.environ, "KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kubeconfig"))}
    kopf_cli = [sys.executable, "-m", "kopf", "run", "--standalone", "-n", "default", str(module)]
    process = subprocess.Popen(kopf_cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        kube.create(widget("sub"))
        kube.wait_for(
            API_VERSION,
            "widgets",
            name="sub",
            namespace="default",
            timeout=30,
            condition=lambda o: (o or {}).get("status", {}).get("phase") == "Ready",
        )
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=15)
    assert b"Traceback" not in output, output.decode()


def restricted_identity(*verbs_on_widgets: str) -> Identity:
    """The ServiceAccount tools/kopf with a ClusterRole on widgets and Events."""
    rules = [
        {"apiGroups": [GROUP], "resources": ["widgets"], "verbs": list(verbs_on_widgets)},
        {"apiGroups": [GROUP], "resources": ["widgets/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # kopf lists and watches CRDs to notice resources created later.
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
    ]
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kopf"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kopf"},
            "roleRef": {"kind": "ClusterRole", "name": "kopf"},
            "subjects": [{"kind": "ServiceAccount", "name": "kopf", "namespace": "tools"}],
        },
    ]
    return Identity(service_account_user("tools", "kopf"), RBACAuthorizer(objects))


def run_restricted_operator(kube: EmulatedKubernetes, identity: Identity, until: Any) -> None:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info(identity)

    @kopf.on.create(GROUP, "widgets", registry=registry)
    def create_fn(patch: kopf.Patch, **_: Any) -> None:
        patch.status["phase"] = "Ready"

    @kopf.on.delete(GROUP, "widgets", registry=registry)
    def delete_fn(**_: Any) -> None:
        pass

    with kopf.testing.KopfRunner(
        ["run", "--standalone", "-A"], timeout=30, registry=registry, settings=operator_settings()
    ) as runner:
        kube.create(widget("w1"))
        until()
    assert runner.exception is None


def test_kopf_with_a_restricted_identity_and_the_verbs_it_used() -> None:
    with EmulatedKubernetes(crds=[WIDGETS], require_token=True) as kube:
        identity = kube.add_identity(restricted_identity("get", "list", "watch", "patch"))
        run_restricted_operator(
            kube,
            identity,
            lambda: kube.wait_for(
                API_VERSION,
                "widgets",
                name="w1",
                namespace="default",
                condition=lambda o: (o or {}).get("status", {}).get("phase") == "Ready",
            ),
        )
        used = kube.access_log.permissions(identity)
        denied = kube.access_log.permissions(identity, allowed=False)
    assert denied == set()
    # kopf lists and watches cluster-wide, patches its finalizer/annotations and the status.
    assert {
        (GROUP, "widgets", "list"),
        (GROUP, "widgets", "watch"),
        (GROUP, "widgets", "patch"),
        (GROUP, "widgets/status", "patch"),
    } <= used
    assert {resource for _, resource, _ in used} <= {
        "widgets",
        "widgets/status",
        "events",
        "customresourcedefinitions",
    }


def test_kopf_without_patch_is_refused_and_the_log_says_what_is_missing() -> None:
    with EmulatedKubernetes(crds=[WIDGETS], require_token=True) as kube:
        identity = kube.add_identity(restricted_identity("get", "list", "watch"))
        run_restricted_operator(
            kube,
            identity,
            lambda: wait_for(
                lambda: (
                    (GROUP, "widgets", "patch")
                    in kube.access_log.permissions(identity, allowed=False)
                ),
                timeout=15,
            ),
        )
        assert FINALIZER not in (kube.get(API_VERSION, "widgets", "w1", "default") or {}).get(
            "metadata", {}
        ).get("finalizers", [])
