"""Render the clusterctl release artifacts of ipam-bridge and keep the Helm chart's CRDs in sync.

Run by ``make release-manifests`` (``python deploy/release_manifests.py``). It writes

- ``out/metadata.yaml``: the clusterctl ``Metadata`` (release series and CAPI contract);
- ``out/ipam-components.yaml``: the kustomize install of ``deploy/`` rendered to one file,
  with clusterctl ``${VAR:=default}`` variables for the image and the settings;
- ``out/ipam-bridge-<version>.tgz``: the Helm chart packaged (``helm package``, chart version
  and appVersion the release's), when helm is there (``--helm PATH``, ``$HELM``, ``helm`` on
  ``PATH``); the release workflow pushes it as an OCI chart;
- ``deploy/helm/ipam-bridge/crds/*.yaml``, ``files/clusterrole-rules.yaml`` and
  ``files/leader-election-rules.yaml``: the chart's CRDs and RBAC rules, copied from the
  install so that the chart cannot drift from it.

Rules followed (CAPI book, ``docs/book/src/developer/providers/contracts/clusterctl.md``):
exactly one Namespace, every object labelled ``cluster.x-k8s.io/provider``, the controller
container named ``manager``, variables in the drone/envsubst syntax clusterctl uses.

The kustomization is rendered by kustomize itself, as the other CAPI providers do:
``kubectl kustomize`` (``make release-manifests`` passes the kubectl that
``deploy/fetch_tools.py`` installs from npm) or ``kustomize build`` (``--kustomize PATH``;
default ``$KUSTOMIZE``, ``$KUBECTL``, else ``kustomize`` or ``kubectl`` on ``PATH``).
:func:`render_kustomization` also renders ``deploy/`` for the in-memory Kubernetes API of the
tests (``sandbox/mock_kubernetes/rbac.py``: the operator's RBAC). Only the standard library and
PyYAML are used.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CLUSTERCTL_VARIABLES",
    "DEFAULT_IMAGE_REPOSITORY",
    "FORMER_VARIABLES",
    "PROVIDER_LABEL",
    "ReleaseError",
    "artifact_names",
    "chart_files",
    "dump_documents",
    "helm_command",
    "kustomize_command",
    "main",
    "metadata_document",
    "package_chart",
    "project_version",
    "render_components",
    "render_kustomization",
    "sync_chart",
]

Obj = dict[str, Any]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DIR = REPO_ROOT / "deploy"
CHART_DIR = DEPLOY_DIR / "helm" / "ipam-bridge"

#: The label clusterctl requires on every object of a provider (and uses to find them).
PROVIDER_LABEL = ("cluster.x-k8s.io/provider", "ipam-bridge")
#: Image repository of the manager; the tag is the release version.
DEFAULT_IMAGE_REPOSITORY = "ghcr.io/ipam-bridge/ipam-bridge"
#: CAPI contract the release series implements (metadata.yaml).
CONTRACT = "v1beta2"
#: Environment variables of the manager container that become clusterctl variables, as
#: ``env name -> clusterctl variable`` (the same name: one name per setting). The default of
#: each is the value in the Deployment.
CLUSTERCTL_VARIABLES = {
    "IPAM_BRIDGE_NAMESPACE": "IPAM_BRIDGE_NAMESPACE",
    "IPAM_BRIDGE_WORKERS": "IPAM_BRIDGE_WORKERS",
    "IPAM_BRIDGE_LOG_LEVEL": "IPAM_BRIDGE_LOG_LEVEL",
    "IPAM_BRIDGE_LOG_FORMAT": "IPAM_BRIDGE_LOG_FORMAT",
}
#: Former clusterctl variables, still read: ``env name -> former variable``. The env's value
#: falls back to the former variable (``${NEW:=${OLD:=<default>}}``, drone/envsubst's nested
#: default), and the former variable also reaches the manager under its own name, which the
#: operator reads as a deprecated name and warns about at start-up
#: (``bridge.settings.DEPRECATED_NAMES``).
FORMER_VARIABLES = {
    "IPAM_BRIDGE_NAMESPACE": "IPAM_BRIDGE_NAMESPACE_SCOPE",
}
#: clusterctl variable of the manager image.
IMAGE_VARIABLE = "IPAM_BRIDGE_IMAGE"

_VARIABLE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


class ReleaseError(Exception):
    """The release artifacts cannot be built (a clusterctl rule is broken, a tool failed)."""


def project_version(pyproject: Path = REPO_ROOT / "pyproject.toml") -> str:
    """Return the release version, ``v`` + ``[project].version`` of ``pyproject.toml``.

    Parameters
    ----------
    pyproject : pathlib.Path
        The ``pyproject.toml`` to read.

    Returns
    -------
    str
        For example ``"v0.1.0"``.

    Raises
    ------
    ReleaseError
        If the file has no ``[project].version``.
    """
    with pyproject.open("rb") as handle:
        version = tomllib.load(handle).get("project", {}).get("version")
    if not isinstance(version, str):
        raise ReleaseError(f"{pyproject} has no [project].version")
    return f"v{version}"


def _object_id(obj: Obj) -> tuple[str, str, str, str]:
    """Return the identity kustomize uses: ``(apiVersion group, kind, namespace, name)``."""
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    meta = obj.get("metadata") or {}
    return group, str(obj["kind"]), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def kustomize_command(tool: str | os.PathLike[str] | None = None) -> list[str]:
    """Return the command that renders a kustomization directory (given as the last argument).

    Parameters
    ----------
    tool : str or path-like, optional
        A ``kustomize`` binary (run as ``kustomize build``) or a ``kubectl`` binary (run as
        ``kubectl kustomize``), by path or name. Default: ``$KUSTOMIZE``, else ``$KUBECTL``,
        else ``kustomize`` on ``PATH``, else ``kubectl`` on ``PATH``.

    Returns
    -------
    list of str
        For example ``["/repo/.venv/bin/kubectl", "kustomize"]``.

    Raises
    ------
    ReleaseError
        If no tool is given or found, or the one given is not executable.
    """
    chosen = (
        str(tool)
        if tool
        else os.environ.get("KUSTOMIZE")
        or os.environ.get("KUBECTL")
        or shutil.which("kustomize")
        or shutil.which("kubectl")
    )
    if not chosen:
        raise ReleaseError(
            "neither kustomize nor kubectl found: run `make kubectl` (deploy/fetch_tools.py) "
            "or pass --kustomize PATH"
        )
    path = shutil.which(chosen)
    if path is None:
        raise ReleaseError(f"{chosen}: not an executable kustomize or kubectl")
    return [path, "build"] if Path(path).name.startswith("kustomize") else [path, "kustomize"]


def _kustomize_version(command: Sequence[str]) -> str:
    """Return the kustomize version of ``command`` (``"v5.6.0"``), or ``""`` when unknown."""
    tool, subcommand = command[0], command[1]
    argv = (
        [tool, "version"] if subcommand == "build" else [tool, "version", "--client", "-o", "json"]
    )
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    if subcommand == "build":
        return result.stdout.strip()
    try:
        return str(json.loads(result.stdout).get("kustomizeVersion") or "")
    except ValueError:
        return ""


def render_kustomization(
    directory: Path, tool: str | os.PathLike[str] | None = None
) -> tuple[list[Obj], str]:
    """Render a kustomization with kustomize (``kustomize build`` or ``kubectl kustomize``).

    Parameters
    ----------
    directory : pathlib.Path
        Directory holding ``kustomization.yaml``.
    tool : str or path-like, optional
        The kustomize or kubectl binary; see :func:`kustomize_command`.

    Returns
    -------
    tuple of (list of dict, str)
        The objects, in kustomize's output order, and what rendered them, e.g.
        ``"kubectl kustomize, kustomize v5.6.0"``.

    Raises
    ------
    ReleaseError
        If no tool is found or it exits non-zero.
    """
    command = kustomize_command(tool)
    result = subprocess.run(  # a fixed argv, no shell
        [*command, str(directory)], capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(command)} {directory} failed: {result.stderr.strip()}")
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    used = f"{Path(command[0]).name} {command[1]}"
    version = _kustomize_version(command)
    return objects, f"{used}, kustomize {version}" if version else used


def _manager_container(objects: Iterable[Obj]) -> Obj:
    """Return the container ``manager`` of the install's only Deployment."""
    deployments = [obj for obj in objects if obj["kind"] == "Deployment"]
    if len(deployments) != 1:
        raise ReleaseError(f"expected exactly one Deployment, found {len(deployments)}")
    containers: list[Obj] = deployments[0]["spec"]["template"]["spec"].get("containers") or []
    managers = [c for c in containers if c.get("name") == "manager"]
    if len(managers) != 1:
        raise ReleaseError("the Deployment must have one container named 'manager' (clusterctl)")
    return managers[0]


