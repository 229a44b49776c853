"""RBAC for the in-memory Kubernetes API: Roles, ClusterRoles and bindings read from YAML.

:class:`RBACAuthorizer` decides requests as the API server's RBAC authorizer does
(https://github.com/kubernetes/kubernetes/blob/master/plugin/pkg/auth/authorizer/rbac/rbac.go,
https://github.com/kubernetes/kubernetes/blob/master/pkg/apis/rbac/v1/evaluation_helpers.go):
ClusterRoleBindings grant everywhere, RoleBindings in their namespace (a Role of that
namespace or a ClusterRole), subjects are users, groups or ServiceAccounts, rules match verb,
API group, ``resource[/subresource]`` (``*`` and ``*/<subresource>`` included) and
``resourceNames``. :func:`deploy_identity` is the operator's ServiceAccount with the RBAC of
``deploy/``, rendered by kustomize itself (``kubectl kustomize``, through
``deploy/release_manifests.py``'s :func:`render_kustomization`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from mock_kubernetes.auth import Identity, RequestAttributes, User, service_account_user

__all__ = [
    "DEPLOY_DIR",
    "PolicyRule",
    "RBACAuthorizer",
    "deploy_identity",
    "deploy_objects",
    "kustomize_tool",
    "load_objects",
]

#: ``deploy/`` of a source checkout (``sandbox/mock_kubernetes/`` -> the checkout's root; not part
#: of a wheel).
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
_RBAC_GROUP = "rbac.authorization.k8s.io"
_KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


@dataclasses.dataclass(frozen=True)
class PolicyRule:
    """One rule of a Role or ClusterRole (``rbac/v1 PolicyRule``).

    Parameters
    ----------
    verbs : tuple of str
        ``get``, ``list``... or ``*``.
    api_groups : tuple of str
        ``""`` for the core group, or ``*``.
    resources : tuple of str
        ``<plural>``, ``<plural>/<subresource>``, ``*/<subresource>`` or ``*``.
    resource_names : tuple of str
        When not empty, only objects of these names.
    non_resource_urls : tuple of str
        Paths such as ``/healthz`` or ``/api/*`` (ClusterRoles only).

    """

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, rule: Mapping[str, Any]) -> PolicyRule:
        """Build a rule from its YAML form (``apiGroups``, ``resources``, ``verbs``...)."""

        def strings(key: str) -> tuple[str, ...]:
            return tuple(str(v) for v in rule.get(key) or ())

        return cls(
            verbs=strings("verbs"),
            api_groups=strings("apiGroups"),
            resources=strings("resources"),
            resource_names=strings("resourceNames"),
            non_resource_urls=strings("nonResourceURLs"),
        )

    def allows(self, attributes: RequestAttributes) -> bool:
        """Whether this rule grants the request (``RuleAllows``).

        Parameters
        ----------
        attributes : RequestAttributes
            The request.

        Returns
        -------
        bool
            Verb, group, resource (with subresource) and name match for a resource request;
            verb and path for a non-resource request.

        """
        if not ("*" in self.verbs or attributes.verb in self.verbs):
            return False
        if not attributes.resource_request:
            path = attributes.path
            return any(
                url == "*" or url == path or (url.endswith("*") and path.startswith(url[:-1]))
                for url in self.non_resource_urls
            )
        if not ("*" in self.api_groups or attributes.api_group in self.api_groups):
            return False
        combined = attributes.resource_path
        sub = attributes.subresource
        if not any(
            r == "*" or r == combined or (bool(sub) and r == f"*/{sub}") for r in self.resources
        ):
            return False
        return not self.resource_names or attributes.name in self.resource_names


@dataclasses.dataclass(frozen=True)
class _Binding:
    namespace: str  # "" for a ClusterRoleBinding
    name: str
    role_kind: str
    role_name: str
    subjects: tuple[Mapping[str, Any], ...]

    def applies_to(self, user: User, namespace: str) -> bool:
        for subject in self.subjects:
            kind, name = subject.get("kind"), subject.get("name")
            if kind == "User" and user.name == name:
                return True
            if kind == "Group" and name in user.groups:
                return True
            if kind == "ServiceAccount":
                sa_namespace = subject.get("namespace") or namespace
                if sa_namespace and user.name == f"system:serviceaccount:{sa_namespace}:{name}":
                    return True
        return False


