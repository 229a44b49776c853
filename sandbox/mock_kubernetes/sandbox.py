"""A whole ipam-bridge installation on one machine: emulated Kubernetes, a mock IPAM, the operator.

Used by ``ipam-bridge demo`` and by the integration tests: the in-memory Kubernetes API
(`EmulatedKubernetes`) serves our pool CRDs, CAPI's IPAddressClaim/IPAddress CRDs and a CAPI
Cluster CRD; a mock phpIPAM (or Infoblox WAPI) answers on 127.0.0.1; the real kopf operator
(``bridge.handlers``) runs in this process, in a thread of its own (``kopf.operator``).
"""

from __future__ import annotations

import asyncio
import copy
import importlib.resources
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from bridge.capi import GROUP
from mock_kubernetes.auth import Identity
from mock_kubernetes.objects import ObjectHelpers, wait_for
from mock_kubernetes.server import EmulatedKubernetes

__all__ = ["CLUSTER_CRD", "Sandbox", "crd_documents", "repo_crds", "wait_for"]

#: The root of a source checkout (``sandbox/mock_kubernetes/`` -> ``.``), where ``crds/`` lives
#: (``make demo`` uses an editable install).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: A minimal CAPI ``Cluster`` CRD: enough for pause (``spec.paused``, annotation) and lookups.
CLUSTER_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusters.cluster.x-k8s.io"},
    "spec": {
        "group": "cluster.x-k8s.io",
        "scope": "Namespaced",
        "names": {
            "kind": "Cluster",
            "plural": "clusters",
            "singular": "cluster",
            "listKind": "ClusterList",
        },
        "versions": [
            {
                "name": version,
                "served": True,
                "storage": version == "v1beta2",
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
            for version in ("v1beta2", "v1beta1")
        ],
    },
}

#: Settings that make the operator quick to react in a sandbox (env ``IPAM_BRIDGE_*``).
FAST_SETTINGS: Mapping[str, str] = {
    "IPAM_BRIDGE_NAMESPACE": "",  # the sandbox's operator serves all namespaces
    "IPAM_BRIDGE_STANDALONE": "true",
    "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "1",
    "IPAM_BRIDGE_REQUEUE_SECONDS": "1",
    "IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "2",
    "IPAM_BRIDGE_REQUEUE_EXHAUSTED_SECONDS": "1",
    "IPAM_BRIDGE_RETRY_ATTEMPTS": "3",
    "IPAM_BRIDGE_RETRY_MAX_DELAY_SECONDS": "0.2",
    "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "5",
    "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "2",
    "IPAM_BRIDGE_METRICS_PORT": "0",
    "IPAM_BRIDGE_METRICS_ADDRESS": "127.0.0.1",
    "IPAM_BRIDGE_HEALTH_PORT": "0",
}


def repo_crds() -> list[Path]:
    """Return the CRD files: ours (``crds/``) and CAPI's (``crds/capi/``).

    They are package data of ``bridge`` (``bridge/crds`` links to the checkout's ``crds/``;
    a wheel carries a copy), read with ``importlib.resources``, so an editable install, a
    source checkout and an installed wheel all find them.

    Raises
    ------
    FileNotFoundError
        When the package carries no CRD files (a build without ``crds/``).
    """
    root = Path(str(importlib.resources.files("bridge") / "crds"))
    ours = sorted(root.glob("*.yaml"))
    capi = sorted((root / "capi").glob("*.yaml"))
    files = [p for p in ours + capi if p.name != "kustomization.yaml"]
    if not capi or not ours:
        raise FileNotFoundError(f"CRD files not found under {root}")
    return files


def _serve_only(crd: dict[str, Any], versions: tuple[str, ...]) -> None:
    """Keep only ``versions`` of a CRD (in place), served, the first one the storage version."""
    kept = [v for v in crd["spec"]["versions"] if v["name"] in versions]
    kept.sort(key=lambda v: versions.index(v["name"]))
    for i, version in enumerate(kept):
        version["served"] = True
        version["storage"] = i == 0
    crd["spec"]["versions"] = kept


