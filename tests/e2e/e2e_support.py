"""Helpers of the end-to-end tests: an API server, the operator in a thread, IPAM targets.

`ClusterKube` talks to whatever a kubeconfig names, with the official client only: the
cluster of ``KUBECONFIG``, or the in-memory API server of `in_memory_api_server` when that
is not set (see ``conftest.py``); `phpipam_target_from_env` to whatever ``PHPIPAM_URL``
names (the tests that need it skip when it is not set).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import ipaddress
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import yaml

from backends.phpipam import PHPIPAMBackend, PHPIPAMConfig
from backends.retry import RetryPolicy
from bridge import capi
from bridge.capi import GROUP, SUPPORTED_VERSIONS
from mock_kubernetes.objects import ObjectHelpers
from mock_kubernetes.sandbox import FAST_SETTINGS, crd_documents, wait_for
from mock_kubernetes.server import EmulatedKubernetes
from mock_phpipam.server import MockPhpipamServer

__all__ = [
    "CREDENTIALS",
    "E2E_ENV",
    "REPO",
    "ApiServer",
    "ClusterKube",
    "IpamTarget",
    "ObjectHelpers",
    "OperatorThread",
    "apply_crds",
    "crd_examples_module",
    "delete_crds",
    "in_memory_api_server",
    "phpipam_target_from_env",
    "ready_condition",
]

#: Credentials of the mock phpIPAM's user (never a real secret).
CREDENTIALS = {"username": "capi-operator", "password": "Pa55-w0rd-e2e-never-logged"}

REPO = Path(__file__).resolve().parents[2]
FIELD_MANAGER = "ipam-bridge-e2e"
POOL_VERSION = "v1alpha1"
PLURALS = {"PHPIPAMIPPool": "phpipamippools", "InfobloxIPPool": "infobloxippools"}

#: The environment as it was when the e2e tests were collected. Integration fixtures point
#: ``KUBECONFIG`` at an in-memory API while they run; this snapshot is what the user set.
E2E_ENV: Mapping[str, str] = {
    key: value
    for key, value in os.environ.items()
    if key in ("KUBECONFIG", "KUBECONFIG_SECOND")
    or key.startswith("PHPIPAM_")
    or key.startswith("IPAM_BRIDGE_E2E_")
}

#: Seconds the cluster tests wait for one step (a real API server and watch are slower than
#: the in-memory one).
STEP_TIMEOUT = float(E2E_ENV.get("IPAM_BRIDGE_E2E_TIMEOUT", "90"))


def unique_name(prefix: str) -> str:
    """Return ``<prefix>-<6 hex digits>``: a fresh DNS-1123 name per run."""
    return f"{prefix}-{secrets.token_hex(3)}"


def crd_examples_module() -> ModuleType:
    """Load ``tests/unit/test_crds.py`` under a private name: its VALID/INVALID pool examples.

    The unit tests judge the examples with jsonschema and celpy; the dry-run test sends the
    very same objects to a real API server, so the two can never drift apart.
    """
    path = REPO / "tests" / "unit" / "test_crds.py"
    spec = importlib.util.spec_from_file_location("_ipam_bridge_e2e_crd_examples", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a broken checkout
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- API server


@dataclass(frozen=True)
class ApiServer:
    """The Kubernetes API server a session runs against.

    Attributes
    ----------
    kubeconfig:
        Path of the kubeconfig that reaches it (the tests and the operator use only this).
    emulator:
        The in-memory API server when the session started one, None for a real cluster.
    """

    kubeconfig: str
    emulator: EmulatedKubernetes | None


@contextmanager
def in_memory_api_server(workdir: Path) -> Iterator[ApiServer]:
    """Serve the in-memory API server (`mock_kubernetes`) on 127.0.0.1 while in the block.

    It serves our pool CRDs and CAPI's IPAM and Cluster CRDs (`crd_documents`, as the
    integration tests' sandbox does), with their OpenAPI schemas and CEL rules enforced;
    ``workdir/kubeconfig`` carries the admin's bearer token. The operator is not started
    here: the tests start it per namespace (`OperatorThread`), as on a real cluster.
    """
    with EmulatedKubernetes(crds=crd_documents()) as kube:
        yield ApiServer(str(kube.write_kubeconfig(workdir / "kubeconfig")), kube)


# ---------------------------------------------------------------------------------- CRDs


def _crd_docs(path: Path) -> list[dict[str, Any]]:
    return [
        d
        for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if d and d.get("kind") == "CustomResourceDefinition"
    ]


def _crd_client(api: Any) -> tuple[Any, Any]:
    """Return a dynamic client (untyped) and its CustomResourceDefinition resource."""
    from kubernetes import dynamic

    dyn = cast(Any, dynamic).DynamicClient(api)
    return dyn, dyn.resources.get(
        api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
    )


def apply_crds(api: Any, *, timeout: float = 60.0) -> list[str]:
    """Server-side apply the CRDs of ``crds/`` (and ``crds/capi/`` when CAPI's are absent).

    Parameters
    ----------
    api:
        A ``kubernetes.client.ApiClient`` of the cluster.
    timeout:
        Seconds to wait for every applied CRD to be ``Established``.

    Returns
    -------
    list of str
        Names of the CRDs that did not exist before (the caller may delete them later).

    Raises
    ------
    kubernetes.client.exceptions.ApiException
        When the API server refuses a CRD (e.g. a CEL rule over the cost budget).
    TimeoutError
        When a CRD does not become Established in time.
    """
    from kubernetes.dynamic.exceptions import NotFoundError

    dyn, crds = _crd_client(api)

    def exists(name: str) -> bool:
        try:
            dyn.get(crds, name=name)
        except NotFoundError:
            return False
        return True

    docs = [
        d
        for p in sorted((REPO / "crds").glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in _crd_docs(p)
    ]
    if not exists(f"ipaddressclaims.{GROUP}"):
        # No CAPI in this cluster: serve our copies of its IPAM CRDs (every version).
        docs += [d for p in sorted((REPO / "crds" / "capi").glob("*.yaml")) for d in _crd_docs(p)]
    created = [d["metadata"]["name"] for d in docs if not exists(d["metadata"]["name"])]
    for doc in docs:
        dyn.server_side_apply(crds, body=doc, field_manager=FIELD_MANAGER, force_conflicts=True)

    def established(name: str) -> bool:
        status = dyn.get(crds, name=name).to_dict().get("status") or {}
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    for doc in docs:
        name = doc["metadata"]["name"]
        wait_for(
            partial(established, name),
            timeout=timeout,
            interval=0.5,
            message=f"CRD {name} Established",
        )
    return created


def delete_crds(api: Any, names: list[str]) -> None:
    """Delete the named CRDs (missing ones are ignored); their objects go with them."""
    from kubernetes.dynamic.exceptions import NotFoundError

    dyn, crds = _crd_client(api)
    for name in names:
        with contextlib.suppress(NotFoundError):
            dyn.delete(crds, name=name)


# ------------------------------------------------------------------------- the cluster


class ClusterKube(ObjectHelpers):
    """Objects of a real cluster with the same helpers as `mock_kubernetes.Sandbox`.

    Parameters
    ----------
    api:
        A ``kubernetes.client.ApiClient``.
    version:
        The CAPI IPAM version claims and addresses are read and written in.
    """

    wait_timeout = STEP_TIMEOUT
    poll_interval = 0.25  # a real API server: do not poll it every 50 ms

    def __init__(self, api: Any, version: str) -> None:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.api = api
        self.core = CoreV1Api(api)
        self.custom = CustomObjectsApi(api)
        self._version = version

    @property
    def version(self) -> str:
        """The CAPI IPAM version claims and addresses are written and read in."""
        return self._version

    @classmethod
    def discover(cls, api: Any, *, timeout: float = 30.0) -> ClusterKube:
        """Build one on the version the operator will pick (discovery may lag a new CRD)."""
        from bridge.runtime.gateway import Kube, NotServedError

        kube = Kube(api)

        def version() -> str | None:
            try:
                return kube.preferred_version(GROUP, "ipaddressclaims", SUPPORTED_VERSIONS)
            except NotServedError:
                return None

        return cls(
            api,
            str(wait_for(version, timeout=timeout, interval=0.5, message="CAPI IPAM discovery")),
        )

    # -- namespaces ------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        """Create a namespace labelled as an e2e test namespace."""
        from kubernetes.client import V1Namespace, V1ObjectMeta

        self.core.create_namespace(
            V1Namespace(
                metadata=V1ObjectMeta(
                    name=name, labels={"ipam-bridge.ipam.cluster.x-k8s.io/e2e": "true"}
                )
            )
        )

    def delete_namespace(self, name: str, *, timeout: float = 60.0) -> bool:
        """Delete a namespace after dropping every finalizer of ours in it.

        A test may leave claims, addresses, pools, or credentials Secrets that a pool still
        holds, whose finalizers no operator will remove any more (it is stopped); they would
        keep the namespace in ``Terminating`` forever.

        Returns
        -------
        bool
            True when the namespace was gone within ``timeout`` seconds.
        """
        from kubernetes.client.exceptions import ApiException

        targets = [(self.version, p) for p in ("ipaddressclaims", "ipaddresses")]
        targets += [(POOL_VERSION, p) for p in PLURALS.values()]
        for version, plural in targets:
            try:
                items = self.list_objects(f"{GROUP}/{version}", plural, name)
            except ApiException:
                continue
            for item in items:
                with contextlib.suppress(ApiException):
                    self.custom.patch_namespaced_custom_object(
                        GROUP,
                        version,
                        name,
                        plural,
                        item["metadata"]["name"],
                        {"metadata": {"finalizers": []}},
                    )
        for secret in self.core.list_namespaced_secret(name).items:
            if secret.metadata.finalizers:
                with contextlib.suppress(ApiException):
                    self.core.patch_namespaced_secret(
                        secret.metadata.name, name, {"metadata": {"finalizers": []}}
                    )
        try:
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def gone() -> bool:
            try:
                self.core.read_namespace(name)
            except ApiException as exc:
                return bool(exc.status == 404)
            return False

        try:
            wait_for(gone, timeout=timeout, interval=0.5, message=f"namespace {name} gone")
        except TimeoutError:
            return False
        return True

    # -- objects (the Sandbox's helpers) ----------------------------------------------

    def secret(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        """Create an Opaque Secret from string data."""
        from kubernetes.client import V1ObjectMeta, V1Secret

        created = self.core.create_namespaced_secret(
            namespace,
            V1Secret(metadata=V1ObjectMeta(name=name), type="Opaque", string_data=dict(data)),
        )
        return dict(self.api.sanitize_for_serialization(created))

    def create(self, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create a namespaced custom object (strict field validation, like kubectl).

        Raises
        ------
        kubernetes.client.exceptions.ApiException
            With the API server's Status (400 unknown field, 422 invalid, 409 exists).
        """
        group, version = str(body["apiVersion"]).split("/")
        plural = {**PLURALS, "IPAddressClaim": "ipaddressclaims", "IPAddress": "ipaddresses"}[
            str(body["kind"])
        ]
        return cast(
            dict[str, Any],
            self.custom.create_namespaced_custom_object(
                group,
                version,
                body["metadata"]["namespace"],
                plural,
                dict(body),
                dry_run="All" if dry_run else None,
                field_validation="Strict",
            ),
        )

    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Return one namespaced object of our group, or None."""
        from kubernetes.client.exceptions import ApiException

        version = api_version.rpartition("/")[2]
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, version, str(namespace), plural, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self, api_version: str, plural: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Return the objects of a resource of our group (all namespaces when None)."""
        version = api_version.rpartition("/")[2]
        if namespace is None:
            result = cast(
                dict[str, Any], self.custom.list_cluster_custom_object(GROUP, version, plural)
            )
        else:
            result = cast(
                dict[str, Any],
                self.custom.list_namespaced_custom_object(GROUP, version, namespace, plural),
            )
        kind = {"ipaddressclaims": "IPAddressClaim", "ipaddresses": "IPAddress"}.get(plural)
        items = [dict(i) for i in result.get("items") or []]
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", f"{GROUP}/{version}")
            if kind:
                item.setdefault("kind", kind)
        return items

    def delete_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> None:
        """Delete one namespaced object of our group (it goes once its finalizers are removed)."""
        version = api_version.rpartition("/")[2]
        self.custom.delete_namespaced_custom_object(GROUP, version, str(namespace), plural, name)

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return core v1 Events as JSON dicts."""
        if namespace is None:
            result = self.core.list_event_for_all_namespaces()
        else:
            result = self.core.list_namespaced_event(namespace)
        return list(self.api.sanitize_for_serialization(result).get("items") or [])


# ------------------------------------------------------------------------ the operator


class OperatorThread:
    """The real operator (``bridge.handlers``) in a thread of this process, one namespace.

    Runs ``kopf.operator`` standalone (no peering objects in the cluster) and namespaced, so
    an ipam-bridge installed in the same cluster would not race it for other namespaces;
    the ``IPAM_BRIDGE_*`` settings must be in ``os.environ`` while it runs.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until kopf reports ready.

        Raises
        ------
        RuntimeError
            When kopf is not ready within ``timeout`` seconds.
        """
        ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), daemon=True, name=f"ipam-bridge-e2e-{self.namespace}"
        )
        self._thread.start()
        if not ready.wait(timeout) or self._error is not None:
            self.stop()
            raise RuntimeError(f"the operator did not get ready within {timeout}s")

    def _run(self, ready: threading.Event) -> None:
        import kopf

        import bridge.handlers  # noqa: F401  (registers the handlers)

        try:
            asyncio.run(
                kopf.operator(
                    standalone=True,
                    namespaces=[self.namespace],
                    clusterwide=False,
                    stop_flag=self._stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported by stop()
            self._error = exc
            ready.set()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop (as SIGTERM would) and join; re-raise what the operator raised."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the operator did not stop within {timeout}s")
        if self._error is not None:
            raise self._error


def operator_environment(namespace: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the ``IPAM_BRIDGE_*`` variables of an e2e operator serving ``namespace``."""
    return {**FAST_SETTINGS, "IPAM_BRIDGE_NAMESPACE": namespace, **(extra or {})}


# --------------------------------------------------------------------- IPAM targets


@dataclass
class IpamTarget:
    """A phpIPAM subnet that pools point at, and a client to look behind the operator's back.

    Attributes
    ----------
    name:
        ``mock`` (mock_phpipam on 127.0.0.1) or ``phpipam`` (``PHPIPAM_URL``).
    endpoint, app_id, subnet_id:
        The pool's ``spec.endpoint``, ``spec.appId``, ``spec.subnetId``.
    credentials:
        The Secret's data (``username``/``password`` or ``token``).
    tls:
        The pool's ``spec.tls`` (empty: default verification).
    ca_pem:
        A CA bundle to put in a Secret for ``tls.caSecretRef`` (None: none).
    small_subnet_id:
        A subnet of at most a few free addresses on the same server, to exhaust (None: none).
    config:
        The client configuration of the same subnet (`backend` builds clients from it).
    mock:
        The mock server when ``name == "mock"``.
    """

    name: str
    endpoint: str
    app_id: str
    subnet_id: int
    credentials: dict[str, str]
    config: PHPIPAMConfig
    tls: dict[str, Any] = field(default_factory=dict)
    ca_pem: str | None = None
    small_subnet_id: int | None = None
    mock: MockPhpipamServer | None = None

    def backend(self, subnet_id: int | None = None) -> PHPIPAMBackend:
        """Return a new client of this subnet (or of ``subnet_id`` on the same server)."""
        config = self.config
        if subnet_id is not None:
            config = PHPIPAMConfig(**{**_config_fields(config), "subnet_id": subnet_id})
        return PHPIPAMBackend(config)

    def pool_spec(self, namespace: str, kube: ObjectHelpers) -> dict[str, Any]:
        """Return the pool spec fields of this target (creating the CA Secret if needed)."""
        spec: dict[str, Any] = {}
        if self.ca_pem is not None:
            kube.secret(namespace, "phpipam-ca", {"ca.crt": self.ca_pem})
            spec["tls"] = {"caSecretRef": {"name": "phpipam-ca"}}
        elif self.tls:
            spec["tls"] = copy.deepcopy(self.tls)
        return spec

    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """The subnet, as the IPAM describes it."""
        with self.backend() as client:
            return ipaddress.ip_network(client.describe_subnets()[0].cidr)


def _config_fields(config: PHPIPAMConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def phpipam_target_from_env(env: Mapping[str, str] = E2E_ENV) -> IpamTarget | None:
    """Return the real phpIPAM of ``PHPIPAM_*`` variables, or None when ``PHPIPAM_URL`` is unset.

    Variables: ``PHPIPAM_URL`` (API base URL, e.g. ``https://ipam.example.com/api``),
    ``PHPIPAM_APP_ID``, ``PHPIPAM_USERNAME`` + ``PHPIPAM_PASSWORD`` or ``PHPIPAM_TOKEN`` (an
    app code), ``PHPIPAM_SUBNET_ID``; optional ``PHPIPAM_SMALL_SUBNET_ID`` (exhaustion test),
    ``PHPIPAM_CA_BUNDLE`` (PEM file) or ``PHPIPAM_INSECURE=1``.

    Raises
    ------
    ValueError
        When ``PHPIPAM_URL`` is set but the other variables are missing or invalid.
    """
    url = env.get("PHPIPAM_URL")
    if not url:
        return None
    missing = [k for k in ("PHPIPAM_APP_ID", "PHPIPAM_SUBNET_ID") if not env.get(k)]
    token = env.get("PHPIPAM_TOKEN")
    if not token and not (env.get("PHPIPAM_USERNAME") and env.get("PHPIPAM_PASSWORD")):
        missing.append("PHPIPAM_USERNAME+PHPIPAM_PASSWORD or PHPIPAM_TOKEN")
    if missing:
        raise ValueError(f"PHPIPAM_URL is set but not {', '.join(missing)}")
    credentials = (
        {"token": token}
        if token
        else {"username": env["PHPIPAM_USERNAME"], "password": env["PHPIPAM_PASSWORD"]}
    )
    ca_path = env.get("PHPIPAM_CA_BUNDLE")
    insecure = env.get("PHPIPAM_INSECURE", "") in ("1", "true", "yes")
    verify: bool | str = ca_path or not insecure
    config = PHPIPAMConfig(
        endpoint=url,
        app_id=env["PHPIPAM_APP_ID"],
        subnet_id=int(env["PHPIPAM_SUBNET_ID"]),
        username=credentials.get("username"),
        password=credentials.get("password"),
        app_code=credentials.get("token"),
        verify=verify,
        timeout_seconds=15,
        retry=RetryPolicy(attempts=4, max_delay_seconds=2, total_seconds=30),
    )
    return IpamTarget(
        name="phpipam",
        endpoint=url,
        app_id=config.app_id,
        subnet_id=int(config.subnet_id or 0),
        credentials=credentials,
        config=config,
        tls={"insecureSkipVerify": True} if insecure and not ca_path else {},
        ca_pem=Path(ca_path).read_text(encoding="utf-8") if ca_path else None,
        small_subnet_id=int(env["PHPIPAM_SMALL_SUBNET_ID"])
        if env.get("PHPIPAM_SMALL_SUBNET_ID")
        else None,
    )


def mock_target(
    server: MockPhpipamServer,
    *,
    app_id: str,
    subnet_id: int,
    credentials: Mapping[str, str],
    small_subnet_id: int | None = None,
) -> IpamTarget:
    """Return the target of a running mock phpIPAM (plain HTTP on 127.0.0.1)."""
    config = PHPIPAMConfig(
        endpoint=server.url,
        app_id=app_id,
        subnet_id=subnet_id,
        username=credentials.get("username"),
        password=credentials.get("password"),
        app_code=credentials.get("token"),
        timeout_seconds=5,
        retry=RetryPolicy(attempts=3, max_delay_seconds=0.2, total_seconds=5),
    )
    return IpamTarget(
        name="mock",
        endpoint=server.url,
        app_id=app_id,
        subnet_id=subnet_id,
        credentials=dict(credentials),
        config=config,
        small_subnet_id=small_subnet_id,
        mock=server,
    )


# ------------------------------------------------------------------------ scenarios


def ready_condition(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Return an object's Ready condition (empty when it has none).

    As `bridge.capi.ready_of` reads it: ``status.conditions``, or for a v1beta1 claim
    ``status.v1beta2.conditions`` when present (CAPI >= 1.9).
    """
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    if str(obj.get("apiVersion", "")).endswith("/v1beta1") and obj.get("kind") == "IPAddressClaim":
        conditions = (status.get("v1beta2") or {}).get("conditions") or conditions
    return next((dict(c) for c in conditions if c.get("type") == "Ready"), {})


def _hostnames_in_mock(target: IpamTarget, namespace: str) -> dict[str, str]:
    """hostname -> address of the mock's rows registered for ``namespace``'s claims."""
    assert target.mock is not None
    return {
        a.hostname: str(a.ip)
        for a in target.mock.store.all_addresses()
        if a.hostname and a.hostname.endswith(f".{namespace}")
    }


def _delete_pool(kube: ObjectHelpers, namespace: str, name: str) -> None:
    delete = getattr(kube, "delete_pool", None)
    if delete is not None:
        delete(namespace, name)
    else:  # mock_kubernetes.Sandbox
        cast(Any, kube).kube.delete(
            f"{GROUP}/{POOL_VERSION}", PLURALS["PHPIPAMIPPool"], name, namespace
        )


def allocation_scenario(
    kube: ObjectHelpers,
    target: IpamTarget,
    namespace: str,
    *,
    claims: int = 5,
    timeout: float = STEP_TIMEOUT,
) -> None:
    """Pool, claims, addresses, pool protection, release: the whole contract, asserted.

    1. A ``PHPIPAMIPPool`` on the target's subnet becomes Ready with the subnet's facts.
    2. ``claims`` claims become Ready (reason ``AddressAllocated``, a message naming the
       address and the pool) with ``status.addressRef``; each ``IPAddress`` has the
       contract's spec, owner references and finalizer; the addresses are distinct, in the
       subnet, and registered in phpIPAM under ``<claim>.<namespace>``.
    3. Deleting the pool while addresses reference it is held (``DeletionBlocked``).
    4. Deleting the claims releases every address in phpIPAM and deletes every IPAddress;
       then the pool goes too.

    Raises
    ------
    AssertionError, TimeoutError
        When any step does not hold.
    """
    with target.backend() as ipam:
        before = ipam.describe_subnets()[0]
    network = ipaddress.ip_network(before.cidr)
    kube.phpipam_pool(
        namespace,
        "pool",
        endpoint=target.endpoint,
        app_id=target.app_id,
        subnet_id=target.subnet_id,
        credentials=target.credentials,
        **target.pool_spec(namespace, kube),
    )
    pool = kube.wait_pool_ready(namespace, "pool", timeout=timeout)
    status = pool["status"]
    assert status["subnet"] == str(network)
    assert status["prefix"] == network.prefixlen
    assert status.get("gateway") == before.gateway
    assert status["ipAddresses"]["total"] == before.total
    assert kube.ready(pool) == ("True", "PoolReady")
    assert capi.POOL_FINALIZER in pool["metadata"].get("finalizers", [])

    names = [f"node-{i:02d}-eth0" for i in range(claims)]
    for name in names:
        kube.claim(namespace, name, "pool")
    bound = {
        c["metadata"]["name"]: c for c in kube.wait_claims_bound(namespace, claims, timeout=timeout)
    }
    assert sorted(bound) == names
    addresses = {a["metadata"]["name"]: a for a in kube.addresses(namespace)}
    assert sorted(addresses) == names
    ips = {name: a["spec"]["address"] for name, a in addresses.items()}
    assert len(set(ips.values())) == claims, f"an address was handed out twice: {ips}"
    pool_uid = pool["metadata"]["uid"]
    with target.backend() as ipam:
        for name in names:
            claim, address = bound[name], addresses[name]
            assert kube.ready(claim) == ("True", capi.Reason.ALLOCATED)
            spec = address["spec"]
            assert ready_condition(claim).get("message") == (
                f"address {spec['address']}/{spec['prefix']} from PHPIPAMIPPool {namespace}/pool"
            )
            assert claim["status"]["addressRef"] == {"name": name}
            assert capi.CLAIM_FINALIZER in claim["metadata"]["finalizers"]
            assert ipaddress.ip_address(spec["address"]) in network
            assert spec["address"] != before.gateway
            assert spec["prefix"] == network.prefixlen
            assert spec.get("gateway") == before.gateway
            assert spec["claimRef"] == {"name": name}
            assert spec["poolRef"] == claim["spec"]["poolRef"]
            meta = address["metadata"]
            assert capi.ADDRESS_FINALIZER in meta["finalizers"]
            owners = {(o["kind"], o["uid"]): o for o in meta["ownerReferences"]}
            claim_owner = owners[("IPAddressClaim", claim["metadata"]["uid"])]
            pool_owner = owners[("PHPIPAMIPPool", pool_uid)]
            assert (claim_owner["controller"], claim_owner["blockOwnerDeletion"]) == (True, True)
            assert (pool_owner["controller"], pool_owner["blockOwnerDeletion"]) == (False, True)
            registered = ipam.find(f"{name}.{namespace}")
            assert registered is not None, f"{name}.{namespace} is not registered in phpIPAM"
            assert registered.address == spec["address"]
    if target.mock is not None:
        assert _hostnames_in_mock(target, namespace) == {f"{n}.{namespace}": ips[n] for n in names}

    if target.mock is not None:  # nobody else writes to the mock: the count is exact
        kube.wait_pool_ready(namespace, "pool", timeout=timeout)
        wait_for(
            lambda: (
                (kube.pool(namespace, "pool") or {})
                .get("status", {})
                .get("ipAddresses", {})
                .get("used")
                == before.used + claims
            ),
            timeout=timeout,
            interval=0.25,
            message="pool usage counts the claims",
        )

    _delete_pool(kube, namespace, "pool")
    held = kube.wait_pool_ready(namespace, "pool", reason="DeletionBlocked", timeout=timeout)
    assert held["metadata"].get("deletionTimestamp")
    assert len(kube.addresses(namespace)) == claims

    for name in names:
        kube.delete_claim(namespace, name)
    kube.wait_gone(namespace, timeout=timeout)
    with target.backend() as ipam:
        for name in names:
            assert ipam.find(f"{name}.{namespace}") is None, f"{name} was not released"
    if target.mock is not None:
        assert _hostnames_in_mock(target, namespace) == {}
    wait_for(
        lambda: kube.pool(namespace, "pool") is None,
        timeout=timeout,
        interval=0.25,
        message="pool deleted once no address references it",
    )
