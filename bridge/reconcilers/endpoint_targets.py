"""Where a Cluster's control-plane endpoint goes besides the Cluster: pure edits of objects.

Without a ClusterClass nothing carries a Cluster's endpoint on: CAPI's Cluster controller
copies an InfraCluster's ``spec.controlPlaneEndpoint`` to the Cluster, never the other way
(``internal/controllers/cluster/cluster_controller_phases.go``, CAPI v1.14). So the address
also goes, each when it is empty (DESIGN section 11):

- `plan_infra_cluster`: the InfraCluster of ``spec.infrastructureRef`` (CAPI's InfraCluster
  contract, ``spec.controlPlaneEndpoint {host, port}``: CAPV's VSphereCluster,
  Metal3Cluster, OpenStackCluster...,
  https://cluster-api.sigs.k8s.io/developer/providers/contracts/infra-cluster);
- `plan_control_plane`: the KubeadmControlPlane of ``spec.controlPlaneRef`` (v1beta2 or
  v1beta1: the same paths): the kube-vip static Pod, a file of
  ``spec.kubeadmConfigSpec.files`` whose path ends in ``kube-vip.yaml``, env ``address``
  (older kube-vip manifests: ``vip_address``) of its container ``kube-vip``
  (https://kube-vip.io/docs/installation/static/); and, when the endpoint is a DNS name,
  ``clusterConfiguration.apiServer.certSANs`` (the name and the address; kubeadm puts the
  endpoint itself in the certificate, an address needs nothing there).

Each function takes an object as read (a dict) and returns a `TargetPlan`: one merge patch
guarded by the resourceVersion read, or nothing when the object already holds the address (a
second pass writes nothing). A value set to something else is never overwritten (a conflict),
and a KubeadmControlPlane with Machines (``status.replicas`` > 0) is never changed: a change
of ``spec.kubeadmConfigSpec`` rolls out every control-plane Machine.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "ADDRESS_ENV",
    "KUBE_VIP_CONTAINER",
    "KUBE_VIP_FILE",
    "TargetPlan",
    "control_plane_replicas",
    "plan_control_plane",
    "plan_infra_cluster",
    "set_kube_vip_address",
]

#: The kube-vip static Pod's file: the one of ``kubeadmConfigSpec.files`` whose path ends so.
KUBE_VIP_FILE = "kube-vip.yaml"
#: The container of that Pod that gets the address.
KUBE_VIP_CONTAINER = "kube-vip"
#: Env vars of the VIP in that container, in order of preference (``vip_address``: older).
ADDRESS_ENV = ("address", "vip_address")
#: ``spec.controlPlaneEndpoint.port`` when neither the InfraCluster nor the Cluster sets one.
DEFAULT_PORT = 6443


@dataclass(frozen=True)
class TargetPlan:
    """The one write an object needs for the endpoint, or why there is none.

    Attributes
    ----------
    patch:
        The merge patch (with ``metadata.resourceVersion`` read), or None.
    conflict:
        A value is set to something else: what and both values (a Warning); nothing is written.
    blocked:
        The object may not be changed now (a KubeadmControlPlane with Machines): why.
    changes:
        What the patch does, for the Event (``spec.controlPlaneEndpoint.host 10.0.0.5``...).
    """

    patch: dict[str, Any] | None = None
    conflict: str | None = None
    blocked: str | None = None
    changes: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        """True when the object holds the address already: nothing to write, nothing wrong."""
        return self.patch is None and self.conflict is None and self.blocked is None


def _guarded(body: Mapping[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    version = str((body.get("metadata") or {}).get("resourceVersion") or "")
    return {"metadata": {"resourceVersion": version}, "spec": spec}


def plan_infra_cluster(body: Mapping[str, Any], *, host: str, cluster_port: int) -> TargetPlan:
    """Return the patch giving an InfraCluster the endpoint ``host``; pure.

    Parameters
    ----------
    body:
        The InfraCluster as read (any kind with ``spec.controlPlaneEndpoint``).
    host:
        The endpoint's host (the address, or its DNS name).
    cluster_port:
        The Cluster's ``spec.controlPlaneEndpoint.port`` (0: none).

    Returns
    -------
    TargetPlan
        ``host`` and ``port`` (kept if set, else ``cluster_port``, else 6443) when its host
        is empty; nothing when it holds ``host``; a conflict when it holds another host.
    """
    endpoint = (body.get("spec") or {}).get("controlPlaneEndpoint") or {}
    current = str(endpoint.get("host") or "")
    if current == host:
        return TargetPlan()
    if current:
        return TargetPlan(
            conflict=f"spec.controlPlaneEndpoint.host is {current}, not {host}; it is left as it is"
        )
    port = int(endpoint.get("port") or 0) or cluster_port or DEFAULT_PORT
    patch = _guarded(body, {"controlPlaneEndpoint": {"host": host, "port": port}})
    return TargetPlan(patch, changes=(f"spec.controlPlaneEndpoint {host}:{port}",))


def set_kube_vip_address(content: str, address: str) -> tuple[str | None, str | None]:
    """Set the VIP in a kube-vip static Pod manifest (YAML text); pure.

    The env var ``address`` (else ``vip_address``; else ``address`` is added) of the
    container ``kube-vip`` gets ``address`` when its value is empty. The manifest is parsed
    and dumped again: formatting and comments may change, every other field parsed stays
    equal.

    Returns
    -------
    tuple
        ``(content, None)`` with the new text; ``(None, None)`` when nothing changes (the
        address is there, or the text is no Pod with a ``kube-vip`` container); ``(None,
        conflict)`` when the var holds another value.
    """
    try:
        pod = yaml.safe_load(content)
    except yaml.YAMLError:
        return None, None
    containers = (
        ((pod or {}).get("spec") or {}).get("containers") if isinstance(pod, dict) else None
    )
    container = next(
        (
            c
            for c in containers or []
            if isinstance(c, dict) and c.get("name") == KUBE_VIP_CONTAINER
        ),
        None,
    )
    if container is None:
        return None, None
    env = container.setdefault("env", [])
    if not isinstance(env, list):
        return None, None
    var = next(
        (e for name in ADDRESS_ENV for e in env if isinstance(e, dict) and e.get("name") == name),
        None,
    )
    if var is None:
        env.append({"name": ADDRESS_ENV[0], "value": address})
    else:
        current = str(var.get("value") or "")
        if current == address:
            return None, None
        if current:
            return None, f"env {var['name']} is {current}, not {address}"
        var["value"] = address
    return yaml.safe_dump(pod, sort_keys=False, default_flow_style=False), None


def control_plane_replicas(body: Mapping[str, Any]) -> int:
    """Return a KubeadmControlPlane's ``status.replicas`` (its Machines; absent: 0)."""
    return int((body.get("status") or {}).get("replicas") or 0)