def render_components(
    objects: Sequence[Obj], *, version: str, image_repository: str = DEFAULT_IMAGE_REPOSITORY
) -> list[Obj]:
    """Turn the rendered install into the clusterctl components (with variables).

    The manager image becomes ``${IPAM_BRIDGE_IMAGE:=<repository>:<version>}`` and each env
    variable of :data:`CLUSTERCTL_VARIABLES` becomes ``${<variable>:=<value in deploy/>}``;
    one with a former variable (:data:`FORMER_VARIABLES`) falls back to it
    (``${IPAM_BRIDGE_NAMESPACE:=${IPAM_BRIDGE_NAMESPACE_SCOPE:=}}``: empty = all namespaces)
    and the former one is passed on under its own name (the operator warns about it). Then
    the clusterctl rules are checked.

    Parameters
    ----------
    objects : sequence of dict
        The kustomize install (not changed).
    version : str
        Release version, e.g. ``"v0.1.0"``: the default image tag.
    image_repository : str
        Image repository of the manager.

    Returns
    -------
    list of dict
        The components, in the order given.

    Raises
    ------
    ReleaseError
        If a rule of clusterctl's contract is broken: not exactly one Namespace, an object
        without the provider label, a namespaced object outside the Namespace, no Deployment
        with a container ``manager``, or a variable env entry missing from the Deployment.
    """
    components = copy.deepcopy(list(objects))
    manager = _manager_container(components)
    manager["image"] = f"${{{IMAGE_VARIABLE}:={image_repository}:{version}}}"
    env = {entry["name"]: entry for entry in manager.get("env") or []}
    for env_name, variable in CLUSTERCTL_VARIABLES.items():
        if env_name not in env or "value" not in env[env_name]:
            raise ReleaseError(f"the manager container has no env {env_name} with a value")
        default = env[env_name]["value"]
        former = FORMER_VARIABLES.get(env_name)
        if former is not None:
            at = manager["env"].index(env[env_name]) + 1
            manager["env"].insert(at, {"name": former, "value": f"${{{former}:=}}"})
            default = f"${{{former}:={default}}}"
        env[env_name]["value"] = f"${{{variable}:={default}}}"

    namespaces = [obj for obj in components if obj["kind"] == "Namespace"]
    if len(namespaces) != 1:
        raise ReleaseError(f"clusterctl needs exactly one Namespace, found {len(namespaces)}")
    namespace = namespaces[0]["metadata"]["name"]
    key, value = PROVIDER_LABEL
    for obj in components:
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(key) != value:
            raise ReleaseError(f"{_object_id(obj)} lacks the label {key}={value}")
        if meta.get("namespace") not in (None, namespace):
            raise ReleaseError(f"{_object_id(obj)} is outside the namespace {namespace}")
    return components