class RBACAuthorizer:
    """Authorize requests by the RBAC objects (Roles, ClusterRoles, bindings) given.

    Parameters
    ----------
    objects : iterable of mapping
        Kubernetes objects; those of kinds ``Role``, ``ClusterRole``, ``RoleBinding`` and
        ``ClusterRoleBinding`` (``rbac.authorization.k8s.io/v1``) are used, others ignored.
        A ClusterRole with an ``aggregationRule`` gets the rules of the ClusterRoles whose
        labels match its ``clusterRoleSelectors`` (``matchLabels``).

    Notes
    -----
    A binding whose role does not exist grants nothing, and a refusal's reason then names it
    (``RBAC: clusterrole.rbac.authorization.k8s.io "x" not found``), as the API server's.

    """

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._cluster_roles: dict[str, tuple[PolicyRule, ...]] = {}
        self._roles: dict[tuple[str, str], tuple[PolicyRule, ...]] = {}
        self._bindings: list[_Binding] = []
        aggregated: list[Mapping[str, Any]] = []
        labels: dict[str, Mapping[str, Any]] = {}
        for obj in objects:
            kind = obj.get("kind")
            if str(obj.get("apiVersion", "")).rpartition("/")[0] != _RBAC_GROUP:
                continue
            meta = obj.get("metadata") or {}
            name = str(meta.get("name", ""))
            rules = tuple(PolicyRule.from_dict(r) for r in obj.get("rules") or ())
            if kind == "ClusterRole":
                self._cluster_roles[name] = rules
                labels[name] = meta.get("labels") or {}
                if obj.get("aggregationRule"):
                    aggregated.append(obj)
            elif kind == "Role":
                self._roles[(str(meta.get("namespace") or "default"), name)] = rules
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                ref = obj.get("roleRef") or {}
                self._bindings.append(
                    _Binding(
                        namespace=""
                        if kind == "ClusterRoleBinding"
                        else str(meta.get("namespace") or "default"),
                        name=name,
                        role_kind=str(ref.get("kind", "")),
                        role_name=str(ref.get("name", "")),
                        subjects=tuple(obj.get("subjects") or ()),
                    )
                )
        for obj in aggregated:
            selectors = (obj.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
            combined = list(self._cluster_roles[obj["metadata"]["name"]])
            for role, role_labels in labels.items():
                if role == obj["metadata"]["name"]:
                    continue
                for selector in selectors:
                    wanted = selector.get("matchLabels") or {}
                    if all(role_labels.get(k) == v for k, v in wanted.items()):
                        combined.extend(self._cluster_roles[role])
                        break
            self._cluster_roles[obj["metadata"]["name"]] = tuple(combined)

    @classmethod
    def from_files(cls, *paths: str | Path) -> RBACAuthorizer:
        """Build an authorizer from YAML files or directories (see :func:`load_objects`)."""
        return cls(load_objects(*paths))

    def _role_rules(self, binding: _Binding, errors: list[str]) -> tuple[PolicyRule, ...]:
        if binding.role_kind == "ClusterRole":
            rules = self._cluster_roles.get(binding.role_name)
            missing = f'clusterrole.{_RBAC_GROUP} "{binding.role_name}" not found'
        else:
            rules = self._roles.get((binding.namespace, binding.role_name))
            missing = f'role.{_RBAC_GROUP} "{binding.role_name}" not found'
        if rules is None:
            errors.append(missing)
            return ()
        return rules

    def rules_for(self, user: User, namespace: str = "") -> list[PolicyRule]:
        """Return the rules that apply to ``user`` in ``namespace`` (cluster-wide with ``""``).

        Parameters
        ----------
        user : User
            The user.
        namespace : str
            The namespace of a request; RoleBindings of other namespaces do not apply.

        Returns
        -------
        list of PolicyRule
            From ClusterRoleBindings, then from RoleBindings of ``namespace``.

        """
        errors: list[str] = []
        rules: list[PolicyRule] = []
        for binding in self._bindings:
            if binding.namespace and binding.namespace != namespace:
                continue
            if binding.applies_to(user, binding.namespace):
                rules.extend(self._role_rules(binding, errors))
        return rules

    def authorize(self, user: User, attributes: RequestAttributes) -> tuple[bool, str]:
        """Decide a request (``Authorizer`` protocol).

        Returns
        -------
        tuple of (bool, str)
            Allowed, and the reason of a refusal (empty unless a binding names a missing
            role).

        """
        errors: list[str] = []
        for binding in self._bindings:
            if binding.namespace and binding.namespace != attributes.namespace:
                continue
            if not binding.applies_to(user, binding.namespace):
                continue
            if any(rule.allows(attributes) for rule in self._role_rules(binding, errors)):
                return True, ""
        if not errors:
            return False, ""
        aggregate = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        return False, f"RBAC: {aggregate}"


def load_objects(*paths: str | Path) -> list[dict[str, Any]]:
    """Load Kubernetes objects from YAML files and directories.

    Parameters
    ----------
    *paths : str or pathlib.Path
        A file (every YAML document in it), a directory with a ``kustomization.yaml``
        (rendered by ``kubectl kustomize`` or ``kustomize build``: see :func:`kustomize_tool`),
        or another directory (its ``*.yaml`` and ``*.yml`` files, sorted).

    Returns
    -------
    list of dict
        The objects, in order.

    Raises
    ------
    FileNotFoundError
        If a path does not exist, or a kustomization must be rendered outside a source
        checkout.
    Exception
        ``ReleaseError`` of ``deploy/release_manifests.py`` when a kustomization must be
        rendered and neither kubectl nor kustomize is found, or it fails.

    """
    objects: list[dict[str, Any]] = []
    for item in paths:
        path = Path(item)
        if path.is_dir() and any((path / f).is_file() for f in _KUSTOMIZATION_FILES):
            rendered, _ = _release_manifests().render_kustomization(path, kustomize_tool())
            objects.extend(o for o in rendered if isinstance(o, dict))
        elif path.is_dir():
            for file in sorted([*path.glob("*.yaml"), *path.glob("*.yml")]):
                objects.extend(_documents(file))
        elif path.is_file():
            objects.extend(_documents(path))
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    return objects


def kustomize_tool() -> str | None:
    """Return the kustomize or kubectl binary that renders kustomizations here, or None.

    ``$KUSTOMIZE``, else ``$KUBECTL`` (``make test`` sets it), else the ``kubectl`` beside
    this Python interpreter (``make kubectl`` puts one in ``.venv/bin``); ``None`` leaves the
    choice to ``kustomize_command`` of ``deploy/release_manifests.py`` (``kustomize``, then
    ``kubectl``, on ``PATH``).
    """
    chosen = os.environ.get("KUSTOMIZE") or os.environ.get("KUBECTL")
    if chosen:
        return chosen
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if os.access(beside, os.X_OK) else None


def _documents(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [d for d in yaml.safe_load_all(handle) if isinstance(d, dict)]


def _release_manifests() -> ModuleType:
    """Import ``deploy/release_manifests.py`` of the source checkout (a script, not a package)."""
    name = "_ipam_bridge_release_manifests"
    if name in sys.modules:
        return sys.modules[name]
    script = DEPLOY_DIR / "release_manifests.py"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None or not script.is_file():
        raise FileNotFoundError(f"{script} not found: rendering deploy/ needs a source checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def deploy_objects(deploy_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Return the objects of the kustomize install (``deploy/``), rendered by kustomize.

    Parameters
    ----------
    deploy_dir : str or pathlib.Path, optional
        The kustomization directory (default: ``deploy/`` of the source checkout), read as it
        is now.

    Raises
    ------
    FileNotFoundError
        Outside a source checkout.
    Exception
        ``ReleaseError`` of ``deploy/release_manifests.py`` when neither kubectl nor
        kustomize is found (:func:`kustomize_tool`), or it fails.

    """
    return load_objects(deploy_dir or DEPLOY_DIR)


def deploy_identity(
    deploy_dir: str | Path | None = None,
    *,
    objects: Sequence[Mapping[str, Any]] | None = None,
) -> Identity:
    """Return the operator's identity in a cluster installed from ``deploy/``.

    Parameters
    ----------
    deploy_dir : str or pathlib.Path, optional
        The kustomization to read (default: ``deploy/`` of the source checkout).
    objects : sequence of mapping, optional
        Already rendered objects to use instead of reading ``deploy_dir``.

    Returns
    -------
    Identity
        The ServiceAccount the install's Deployment runs as
        (``spec.template.spec.serviceAccountName`` in the Deployment's namespace), with an
        :class:`RBACAuthorizer` over every RBAC object of the install, and a fresh token.

    Raises
    ------
    ValueError
        If the install has not exactly one Deployment.
    FileNotFoundError
        Outside a source checkout.
    Exception
        ``ReleaseError`` of ``deploy/release_manifests.py`` when ``deploy_dir`` must be
        rendered and neither kubectl nor kustomize is found, or it fails.

    """
    rendered = list(objects) if objects is not None else deploy_objects(deploy_dir)
    deployments = [o for o in rendered if o.get("kind") == "Deployment"]
    if len(deployments) != 1:
        raise ValueError(f"expected one Deployment in the install, found {len(deployments)}")
    deployment = deployments[0]
    pod_spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    namespace = str((deployment.get("metadata") or {}).get("namespace") or "default")
    account = str(pod_spec.get("serviceAccountName") or "default")
    return Identity(service_account_user(namespace, account), RBACAuthorizer(rendered))