def _kube_vip_files(files: list[dict[str, Any]], address: str) -> tuple[list[str], list[str]]:
    """Set the address in the kube-vip files of ``files`` (in place): (changes, conflicts)."""
    changes: list[str] = []
    conflicts: list[str] = []
    for item in files:
        path = str(item.get("path") or "")
        content = item.get("content")
        if not path.endswith(KUBE_VIP_FILE) or not isinstance(content, str):
            continue
        new, conflict = set_kube_vip_address(content, address)
        if conflict is not None:
            conflicts.append(f"{path}: {conflict}; it is left as it is")
        elif new is not None:
            item["content"] = new
            changes.append(f"kube-vip address {address} in {path}")
    return changes, conflicts


def plan_control_plane(
    body: Mapping[str, Any], *, address: str, dns_name: str | None = None
) -> TargetPlan:
    """Return the patch giving a KubeadmControlPlane the endpoint; pure.

    Parameters
    ----------
    body:
        The KubeadmControlPlane as read (v1beta2 or v1beta1).
    address:
        The VIP (an IP address): the kube-vip ``address``.
    dns_name:
        The endpoint's host when it is a DNS name: it and ``address`` are added to
        ``clusterConfiguration.apiServer.certSANs`` (others kept); None for an address.

    Returns
    -------
    TargetPlan
        One patch of ``spec.kubeadmConfigSpec`` (``files`` and ``certSANs`` replaced whole,
        each as read plus the address), nothing when it holds the address already, a
        conflict when kube-vip's address is another one, ``blocked`` when a change is
        needed and ``status.replicas`` is above 0 (a rollout).
    """
    config = copy.deepcopy(dict((body.get("spec") or {}).get("kubeadmConfigSpec") or {}))
    files = [f for f in config.get("files") or [] if isinstance(f, dict)]
    changes, conflicts = _kube_vip_files(files, address)
    if conflicts:
        return TargetPlan(conflict="; ".join(conflicts))
    spec: dict[str, Any] = {}
    if changes:
        spec["files"] = files
    if dns_name:
        api_server = (config.get("clusterConfiguration") or {}).get("apiServer") or {}
        sans = [str(s) for s in api_server.get("certSANs") or []]
        missing = [s for s in (dns_name, address) if s not in sans]
        if missing:
            spec["clusterConfiguration"] = {"apiServer": {"certSANs": sans + missing}}
            changes.append(f"certSANs {', '.join(missing)}")
    if not spec:
        return TargetPlan()
    replicas = control_plane_replicas(body)
    if replicas:
        return TargetPlan(
            blocked=f"it has {replicas} Machine(s) (status.replicas): {'; '.join(changes)} "
            "would roll them all out, so nothing is written"
        )
    return TargetPlan(_guarded(body, {"kubeadmConfigSpec": spec}), changes=tuple(changes))
