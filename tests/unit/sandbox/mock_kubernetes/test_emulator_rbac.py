"""Bearer-token identities, RBAC, OwnerReferencesPermissionEnforcement and the access log.

A restricted identity's requests are decided by RBAC rules (read from YAML, ``deploy/``
included) as the API server's RBAC authorizer decides them, refusals carry the API server's
messages, and every decision is in ``kube.access_log``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import requests
import yaml
from emulator_helpers import GROUP, widget
from kubernetes.client.rest import ApiException

from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.auth import (
    AccessRecord,
    Identity,
    RequestAttributes,
    User,
    request_attributes,
    service_account_user,
)
from mock_kubernetes.rbac import (
    DEPLOY_DIR,
    PolicyRule,
    RBACAuthorizer,
    deploy_identity,
    deploy_objects,
    kustomize_tool,
    load_objects,
)

SA = service_account_user("tools", "robot")
ROBOT = SA.name


def attributes(verb: str, resource: str, namespace: str = "", **extra: Any) -> RequestAttributes:
    group = extra.pop("group", GROUP)
    plural, _, sub = resource.partition("/")
    return RequestAttributes(
        verb=verb,
        path="",
        resource_request=True,
        api_group=group,
        resource=plural,
        subresource=sub,
        namespace=namespace,
        **extra,
    )


# -- request attributes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/secrets/s", {}, ("get", "", "secrets", "", "ns", "s")),
        ("GET", "/api/v1/namespaces/ns/secrets", {}, ("list", "", "secrets", "", "ns", "")),
        ("GET", "/api/v1/secrets", {"watch": "true"}, ("watch", "", "secrets", "", "", "")),
        ("GET", "/api/v1/secrets", {"watch": "1"}, ("watch", "", "secrets", "", "", "")),
        (
            "GET",
            "/api/v1/namespaces/ns/secrets",
            {"fieldSelector": "metadata.name=s"},
            ("list", "", "secrets", "", "ns", "s"),
        ),
        (
            "POST",
            f"/apis/{GROUP}/v1/namespaces/ns/widgets",
            {},
            ("create", GROUP, "widgets", "", "ns", ""),
        ),
        (
            "PUT",
            f"/apis/{GROUP}/v1/namespaces/ns/widgets/w/status",
            {},
            ("update", GROUP, "widgets", "status", "ns", "w"),
        ),
        (
            "PATCH",
            f"/apis/{GROUP}/v1/gadgets/g",
            {},
            ("patch", GROUP, "gadgets", "", "", "g"),
        ),
        (
            "DELETE",
            f"/apis/{GROUP}/v1/namespaces/ns/widgets/w",
            {},
            ("delete", GROUP, "widgets", "", "ns", "w"),
        ),
        (
            "DELETE",
            f"/apis/{GROUP}/v1/namespaces/ns/widgets",
            {},
            ("deletecollection", GROUP, "widgets", "", "ns", ""),
        ),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "", "namespaces", "", "ns", "ns")),
        ("GET", "/api/v1/namespaces", {}, ("list", "", "namespaces", "", "", "")),
        (
            "PUT",
            "/api/v1/namespaces/ns/finalize",
            {},
            ("update", "", "namespaces", "finalize", "ns", "ns"),
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/watch/namespaces/ns/leases",
            {},
            ("watch", "coordination.k8s.io", "leases", "", "ns", ""),
        ),
    ],
)
def test_request_attributes_follow_the_api_servers_request_info(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    found = request_attributes(method, path, query)
    assert found.resource_request
    assert (
        found.verb,
        found.api_group,
        found.resource,
        found.subresource,
        found.namespace,
        found.name,
    ) == expected


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/apis", f"/apis/{GROUP}/v1", "/version"])
def test_discovery_paths_are_non_resource_requests(path: str) -> None:
    found = request_attributes("GET", path)
    assert (found.resource_request, found.verb, found.path) == (False, "get", path)


# -- rules and bindings ------------------------------------------------------------------------


def test_policy_rule_matching() -> None:
    rule = PolicyRule.from_dict(
        {"apiGroups": [GROUP], "resources": ["widgets", "gadgets/status"], "verbs": ["get"]}
    )
    assert rule.allows(attributes("get", "widgets", "ns"))
    assert not rule.allows(attributes("get", "widgets/status", "ns"))  # subresources are apart
    assert rule.allows(attributes("get", "gadgets/status"))
    assert not rule.allows(attributes("list", "widgets", "ns"))
    assert not rule.allows(attributes("get", "widgets", "ns", group="other.example.com"))

    any_status = PolicyRule.from_dict(
        {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}
    )
    assert any_status.allows(attributes("patch", "widgets/status", "ns"))
    assert not any_status.allows(attributes("patch", "widgets", "ns"))

    named = PolicyRule.from_dict(
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s"], "verbs": ["get"]}
    )
    assert named.allows(attributes("get", "secrets", "ns", group="", name="s"))
    assert not named.allows(attributes("get", "secrets", "ns", group="", name="t"))
    assert not named.allows(attributes("list", "secrets", "ns", group=""))

    urls = PolicyRule.from_dict({"nonResourceURLs": ["/healthz", "/metrics/*"], "verbs": ["get"]})
    assert urls.allows(RequestAttributes(verb="get", path="/metrics/x"))
    assert not urls.allows(RequestAttributes(verb="get", path="/livez"))


RBAC_OBJECTS: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["get", "list"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "robot-reads"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "tools"}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "writer", "namespace": "team"},
        "rules": [{"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["create", "patch"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "robot-writes", "namespace": "team"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "tools"}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "admins-read-secrets", "namespace": "team"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "secrets",
        },
        "subjects": [{"kind": "Group", "name": "admins"}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "secrets"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "dangling", "namespace": "other"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gone"},
        "subjects": [{"kind": "User", "name": ROBOT}],
    },
]


def test_rbac_authorizer_bindings() -> None:
    rbac = RBACAuthorizer(RBAC_OBJECTS)
    assert rbac.authorize(SA, attributes("list", "widgets"))[0]  # ClusterRoleBinding: anywhere
    assert rbac.authorize(SA, attributes("get", "widgets", "any"))[0]
    assert rbac.authorize(SA, attributes("create", "widgets", "team"))[0]  # RoleBinding
    assert not rbac.authorize(SA, attributes("create", "widgets", "elsewhere"))[0]
    assert not rbac.authorize(SA, attributes("create", "widgets"))[0]  # not cluster-wide
    admin = User("alice", ("admins", "system:authenticated"))
    assert rbac.authorize(admin, attributes("get", "secrets", "team", group=""))[0]
    assert not rbac.authorize(admin, attributes("get", "secrets", "other", group=""))[0]
    assert not rbac.authorize(User("bob"), attributes("get", "widgets", "team"))[0]
    # A binding to a role that does not exist grants nothing and says so.
    assert rbac.authorize(SA, attributes("delete", "widgets", "other")) == (
        False,
        'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found',
    )
    assert {r.verbs for r in rbac.rules_for(SA, "team")} == {("get", "list"), ("create", "patch")}


def test_aggregated_cluster_roles() -> None:
    rbac = RBACAuthorizer(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "all"},
                "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "yes"}}]},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "part", "labels": {"agg": "yes"}},
                "rules": [{"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["get"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "b"},
                "roleRef": {"kind": "ClusterRole", "name": "all"},
                "subjects": [{"kind": "User", "name": "u"}],
            },
        ]
    )
    assert rbac.authorize(User("u"), attributes("get", "widgets", "ns"))[0]


# -- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def robot(kube: EmulatedKubernetes, tmp_path: Path) -> Identity:
    """The ServiceAccount tools/robot with the RBAC of RBAC_OBJECTS, read from a YAML file."""
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all(RBAC_OBJECTS), encoding="utf-8")
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    return kube.add_identity(Identity(SA, RBACAuthorizer.from_files(path)))


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


def test_restricted_identity_is_authorized_by_its_rules_and_logged(
    kube: EmulatedKubernetes, robot: Identity
) -> None:
    kube.create(widget("w", metadata={"name": "w", "namespace": "team"}))
    with kube.api_client(robot) as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        assert custom.get_namespaced_custom_object(GROUP, "v2", "team", "widgets", "w")
        custom.patch_namespaced_custom_object(
            GROUP, "v2", "team", "widgets", "w", {"metadata": {"labels": {"a": "b"}}}
        )
        with pytest.raises(ApiException) as error:
            custom.delete_namespaced_custom_object(GROUP, "v2", "team", "widgets", "w")
        with pytest.raises(ApiException) as cluster_wide:
            custom.create_cluster_custom_object(
                GROUP, "v1", "gadgets", {"apiVersion": f"{GROUP}/v1", "kind": "Gadget"}
            )
        # Discovery is open to every authenticated identity.
        groups = kubernetes.client.ApisApi(client).get_api_versions().groups
        assert GROUP in {g.name for g in groups}
    assert error.value.status == 403
    assert status_of(error.value) | {"details": None} == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "details": None,
        "message": f'widgets.{GROUP} "w" is forbidden: User "{ROBOT}" cannot delete resource'
        f' "widgets" in API group "{GROUP}" in the namespace "team"',
    }
    assert status_of(cluster_wide.value)["message"] == (
        f'gadgets.{GROUP} is forbidden: User "{ROBOT}" cannot create resource "gadgets"'
        f' in API group "{GROUP}" at the cluster scope'
    )
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "team") is not None  # nothing deleted

    assert kube.access_log.permissions(robot) == {
        (GROUP, "widgets", "get"),
        (GROUP, "widgets", "patch"),
        (GROUP, "widgets", "delete"),
        (GROUP, "gadgets", "create"),
    }
    assert kube.access_log.permissions(robot, allowed=False) == {
        (GROUP, "widgets", "delete"),
        (GROUP, "gadgets", "create"),
    }
    (denied, _) = kube.access_log.records(robot, allowed=False)
    assert denied == AccessRecord(
        user=ROBOT,
        verb="delete",
        group=GROUP,
        resource="widgets",
        subresource="",
        namespace="team",
        name="w",
        path=f"/apis/{GROUP}/v2/namespaces/team/widgets/w",
        allowed=False,
    )
    assert all(r.user == ROBOT for r in kube.access_log.records(robot))


def test_admin_is_unrestricted_and_tokens_are_checked(
    kube: EmulatedKubernetes, robot: Identity
) -> None:
    url = kube.url + f"/apis/{GROUP}/v2/namespaces/team/widgets"
    assert requests.get(url, timeout=5).status_code == 200  # no token: the admin, by default
    admin = {"Authorization": f"Bearer {kube.admin.token}"}
    assert requests.delete(url + "/nothing", headers=admin, timeout=5).status_code == 404
    wrong = requests.get(url, headers={"Authorization": "Bearer nope"}, timeout=5)
    assert (wrong.status_code, wrong.json()["reason"]) == (401, "Unauthorized")
    basic = requests.get(url, headers={"Authorization": "Basic YTpi"}, timeout=5)
    assert basic.status_code == 401
    assert kube.access_log.permissions(kube.admin) == {
        (GROUP, "widgets", "list"),
        (GROUP, "widgets", "delete"),
    }


def test_require_token_refuses_anonymous_requests(tmp_path: Path) -> None:
    with EmulatedKubernetes(require_token=True) as kube:
        assert requests.get(kube.url + "/api/v1/namespaces", timeout=5).status_code == 401
        with kube.api_client() as client:  # the admin's token
            names = [
                n.metadata.name for n in kubernetes.client.CoreV1Api(client).list_namespace().items
            ]
        assert "default" in names
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
            client_configuration=config,
        )
        with kubernetes.client.ApiClient(config) as client:
            assert kubernetes.client.CoreV1Api(client).list_namespace().items


# -- OwnerReferencesPermissionEnforcement ------------------------------------------------------


def gadget_owner(kube: EmulatedKubernetes, block: bool) -> dict[str, Any]:
    gadget = kube.create({"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": "g"}})
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "name": "g",
        "uid": gadget["metadata"]["uid"],
        "blockOwnerDeletion": block,
    }


def owner_enforcement_identity(kube: EmulatedKubernetes, *extra_rules: dict[str, Any]) -> Identity:
    rules = [
        {"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["create", "patch", "get"]},
        *extra_rules,
    ]
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "r"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "r"},
            "roleRef": {"kind": "ClusterRole", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "tools"}],
        },
    ]
    return kube.add_identity(Identity(SA, RBACAuthorizer(objects)))


def create_owned_widget(
    kube: EmulatedKubernetes, identity: Identity, ref: dict[str, Any]
) -> dict[str, Any]:
    body = widget("w", metadata={"name": "w", "ownerReferences": [ref]})
    with kube.api_client(identity) as client:
        result: dict[str, Any] = kubernetes.client.CustomObjectsApi(
            client
        ).create_namespaced_custom_object(GROUP, "v2", "default", "widgets", body)
    return result


def test_block_owner_deletion_needs_update_on_the_owners_finalizers(
    kube: EmulatedKubernetes,
) -> None:
    robot = owner_enforcement_identity(kube)
    ref = gadget_owner(kube, block=True)
    with pytest.raises(ApiException) as error:
        create_owned_widget(kube, robot, ref)
    assert error.value.status == 403
    assert status_of(error.value)["message"] == (
        f'widgets.{GROUP} "w" is forbidden: cannot set blockOwnerDeletion if an ownerReference'
        " refers to a resource you can't set finalizers on: , <nil>"
    )
    assert kube.get(f"{GROUP}/v2", "widgets", "w", "default") is None
    check = kube.access_log.records(robot, allowed=False)[-1]
    assert (check.via, check.verb, check.resource_path, check.name, check.namespace) == (
        "OwnerReferencesPermissionEnforcement",
        "update",
        "gadgets/finalizers",
        "g",
        "",  # a cluster-scoped owner: checked at the cluster scope
    )
    assert (GROUP, "gadgets/finalizers", "update") in kube.access_log.permissions(robot)

    # Without blockOwnerDeletion the same reference needs nothing more.
    created = create_owned_widget(kube, robot, {**ref, "blockOwnerDeletion": False})
    assert created["metadata"]["ownerReferences"][0]["name"] == "g"


def test_block_owner_deletion_is_allowed_with_the_finalizers_rule(
    kube: EmulatedKubernetes,
) -> None:
    rule = {"apiGroups": [GROUP], "resources": ["gadgets/finalizers"], "verbs": ["update"]}
    robot = owner_enforcement_identity(kube, rule)
    created = create_owned_widget(kube, robot, gadget_owner(kube, block=True))
    assert created["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    assert kube.access_log.records(robot, allowed=False) == []


def test_changing_owner_references_on_update_needs_delete_on_the_object(
    kube: EmulatedKubernetes,
) -> None:
    robot = owner_enforcement_identity(kube)
    ref = gadget_owner(kube, block=False)
    kube.create(widget("w", metadata={"name": "w", "namespace": "default"}))
    with kube.api_client(robot) as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(ApiException) as error:
            custom.patch_namespaced_custom_object(
                GROUP, "v2", "default", "widgets", "w", {"metadata": {"ownerReferences": [ref]}}
            )
        # A patch that leaves the references alone is not checked.
        custom.patch_namespaced_custom_object(
            GROUP, "v2", "default", "widgets", "w", {"metadata": {"labels": {"x": "y"}}}
        )
    assert status_of(error.value)["message"] == (
        f'widgets.{GROUP} "w" is forbidden: cannot set an ownerRef on a resource you can\'t'
        " delete: , <nil>"
    )


# -- the RBAC of deploy/ -----------------------------------------------------------------------


def cluster_role_rules() -> list[dict[str, Any]]:
    """The rules of deploy/manager/rbac.yaml's ClusterRole, read as plain YAML."""
    with (DEPLOY_DIR / "manager" / "rbac.yaml").open(encoding="utf-8") as handle:
        (role,) = [d for d in yaml.safe_load_all(handle) if d and d["kind"] == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_deploy_objects_are_what_kubectl_kustomize_renders() -> None:
    tool = kustomize_tool() or shutil.which("kubectl")
    assert tool, "kubectl: `make kubectl` (make test passes KUBECTL)"
    command = [tool, "build"] if Path(tool).name.startswith("kustomize") else [tool, "kustomize"]
    output = subprocess.run(
        [*command, str(DEPLOY_DIR)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert deploy_objects() == [d for d in yaml.safe_load_all(output) if d is not None]


def test_deploy_objects_need_kubectl_or_kustomize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KUSTOMIZE", "KUBECTL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    assert kustomize_tool() is None
    with pytest.raises(Exception, match="make kubectl"):
        deploy_objects()
    # RBAC files without a kustomization need no tool.
    (tmp_path / "role.yaml").write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n"
    )
    assert [o["kind"] for o in load_objects(tmp_path)] == ["ClusterRole"]


def test_deploy_identity_is_the_deployments_service_account_with_deploys_rbac() -> None:
    objects = deploy_objects()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    identity = deploy_identity()
    assert identity.name == f"system:serviceaccount:{namespace}:{account}"
    assert f"system:serviceaccounts:{namespace}" in identity.user.groups
    assert identity.authorizer is not None

    everything = {
        (group, resource, verb, name)
        for rule in cluster_role_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }
    assert everything  # the install grants something
    for group, resource, verb, name in everything:
        for ns in ("", "team"):
            assert identity.authorize(attributes(verb, resource, ns, group=group, name=name))[0]
    # A rule limited to resourceNames grants nothing else (namespaces: kube-system alone).
    assert not identity.authorize(attributes("get", "namespaces", "", group="", name="team"))[0]
    everything_unnamed = {(group, resource, verb) for group, resource, verb, _ in everything}
    # What no rule grants is refused, e.g. deleting claims or listing Secrets.
    for group, resource, verb in [
        ("ipam.cluster.x-k8s.io", "ipaddressclaims", "delete"),
        ("", "secrets", "list"),
        ("", "configmaps", "get"),
    ]:
        if (group, resource, verb) not in everything_unnamed:
            assert not identity.authorize(attributes(verb, resource, "team", group=group))[0]


def test_the_operator_identity_of_deploy_may_create_an_owned_ipaddress() -> None:
    """Issue 9 item 8: IPAddress -> claim and -> pool references with blockOwnerDeletion."""
    from mock_kubernetes.sandbox import crd_documents

    identity = deploy_identity()
    with EmulatedKubernetes(crds=crd_documents(), identities=[identity]) as kube:
        claim = kube.create(
            {
                "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                "kind": "IPAddressClaim",
                "metadata": {"name": "m1", "namespace": "default"},
                "spec": {
                    "poolRef": {
                        "apiGroup": "ipam.cluster.x-k8s.io",
                        "kind": "PHPIPAMIPPool",
                        "name": "p",
                    }
                },
            }
        )
        pool = kube.create(
            {
                "apiVersion": "ipam.cluster.x-k8s.io/v1alpha1",
                "kind": "PHPIPAMIPPool",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {  # valid: the CRD's CEL rules are enforced
                    "endpoint": "https://ipam.example.com/api",
                    "appId": "capi",
                    "credentialsRef": {"name": "p-credentials"},
                    "subnetId": 7,
                },
            }
        )
        refs = [
            {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"],
                "controller": obj is claim,
                "blockOwnerDeletion": True,
            }
            for obj in (claim, pool)
        ]
        address = {
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddress",
            "metadata": {"name": "m1", "ownerReferences": refs},
            "spec": {
                "address": "10.0.0.2",
                "prefix": 24,
                "claimRef": {"name": "m1"},
                "poolRef": claim["spec"]["poolRef"],
            },
        }
        with kube.api_client(identity) as client:
            kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
                "ipam.cluster.x-k8s.io", "v1beta2", "default", "ipaddresses", address
            )
        checks = {
            (r.resource_path, r.allowed)
            for r in kube.access_log.records(identity)
            if r.via == "OwnerReferencesPermissionEnforcement"
        }
    assert checks == {("ipaddressclaims/finalizers", True), ("phpipamippools/finalizers", True)}
