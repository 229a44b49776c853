"""Resource declarations served by the in-memory Kubernetes API (built-ins and CRDs)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BUILTIN_RESOURCES",
    "KOPF_PEERING_RESOURCES",
    "ResourceDef",
    "resources_from_crd",
]

_ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclasses.dataclass(frozen=True)
class ResourceDef:
    """One resource (all its served versions) as the discovery API describes it.

    Parameters
    ----------
    group : str
        API group, ``""`` for the core group (``/api/v1``).
    versions : tuple of str
        Served versions; objects are shared by all of them (no conversion: the emulator only
        rewrites ``apiVersion``, like a CRD with ``conversion.strategy: None``).
    plural, singular, kind : str
        Names as in ``CustomResourceDefinition.spec.names``.
    namespaced : bool
        ``True`` for ``scope: Namespaced``.
    status_subresource : bool
        The resource declares ``subresources.status``: the main endpoint ignores status
        changes and ``/status`` ignores everything but status.
    short_names, categories : tuple of str
        Discovery extras (``kubectl get <shortName>``).
    storage_version : str or None
        The version discovery reports as preferred; the first served version when ``None``.
    custom : bool
        ``True`` for custom resources: ``metadata.generation`` is maintained and strategic merge
        patches are rejected with 415, as the API server does for CRDs.
    schemas : mapping of str to mapping
        ``openAPIV3Schema`` per served version (from the CRD); writes through a version with a
        schema are pruned by it (:func:`mock_kubernetes.schema.prune`). Versions without one,
        and built-in resources, are not pruned. Not part of equality or hashing.

    """

    group: str
    versions: tuple[str, ...]
    plural: str
    singular: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    storage_version: str | None = None
    custom: bool = True
    schemas: Mapping[str, Mapping[str, Any]] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @property
    def key(self) -> tuple[str, str]:
        """``(group, plural)``: the storage key shared by every served version."""
        return (self.group, self.plural)

    @property
    def preferred_version(self) -> str:
        """The storage version if served, else the first served version."""
        if self.storage_version in self.versions:
            return self.storage_version
        return self.versions[0]

    def schema(self, version: str | None) -> Mapping[str, Any] | None:
        """Return the ``openAPIV3Schema`` of ``version`` (preferred when ``None``), or ``None``."""
        return self.schemas.get(version or self.preferred_version)

    def api_version(self, version: str) -> str:
        """Return ``apiVersion`` for ``version`` (``v1`` or ``group/version``)."""
        return f"{self.group}/{version}" if self.group else version

    def discovery(self) -> list[dict[str, Any]]:
        """Return the ``APIResourceList.resources`` entries (main resource and subresources).

        Returns
        -------
        list of dict
            One entry per endpoint, as ``GET /apis/<group>/<version>`` lists them.

        """
        main = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(_ALL_VERBS),
            "shortNames": list(self.short_names),
            "categories": list(self.categories),
        }
        entries = [main]
        if self.status_subresource:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def crd_document(crd: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    """Return a CRD given as a dict, or read from a YAML file (its first CRD document).

    Raises
    ------
    ValueError
        If it is not a CustomResourceDefinition (or the file holds none).

    """
    if isinstance(crd, (str, Path)):
        docs = list(yaml.safe_load_all(Path(crd).read_text(encoding="utf-8")))
        found = [
            d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"
        ]
        if not found:
            raise ValueError(f"no CustomResourceDefinition in {crd}")
        crd = found[0]
    if crd.get("kind") != "CustomResourceDefinition":
        raise ValueError("not a CustomResourceDefinition")
    return crd


def crd_object(crd: Mapping[str, Any]) -> dict[str, Any]:
    """Return the CustomResourceDefinition object an API server serving ``crd`` shows.

    Its spec as given (``apiVersion`` ``apiextensions.k8s.io/v1``), and the status the
    apiextensions-apiserver writes once the names are accepted and the resource is served:
    conditions ``NamesAccepted`` and ``Established`` True, ``acceptedNames`` (the spec's names
    with ``singular`` and ``listKind`` filled in), ``storedVersions`` (the storage version)
    (https://kubernetes.io/docs/reference/kubernetes-api/extend-resources/custom-resource-definition-v1/).
    """
    body = copy.deepcopy(dict(crd))
    body["apiVersion"] = "apiextensions.k8s.io/v1"
    names = dict(body["spec"]["names"])
    names.setdefault("singular", str(names["kind"]).lower())
    names.setdefault("listKind", f"{names['kind']}List")
    storage = [v["name"] for v in body["spec"].get("versions", []) if v.get("storage")]
    body["status"] = {
        "acceptedNames": names,
        "conditions": [
            _condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            _condition(
                "Established", "InitialNamesAccepted", "the initial names have been accepted"
            ),
        ],
        "storedVersions": storage,
    }
    return body


def _condition(kind: str, reason: str, message: str) -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def resources_from_crd(crd: Mapping[str, Any] | str | Path) -> ResourceDef:
    """Build a :class:`ResourceDef` from an ``apiextensions.k8s.io/v1`` CustomResourceDefinition.

    Parameters
    ----------
    crd : mapping or str or pathlib.Path
        The CRD as a dict, or the path of a YAML file holding it (the first document whose
        ``kind`` is ``CustomResourceDefinition``).

    Returns
    -------
    ResourceDef
        Group, names, scope, every served version, whether any served version declares the
        status subresource, and each served version's ``schema.openAPIV3Schema`` (for
        pruning).

    Raises
    ------
    ValueError
        If the document is not a v1 CRD or serves no version.

    """
    crd = crd_document(crd)
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec.get("versions", []) if v.get("served", True)]
    if not versions:
        raise ValueError(f"CRD {crd.get('metadata', {}).get('name')} serves no version")
    storage = next((v["name"] for v in versions if v.get("storage")), None)
    status = any("status" in (v.get("subresources") or {}) for v in versions)
    return ResourceDef(
        group=spec["group"],
        versions=tuple(v["name"] for v in versions),
        plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()),
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        status_subresource=status,
        short_names=tuple(names.get("shortNames", ())),
        categories=tuple(names.get("categories", ())),
        storage_version=storage,
        custom=True,
        schemas={
            v["name"]: v["schema"]["openAPIV3Schema"]
            for v in versions
            if isinstance((v.get("schema") or {}).get("openAPIV3Schema"), Mapping)
        },
    )


def _builtin(
    plural: str, kind: str, *, group: str = "", namespaced: bool = True, status: bool = False
) -> ResourceDef:
    return ResourceDef(
        group=group,
        versions=("v1",),
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        status_subresource=status,
        custom=False,
    )


BUILTIN_RESOURCES: tuple[ResourceDef, ...] = (
    _builtin("namespaces", "Namespace", namespaced=False, status=True),
    _builtin("secrets", "Secret"),
    _builtin("configmaps", "ConfigMap"),
    _builtin("events", "Event"),
    _builtin("events", "Event", group="events.k8s.io"),
    # The CRDs an emulator serves are stored as objects (`crd_object`), read-only in effect:
    # creating one through the API does not serve its resource.
    _builtin(
        "customresourcedefinitions",
        "CustomResourceDefinition",
        group="apiextensions.k8s.io",
        namespaced=False,
    ),
    _builtin("leases", "Lease", group="coordination.k8s.io"),
)
"""Served by every emulator: namespaces, secrets, configmaps, core and events.k8s.io events,
the CRD collection (the CRDs served, as objects; kopf lists and watches it),
and coordination.k8s.io leases (leader election)."""


def _peering(plural: str, kind: str, namespaced: bool) -> ResourceDef:
    return ResourceDef(
        group="kopf.dev",
        versions=("v1",),
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
    )


KOPF_PEERING_RESOURCES: tuple[ResourceDef, ...] = (
    _peering("kopfpeerings", "KopfPeering", True),
    _peering("clusterkopfpeerings", "ClusterKopfPeering", False),
)
"""kopf's peering CRDs (``kopf.dev/v1``), needed only when kopf runs without ``--standalone``."""
