"""A whole ipam-bridge installation on one machine: emulated Kubernetes, a mock IPAM, the operator.

Used by ``ipam-bridge demo`` and by the integration tests: the in-memory Kubernetes API
(`EmulatedKubernetes`) serves our pool CRDs, CAPI's IPAddressClaim/IPAddress CRDs and a CAPI
Cluster CRD; a mock phpIPAM (or Infoblox WAPI) answers on 127.0.0.1; the real kopf operator
(``bridge.handlers``) runs in this process, in a thread of its own (``kopf.operator``).
"""

from __future__ import annotations

import asyncio
import copy
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from bridge.capi import GROUP
from bridge.testing.server import EmulatedKubernetes

__all__ = ["CLUSTER_CRD", "Sandbox", "crd_documents", "repo_crds", "wait_for"]

#: Where the CRD files live in a source checkout (``make demo`` uses an editable install).
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
    "IPAM_BRIDGE_STANDALONE": "true",
    "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "1",
    "IPAM_BRIDGE_REQUEUE_SECONDS": "1",
    "IPAM_BRIDGE_REQUEUE_CONFIG_ERROR_SECONDS": "2",
    "IPAM_BRIDGE_REQUEUE_EXHAUSTED_SECONDS": "1",
    "IPAM_BRIDGE_REQUEUE_PAUSED_SECONDS": "1",
    "IPAM_BRIDGE_RETRY_ATTEMPTS": "3",
    "IPAM_BRIDGE_RETRY_MAX_DELAY_SECONDS": "0.2",
    "IPAM_BRIDGE_RETRY_TOTAL_SECONDS": "5",
    "IPAM_BRIDGE_BACKEND_TIMEOUT_SECONDS": "2",
    "IPAM_BRIDGE_METRICS_PORT": "0",
    "IPAM_BRIDGE_METRICS_ADDRESS": "127.0.0.1",
    "IPAM_BRIDGE_HEALTH_PORT": "0",
}


def repo_crds() -> list[Path]:
    """Return the CRD files of a source checkout: ours (``crds/``) and CAPI's (``crds/capi/``).

    Raises
    ------
    FileNotFoundError
        When run from an installed wheel without the source tree.
    """
    ours = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    capi = sorted((REPO_ROOT / "crds" / "capi").glob("*.yaml"))
    files = [p for p in ours + capi if p.name != "kustomization.yaml"]
    if not capi or not ours:
        raise FileNotFoundError(f"CRD files not found under {REPO_ROOT / 'crds'}")
    return files


def crd_documents(capi_versions: tuple[str, ...] = ("v1beta2", "v1beta1")) -> list[dict[str, Any]]:
    """Return the CRDs to serve, with CAPI's IPAM CRDs limited to ``capi_versions``.

    ``("v1beta1",)`` emulates a CAPI 1.6-1.10 management cluster (no v1beta2); the first
    version listed is the storage (and preferred) version.
    """
    documents: list[dict[str, Any]] = []
    for path in repo_crds():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            doc = copy.deepcopy(doc)
            if doc["spec"]["group"] == GROUP and doc["spec"]["names"]["kind"] in (
                "IPAddressClaim",
                "IPAddress",
            ):
                versions = [v for v in doc["spec"]["versions"] if v["name"] in capi_versions]
                versions.sort(key=lambda v: capi_versions.index(v["name"]))
                for i, version in enumerate(versions):
                    version["served"] = True
                    version["storage"] = i == 0
                doc["spec"]["versions"] = versions
            documents.append(doc)
    documents.append(copy.deepcopy(CLUSTER_CRD))
    return documents


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate()`` until it returns a truthy value; return that value.

    Raises
    ------
    TimeoutError
        After ``timeout`` seconds, naming ``message``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


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