def crd_documents(
    capi_versions: tuple[str, ...] = ("v1beta2", "v1beta1"),
    capi_crds: Sequence[str | Path] = (),
) -> list[dict[str, Any]]:
    """Return the CRDs to serve, with CAPI's IPAM CRDs limited to ``capi_versions``.

    ``("v1beta1",)`` emulates a CAPI 1.6-1.10 management cluster (no v1beta2); the first
    version listed is the storage (and preferred) version. ``capi_crds`` names CRD files of a
    CAPI release (e.g. ``tests/data/capi-crds/v1.8.12/ipam.cluster.x-k8s.io_*.yaml``) to
    serve instead of the copies in ``crds/capi/``: their schemas, as that release serves them
    (the emulator prunes what they do not know). A ``Cluster`` CRD among them (e.g.
    ``crds/capi/cluster.x-k8s.io_clusters.yaml``, CAPI v1.14's) replaces the minimal
    `CLUSTER_CRD`, which is served otherwise.
    """
    release = [
        doc
        for path in capi_crds
        for doc in yaml.safe_load_all(Path(path).read_text(encoding="utf-8"))
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    replaced = {doc["spec"]["names"]["kind"] for doc in release}
    documents: list[dict[str, Any]] = []
    for path in repo_crds():
        for doc in [*yaml.safe_load_all(path.read_text(encoding="utf-8"))]:
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            doc = copy.deepcopy(doc)
            if doc["spec"]["group"] == GROUP and doc["spec"]["names"]["kind"] in replaced:
                continue
            if doc["spec"]["group"] == CLUSTER_CRD["spec"]["group"]:
                continue  # CAPI's Cluster CRD (crds/capi/): served only when asked, below
            if doc["spec"]["group"] == GROUP and doc["spec"]["names"]["kind"] in (
                "IPAddressClaim",
                "IPAddress",
            ):
                _serve_only(doc, capi_versions)
            documents.append(doc)
    for doc in release:
        doc = copy.deepcopy(doc)
        _serve_only(doc, capi_versions)
        documents.append(doc)
    if "Cluster" not in replaced:
        documents.append(copy.deepcopy(CLUSTER_CRD))
    return documents


def _identity(identity: str | Identity) -> Identity | None:
    """Resolve the ``identity`` argument of `Sandbox`: None for the admin."""
    if isinstance(identity, Identity):
        return identity
    if identity == "admin":
        return None
    if identity == "operator":
        from mock_kubernetes.rbac import deploy_identity

        return deploy_identity()
    raise ValueError(f"identity must be 'admin', 'operator' or an Identity, not {identity!r}")


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class Sandbox(ObjectHelpers):
    """Emulated Kubernetes plus the real operator, on 127.0.0.1, as a context manager.

    The pool, claim and waiting helpers come from `ObjectHelpers`.

    The IPAM is the caller's: start a mock (`mock_phpipam.server.MockPhpipamServer` or the
    WAPI mock) and point pools at it. The operator runs in this process; `stop_operator` and
    `start_operator` restart it (state lives only in Kubernetes and the IPAM, as in a pod).

    Parameters
    ----------
    workdir:
        Where the kubeconfig is written (default: a new temporary directory).
    capi_versions:
        The served CAPI IPAM versions, preferred first (see `crd_documents`).
    settings:
        Extra ``IPAM_BRIDGE_*`` variables on top of `FAST_SETTINGS`.
    start_operator:
        Start the operator on entry (False: call `start_operator` later).
    cluster_crd:
        Serve CAPI's ``Cluster`` CRD (False: a cluster with only CAPI's IPAM CRDs).
    identity:
        Who the operator runs as: ``"admin"`` (unrestricted, the default), ``"operator"``
        (the ServiceAccount of ``deploy/`` with the RBAC of ``deploy/``, read when the
        sandbox is made: `mock_kubernetes.rbac.deploy_identity`), or any `Identity`. With a
        restricted identity the operator's kubeconfig carries its bearer token, requests
        without a token are refused (401) so that nothing runs as the admin by accident,
        the identity's namespace is created, and ``kube.access_log`` records what it did.
    capi_crds:
        CRD files of a CAPI release to serve instead of ``crds/capi/`` (see `crd_documents`).
        The sandbox's own helpers (``create``, ``claim``, ``kube.patch``...) stay admin.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        capi_versions: tuple[str, ...] = ("v1beta2", "v1beta1"),
        settings: Mapping[str, str] | None = None,
        start_operator: bool = True,
        cluster_crd: bool = True,
        identity: str | Identity = "admin",
        capi_crds: Sequence[str | Path] = (),
    ) -> None:
        restricted = _identity(identity)
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ipam-bridge-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.capi_versions = capi_versions
        self.kube = EmulatedKubernetes(
            crds=[
                doc
                for doc in crd_documents(capi_versions, capi_crds)
                if cluster_crd or doc["spec"]["group"] != CLUSTER_CRD["spec"]["group"]
            ],
            identities=[restricted] if restricted else [],
            require_token=restricted is not None,
        )
        self.identity: Identity = restricted or self.kube.admin
        """The operator's identity (its token is in ``workdir/kubeconfig``)."""
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self._autostart = start_operator
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._env: Any = None

    @property
    def version(self) -> str:
        """The preferred CAPI IPAM version served (claims and addresses are written in it)."""
        return self.capi_versions[0]

    def __enter__(self) -> Self:
        self.kube.__enter__()
        kubeconfig = self.kube.write_kubeconfig(self.workdir / "kubeconfig", self.identity)
        parts = self.identity.name.split(":")
        if parts[:2] == ["system", "serviceaccount"] and len(parts) == 4:
            self.namespace(parts[2])  # where the operator's own objects (events, leases) go
        self._env = _environment({**self.settings, "KUBECONFIG": str(kubeconfig)})
        self._env.__enter__()
        if self._autostart:
            self.start_operator()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop_operator()
        finally:
            if self._env is not None:
                self._env.__exit__(None, None, None)
            self.kube.close()
            if self._tmp is not None:
                self._tmp.cleanup()

    # -- the operator ---------------------------------------------------------------------

    def start_operator(self, timeout: float = 30.0) -> None:
        """Start the real operator (``bridge.handlers``, standalone, all namespaces) in a thread.

        Returns once kopf reports it is ready (start-up handlers done, watches starting).

        Raises
        ------
        RuntimeError
            When it is already running, or did not get ready within ``timeout`` seconds.
        """
        if self._thread is not None:
            raise RuntimeError("the operator is already running")
        self._stop = threading.Event()
        ready = threading.Event()
        self._error = None
        self._thread = threading.Thread(
            target=self._run_operator,
            args=(self._stop, ready),
            name="ipam-bridge-operator",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(timeout):
            self.stop_operator()
            raise RuntimeError(f"the operator did not get ready within {timeout}s")

    def _run_operator(self, stop: threading.Event, ready: threading.Event) -> None:
        import kopf

        import bridge.handlers  # noqa: F401  (registers the handlers)

        try:
            asyncio.run(
                kopf.operator(
                    standalone=True,
                    clusterwide=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported by stop_operator
            self._error = exc
            ready.set()

    def stop_operator(self, timeout: float = 30.0) -> None:
        """Stop the operator (as SIGTERM would) and wait for it; no-op when not running.

        Raises
        ------
        RuntimeError
            When it did not stop within ``timeout`` seconds.
        Exception
            Whatever the operator raised while it ran.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the operator did not stop within {timeout}s")
        if self._error is not None:
            raise self._error

    @property
    def operator_running(self) -> bool:
        """True while the operator thread runs."""
        return self._thread is not None and self._thread.is_alive()

    # -- objects: the primitives of ObjectHelpers, on the emulator ---------------------------

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object (any served kind) and return it."""
        return self.kube.create(body)

    apply = create

    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Return one object, or None when it does not exist."""
        return self.kube.get(api_version, plural, name, namespace)

    def list_objects(
        self, api_version: str, plural: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Return the objects of a resource (all namespaces when None)."""
        return self.kube.list(api_version, plural, namespace)

    def delete_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> None:
        """Delete one object (it goes once its finalizers are removed)."""
        self.kube.delete(api_version, plural, name, namespace)

    def namespace(self, name: str) -> None:
        """Create a namespace (no error if it exists)."""
        if self.kube.get("v1", "namespaces", name) is None:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