def metadata_document(version: str, contract: str = CONTRACT) -> Obj:
    """Return clusterctl's ``metadata.yaml`` for ``version``.

    Parameters
    ----------
    version : str
        ``vMAJOR.MINOR.PATCH`` (a pre-release suffix is allowed).
    contract : str
        The CAPI contract of the series (``v1beta2`` for CAPI >= 1.11).

    Returns
    -------
    dict
        ``apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3``, ``kind: Metadata`` and one
        ``releaseSeries`` entry ``{major, minor, contract}`` (clusterctl >= 1.11 refuses a
        release whose series is missing).

    Raises
    ------
    ReleaseError
        If ``version`` is not semantic.
    """
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", version)
    if match is None:
        raise ReleaseError(f"version {version!r} is not vMAJOR.MINOR.PATCH")
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [
            {"major": int(match.group(1)), "minor": int(match.group(2)), "contract": contract}
        ],
    }


class _Dumper(yaml.SafeDumper):
    """YAML dumper that double-quotes strings holding a clusterctl variable.

    Without quotes, ``value: ${IPAM_BRIDGE_WORKERS:=10}`` would become the integer ``10``
    after clusterctl's substitution, which a Deployment env ``value`` does not accept.
    """


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = '"' if "${" in data else ("|" if "\n" in data else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_documents(objects: Iterable[Obj], header: str = "") -> str:
    """Serialise objects as one multi-document YAML stream.

    Parameters
    ----------
    objects : iterable of dict
        The objects, written in this order, keys sorted (as kustomize writes them, so the
        output does not depend on the kustomize version's key order).
    header : str
        Comment lines written first (each line is prefixed with ``# ``).

    Returns
    -------
    str
        The YAML text; strings containing ``${`` are double-quoted (see :class:`_Dumper`).
    """
    lines = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    body = yaml.dump_all(
        list(objects), Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=1000
    )
    return lines + body


def chart_files(objects: Iterable[Obj]) -> dict[str, str]:
    """Return the generated files of the Helm chart: ``{path relative to the chart: text}``.

    - ``crds/<crd name>.yaml``: every CustomResourceDefinition of the install, as it is (with
      the provider label), so that the chart installs the same CRDs as
      ``kubectl apply -k deploy/`` (Helm installs ``crds/`` before the templates and never
      upgrades or deletes them);
    - ``files/clusterrole-rules.yaml``: the rules of the install's ClusterRole, which
      ``templates/clusterrole.yaml`` includes, so that the chart's RBAC cannot drift from
      ``deploy/manager/rbac.yaml``;
    - ``files/leader-election-rules.yaml``: the rules of the install's Role (the leader
      election Lease in the manager's namespace), which ``templates/leader-election-rbac.yaml``
      includes (from ``deploy/manager/leader-election-rbac.yaml``).

    Parameters
    ----------
    objects : iterable of dict
        The kustomize install.

    Returns
    -------
    dict of str to str
        Relative path (POSIX) to content.

    Raises
    ------
    ReleaseError
        If the install has not exactly one ClusterRole and one Role.
    """
    objects = list(objects)
    header = "Generated by deploy/release_manifests.py from deploy/ (make release-manifests)."
    files = {
        f"crds/{obj['metadata']['name']}.yaml": dump_documents([obj], header=header)
        for obj in objects
        if obj["kind"] == "CustomResourceDefinition"
    }
    roles = [obj for obj in objects if obj["kind"] == "ClusterRole"]
    if len(roles) != 1:
        raise ReleaseError(f"expected exactly one ClusterRole, found {len(roles)}")
    files["files/clusterrole-rules.yaml"] = dump_documents(
        [roles[0]["rules"]],
        header=header + "\nThe rules of deploy/manager/rbac.yaml; see the comments there.",
    )
    namespaced_roles = [obj for obj in objects if obj["kind"] == "Role"]
    if len(namespaced_roles) != 1:
        raise ReleaseError(f"expected exactly one Role, found {len(namespaced_roles)}")
    files["files/leader-election-rules.yaml"] = dump_documents(
        [namespaced_roles[0]["rules"]],
        header=header
        + "\nThe rules of deploy/manager/leader-election-rbac.yaml; see the comments there.",
    )
    return files


def sync_chart(objects: Iterable[Obj], chart_dir: Path = CHART_DIR, *, check: bool) -> list[str]:
    """Write (or, with ``check``, compare) the generated files of the Helm chart.

    Parameters
    ----------
    objects : iterable of dict
        The kustomize install.
    chart_dir : pathlib.Path
        The chart directory (holding ``Chart.yaml``).
    check : bool
        Only compare: write nothing.

    Returns
    -------
    list of str
        Paths (relative to the chart) that differ: missing, changed, or stale files in
        ``crds/``; empty when in sync. Without ``check`` they have been written (stale
        ``crds/`` files removed).

    Raises
    ------
    ReleaseError
        As :func:`chart_files`.
    """
    wanted = chart_files(objects)
    crds_dir = chart_dir / "crds"
    present = (
        {f"crds/{path.name}" for path in crds_dir.glob("*.yaml")} if crds_dir.is_dir() else set()
    )
    stale = present - set(wanted)
    differing = sorted(
        {
            name
            for name, text in wanted.items()
            if not (chart_dir / name).is_file()
            or (chart_dir / name).read_text(encoding="utf-8") != text
        }
        | stale
    )
    if not check:
        for name in stale:
            (chart_dir / name).unlink()
        for name, text in wanted.items():
            (chart_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (chart_dir / name).write_text(text, encoding="utf-8")
    return differing


def chart_version(version: str) -> str:
    """Return the chart version of a release: ``v0.1.0`` -> ``0.1.0`` (SemVer 2, as Helm wants)."""
    return version[1:] if version.startswith("v") else version


def artifact_names(version: str) -> list[str]:
    """Return the files ``make release-manifests`` writes into ``out/`` for ``version``.

    ``metadata.yaml`` and ``ipam-components.yaml`` (clusterctl), and the packaged chart
    ``ipam-bridge-<chart version>.tgz`` (when helm is there): what a release publishes.
    """
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text(encoding="utf-8"))["name"]
    return ["metadata.yaml", "ipam-components.yaml", f"{chart}-{chart_version(version)}.tgz"]


def helm_command(tool: str | os.PathLike[str] | None = None) -> str | None:
    """Return the helm binary to package the chart with, or None when there is none.

    ``tool`` (a path or name), else ``$HELM``, else ``helm`` on ``PATH``.
    """
    chosen = str(tool) if tool else os.environ.get("HELM") or "helm"
    return shutil.which(chosen)


def package_chart(helm: str, out: Path, version: str, chart_dir: Path = CHART_DIR) -> Path:
    """Package the chart into ``out`` with ``helm package``; return the ``.tgz`` written.

    The chart's version and appVersion become the release's (``v0.1.0`` -> ``0.1.0``), so
    the packaged chart installs the release's image (``image.tag`` defaults to
    ``v<appVersion>``). ``helm lint`` runs first.

    Raises
    ------
    ReleaseError
        When ``helm lint`` or ``helm package`` fails (its message is in the error).
    """
    semver = chart_version(version)
    versions = ["--version", semver, "--app-version", semver]
    for argv in (
        [helm, "lint", str(chart_dir)],
        [helm, "package", str(chart_dir), "--destination", str(out), *versions],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise ReleaseError(f"{' '.join(argv[:2])} failed: {result.stderr.strip()}")
    return out / artifact_names(version)[2]


def main(argv: Sequence[str] | None = None) -> int:
    """Build the release artifacts; the command-line entry point.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default ``sys.argv[1:]``); see ``--help``.

    Returns
    -------
    int
        0 on success; 1 with ``--check-chart`` when the chart's generated files are out of
        date.

    Raises
    ------
    ReleaseError
        If the install cannot be rendered or breaks a clusterctl rule.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out", help="output directory")
    parser.add_argument("--version", default=None, help="release version (default: pyproject)")
    parser.add_argument("--image-repository", default=DEFAULT_IMAGE_REPOSITORY)
    parser.add_argument(
        "--kustomize",
        default=None,
        metavar="PATH",
        help="kustomize or kubectl binary (default: $KUSTOMIZE, $KUBECTL, else on PATH)",
    )
    parser.add_argument(
        "--helm",
        default=None,
        metavar="PATH",
        help="helm binary that packages the chart (default: $HELM, else on PATH; none: skipped)",
    )
    parser.add_argument(
        "--check-chart", action="store_true", help="only check the chart's generated files"
    )
    parser.add_argument(
        "--skip-chart", action="store_true", help="do not update the chart's generated files"
    )
    args = parser.parse_args(argv)
    version = args.version or project_version()

    objects, used = render_kustomization(DEPLOY_DIR, args.kustomize)
    if args.check_chart:
        differing = sync_chart(objects, check=True)
        for name in differing:
            print(f"out of date: {CHART_DIR / name} (run make release-manifests)")
        return 1 if differing else 0

    components = render_components(objects, version=version, image_repository=args.image_repository)
    args.out.mkdir(parents=True, exist_ok=True)
    header = (
        f"ipam-bridge {version}: clusterctl components (IPAMProvider), rendered from deploy/ "
        f"by deploy/release_manifests.py ({used}).\n"
        f"Variables: {IMAGE_VARIABLE}, "
        + ", ".join(CLUSTERCTL_VARIABLES.values())
        + "; deprecated: "
        + ", ".join(FORMER_VARIABLES.values())
    )
    (args.out / "ipam-components.yaml").write_text(
        dump_documents(components, header=header), encoding="utf-8"
    )
    (args.out / "metadata.yaml").write_text(
        dump_documents([metadata_document(version)]), encoding="utf-8"
    )
    changed = [] if args.skip_chart else sync_chart(objects, check=False)
    print(f"wrote {args.out / 'ipam-components.yaml'} and {args.out / 'metadata.yaml'} ({used})")
    for name in changed:
        print(f"updated {CHART_DIR / name}")
    helm = helm_command(args.helm)
    if helm is None:
        print("helm not found: the chart is not packaged (make helm; or --helm PATH)")
    else:
        print(f"wrote {package_chart(helm, args.out, version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
