"""CAPV v1.16.1's cluster template and the CRDs of its objects, for the demo and the tests.

Files (byte for byte, provenance in ``README.md`` beside them): `TEMPLATE`, what
``clusterctl generate cluster`` renders for CAPV without a ClusterClass; `CRDS`, the
KubeadmControlPlane CRD of CAPI v1.14.0 and CAPV's VSphereCluster CRD, to load into the
in-memory API server (``Sandbox(capi_crds=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CRDS", "TEMPLATE", "generate_cluster"]

_HERE = Path(__file__).resolve().parent
#: CAPV v1.16.1's ``templates/cluster-template.yaml``.
TEMPLATE = _HERE / "cluster-template.yaml"
#: The KubeadmControlPlane (CAPI v1.14.0) and VSphereCluster (CAPV v1.16.1) CRDs.
CRDS = (
    _HERE / "controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
    _HERE / "infrastructure.cluster.x-k8s.io_vsphereclusters.yaml",
)
_VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:=([^}]*))?\}")
_KINDS = ("Cluster", "VSphereCluster", "KubeadmControlPlane")


def _prune(value: Any) -> Any:
    """Drop null fields, as the API server does when it stores an object."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def generate_cluster(
    values: Mapping[str, str], *, kinds: tuple[str, ...] = _KINDS
) -> list[dict[str, Any]]:
    """Return the template's objects as ``clusterctl generate cluster`` renders them.

    Parameters
    ----------
    values:
        The variables (``CLUSTER_NAME``, ``NAMESPACE``...); one not given is empty, as
        clusterctl leaves a variable it was told to skip, unless the template gives a
        default (``${VAR:=default}``). ``CONTROL_PLANE_ENDPOINT_IP`` left out is the VIP
        left empty.
    kinds:
        The kinds to return, in the template's order (default: the Cluster, the
        VSphereCluster and the KubeadmControlPlane).

    Returns
    -------
    list of dict
        The objects with null fields dropped (what the API server stores).
    """

    def value(match: re.Match[str]) -> str:
        default = match.group(3)
        return values.get(match.group(1), default if default is not None else "")

    text = _VARIABLE.sub(value, TEMPLATE.read_text(encoding="utf-8"))
    return [
        _prune(doc)
        for doc in yaml.safe_load_all(text)
        if isinstance(doc, dict) and doc.get("kind") in kinds
    ]