class Sandbox:
    """Emulated Kubernetes plus the real operator, on 127.0.0.1, as a context manager.

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
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        capi_versions: tuple[str, ...] = ("v1beta2", "v1beta1"),
        settings: Mapping[str, str] | None = None,
        start_operator: bool = True,
        cluster_crd: bool = True,
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ipam-bridge-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.capi_versions = capi_versions
        self.kube = EmulatedKubernetes(
            crds=[
                doc
                for doc in crd_documents(capi_versions)
                if cluster_crd or doc["spec"]["group"] != CLUSTER_CRD["spec"]["group"]
            ]
        )
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
        kubeconfig = self.kube.write_kubeconfig(self.workdir / "kubeconfig")
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

    # -- objects --------------------------------------------------------------------------

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object (any served kind)."""
        return self.kube.create(body)

    def secret(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        """Create a Secret with ``stringData`` turned into ``data`` (base64)."""
        import base64

        return self.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    def namespace(self, name: str) -> None:
        """Create a namespace (no error if it exists)."""
        if self.kube.get("v1", "namespaces", name) is None:
            self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def claim(
        self,
        namespace: str,
        name: str,
        pool: str,
        *,
        kind: str = "PHPIPAMIPPool",
        cluster: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """Create an IPAddressClaim for ``kind``/``pool`` in the served version."""
        version = version or self.version
        spec: dict[str, Any] = {"poolRef": {"apiGroup": GROUP, "kind": kind, "name": pool}}
        if cluster and version != "v1alpha1":
            spec["clusterName"] = cluster
        return self.apply(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "IPAddressClaim",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels or {}),
                    "annotations": dict(annotations or {}),
                },
                "spec": spec,
            }
        )

    def phpipam_pool(
        self,
        namespace: str,
        name: str,
        *,
        endpoint: str,
        app_id: str = "capi",
        subnet_id: int | None = None,
        subnet: str | None = None,
        credentials: Mapping[str, str] | None = None,
        secret: str | None = None,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """Create a ``PHPIPAMIPPool`` (and its credentials Secret when ``credentials`` is given).

        Parameters
        ----------
        endpoint:
            The API base URL (a mock's ``.url``).
        credentials:
            Secret data (``username``/``password`` or ``token``), stored as
            ``<name>-credentials`` unless ``secret`` names the Secret.
        spec:
            Further spec fields, camelCase as in the CRD (``gateway``, ``hostnameSuffix``...).
        """
        secret = secret or f"{name}-credentials"
        if credentials is not None:
            self.secret(namespace, secret, credentials)
        body: dict[str, Any] = {
            "endpoint": endpoint,
            "appId": app_id,
            "credentialsRef": {"name": secret},
            **spec,
        }
        if subnet_id is not None:
            body["subnetId"] = subnet_id
        if subnet is not None:
            body["subnet"] = subnet
        return self.apply(
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "PHPIPAMIPPool",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                "spec": body,
            }
        )

    def infoblox_pool(
        self,
        namespace: str,
        name: str,
        *,
        endpoint: str,
        subnet: str,
        credentials: Mapping[str, str] | None = None,
        secret: str | None = None,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """Create an ``InfobloxIPPool`` (and its credentials Secret); see `phpipam_pool`."""
        secret = secret or f"{name}-credentials"
        if credentials is not None:
            self.secret(namespace, secret, credentials)
        return self.apply(
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "InfobloxIPPool",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                "spec": {
                    "endpoint": endpoint,
                    "subnet": subnet,
                    "credentialsRef": {"name": secret},
                    **spec,
                },
            }
        )

    def wait_pool_ready(
        self,
        namespace: str,
        name: str,
        kind: str = "PHPIPAMIPPool",
        *,
        reason: str = "PoolReady",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Wait until a pool's Ready condition has ``reason``; return the pool."""
        return dict(
            wait_for(
                lambda: (
                    (p := self.pool(namespace, name, kind)) and self.ready(p)[1] == reason and p
                ),
                timeout=timeout,
                message=f"{kind} {namespace}/{name} reason {reason}",
            )
        )

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a claim (served version) or None."""
        return self.kube.get(f"{GROUP}/{self.version}", "ipaddressclaims", name, namespace)

    def claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the claims (all namespaces when None)."""
        return self.kube.list(f"{GROUP}/{self.version}", "ipaddressclaims", namespace)

    def addresses(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the IPAddresses (all namespaces when None)."""
        return self.kube.list(f"{GROUP}/{self.version}", "ipaddresses", namespace)

    def pool(self, namespace: str, name: str, kind: str = "PHPIPAMIPPool") -> dict[str, Any] | None:
        """Return a pool object or None."""
        plural = {"PHPIPAMIPPool": "phpipamippools", "InfobloxIPPool": "infobloxippools"}[kind]
        return self.kube.get(f"{GROUP}/v1alpha1", plural, name, namespace)

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a claim (it goes once the operator has released it)."""
        self.kube.delete(f"{GROUP}/{self.version}", "ipaddressclaims", name, namespace)

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the core v1 Events (all namespaces when None)."""
        return self.kube.list("v1", "events", namespace)

    # -- waiting --------------------------------------------------------------------------

    @staticmethod
    def ready(body: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
        """Return ``(status, reason)`` of an object's Ready condition (see `bridge.capi`)."""
        from bridge.capi import ready_of

        return ready_of(body or {})

    def wait_claims_bound(
        self, namespace: str | None, count: int, *, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` claims have ``status.addressRef`` and Ready True; return them."""

        def bound() -> list[dict[str, Any]] | None:
            done = [
                c
                for c in self.claims(namespace)
                if (c.get("status") or {}).get("addressRef") and self.ready(c)[0] == "True"
            ]
            return done if len(done) >= count else None

        return list(wait_for(bound, timeout=timeout, message=f"{count} claims bound"))

    def wait_claim_reason(
        self, namespace: str, name: str, reason: str, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Wait until a claim's Ready condition has ``reason``; return the claim."""
        return dict(
            wait_for(
                lambda: (c := self.get_claim(namespace, name)) and self.ready(c)[1] == reason and c,
                timeout=timeout,
                message=f"claim {namespace}/{name} reason {reason}",
            )
        )

    def wait_gone(self, namespace: str | None, *, timeout: float = 60.0) -> None:
        """Wait until no claim and no IPAddress is left (in ``namespace``, or anywhere)."""
        wait_for(
            lambda: not self.claims(namespace) and not self.addresses(namespace),
            timeout=timeout,
            message="claims and addresses gone",
        )
