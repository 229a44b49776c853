"""EmulatedKubernetes: the in-memory Kubernetes API on 127.0.0.1 in its own thread and loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import aiohttp.web
import yaml

from mock_kubernetes.auth import AccessLog, Identity
from mock_kubernetes.emulator import KubeEmulator
from mock_kubernetes.resources import (
    BUILTIN_RESOURCES,
    KOPF_PEERING_RESOURCES,
    ResourceDef,
    crd_document,
    crd_object,
    resources_from_crd,
)
from mock_kubernetes.store import ApiError, ObjectStore

if TYPE_CHECKING:
    import kopf
    import kubernetes.client

__all__ = ["EmulatedKubernetes"]

_T = TypeVar("_T")


class EmulatedKubernetes:
    """An in-memory Kubernetes API server for tests and the demo.

    Used as a context manager: entering starts an aiohttp server on ``host`` (a free port by
    default) in a daemon thread with its own event loop; leaving ends every watch and stops it
    (in well under a second). Namespaces ``default`` and ``kube-system`` exist from the start.

    Parameters
    ----------
    crds : iterable of mapping or path
        CustomResourceDefinitions to serve (see :meth:`declare_crd`).
    peering : bool
        Also serve kopf's peering CRDs (``kopf.dev/v1``), for kopf without ``--standalone``.
    garbage_collection : bool
        Delete dependents whose every owner is gone (see :class:`ObjectStore`).
    namespace_lifecycle : bool
        Namespaces as on a real cluster: no object in a namespace that does not exist (404)
        or is terminating (403), and deleting a namespace deletes everything in it (see
        :class:`ObjectStore`).
    crd_validation : bool
        Enforce the CRDs' ``x-kubernetes-validations`` (CEL) rules, when cel-python is
        installed (see :class:`ObjectStore`).
    history_limit : int
        Watch events kept per resource for resumption (older resourceVersions get 410).
    identities : iterable of Identity
        Identities besides the admin (see :meth:`add_identity`).
    require_token : bool
        Refuse requests without a bearer token (401) instead of serving them as the admin.
    host, port : str, int
        Where to listen; port 0 picks a free one.
    bookmark_seconds : float or None
        Seconds without an event after which a watch asked with ``allowWatchBookmarks``
        gets a ``BOOKMARK`` (60, as a real API server); ``None``: never.

    Examples
    --------
    >>> with EmulatedKubernetes(crds=[crd]) as kube:          # doctest: +SKIP
    ...     kube.write_kubeconfig(tmp_path / "kubeconfig")
    ...     kube.create({"apiVersion": "v1", "kind": "Secret", ...})

    A restricted identity with the RBAC of ``deploy/``:

    >>> operator = kube.add_identity(deploy_identity())      # doctest: +SKIP
    ... kube.write_kubeconfig(tmp_path / "operator", identity=operator)
    ... kube.access_log.permissions(operator, allowed=False)

    """

    def __init__(
        self,
        *,
        crds: Iterable[Mapping[str, Any] | str | Path] = (),
        peering: bool = False,
        garbage_collection: bool = True,
        namespace_lifecycle: bool = True,
        crd_validation: bool = True,
        history_limit: int = 2000,
        identities: Iterable[Identity] = (),
        require_token: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_seconds: float | None = 60.0,
    ) -> None:
        self.store = ObjectStore(
            garbage_collection=garbage_collection,
            namespace_lifecycle=namespace_lifecycle,
            crd_validation=crd_validation,
            history_limit=history_limit,
        )
        """The object store; touch it only through this class's methods from other threads."""
        for defn in BUILTIN_RESOURCES + (KOPF_PEERING_RESOURCES if peering else ()):
            self.store.declare(defn)
        for ns in ("default", "kube-system"):
            self.store.create(
                self.store.resolve("", "v1", "namespaces"), None, {"metadata": {"name": ns}}
            )
        for crd in crds:
            self._declare_crd(crd)
        self.handler = KubeEmulator(
            store=self.store, require_token=require_token, bookmark_seconds=bookmark_seconds
        )
        """The request handler: its ``faults``, ``partition``, ``silence`` and ``latency`` shape
        the answers."""
        for identity in identities:
            self.add_identity(identity)
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: aiohttp.web.BaseRunner | None = None
        self._expire_on_up = False
        self._url: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(started,), daemon=True, name="kube-emulator"
        )
        self._thread.start()
        started.result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as e:
            started.set_exception(e)
            return
        started.set_result(None)
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _start(self) -> None:
        runner = await self._listen(self._port)
        host, port = runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"

    async def _listen(self, port: int) -> aiohttp.web.BaseRunner:
        server = aiohttp.web.Server(self.handler, handler_cancellation=True)
        runner = aiohttp.web.ServerRunner(server, shutdown_timeout=0.5)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, self._host, port)
        await site.start()
        self._runner = runner
        return runner

    async def _go_down(self, expire: bool) -> None:
        self.store.drop_watches()
        self._expire_on_up = expire
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _come_up(self) -> None:
        if self._runner is None:
            if self._expire_on_up:
                self.store.expire_history()
            await self._listen(int(self.url.rpartition(":")[2]))

    async def _stop(self) -> None:
        self.store.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def close(self) -> None:
        """Stop the server (idempotent): end watches, close connections, stop the thread."""
        if self._loop is None or self._thread is None:
            return
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop = None
        self._thread = None

    # -- outages --------------------------------------------------------------------------------

    def go_down(self, *, expire: bool = False) -> None:
        """Stop serving, as an API server process that stops: watches end, connections refused.

        Every open watch stream ends, every open connection is closed, and new connections are
        refused (the listening socket is closed) until `come_up`. The objects stay, and this
        object's own helpers (`create`, `patch`, `delete`, `get`, `list`, `wait_for`) keep
        working on the store meanwhile: they are the admin acting through another server.

        Parameters
        ----------
        expire:
            Forget the watch history when coming up (`ObjectStore.expire_history`): watches
            resumed after `come_up` from a resourceVersion older than the one current then
            answer 410 Gone, as after a kube-apiserver restart whose new watch cache starts
            at the current etcd revision.

        Raises
        ------
        RuntimeError
            If the emulator is not running.
        """
        self._control(self._go_down(expire))

    def come_up(self) -> None:
        """Serve again on the same address after `go_down` (no-op when serving).

        Raises
        ------
        RuntimeError
            If the emulator is not running.
        """
        self._control(self._come_up())

    def reset_watches(self) -> int:
        """Cut every open watch connection with a TCP reset, the server staying up.

        As a load balancer, a proxy or a NAT dropping long-lived connections: each watching
        client's read fails with "connection reset by peer" mid-stream; new requests are
        served at once, and a watch resumed from its last resourceVersion gets what
        happened meanwhile from the history (`KubeEmulator.reset_watches`).

        Returns
        -------
        int
            How many watch connections were cut.

        Raises
        ------
        RuntimeError
            If the emulator is not running.
        """
        return self.call(self.handler.reset_watches)

    @property
    def serving(self) -> bool:
        """True while connections are accepted (False between `go_down` and `come_up`)."""
        return self._runner is not None

    def _control(self, coro: Any) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            coro.close()
            raise RuntimeError("the emulator is not running")
        asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    @property
    def url(self) -> str:
        """Base URL of the API, e.g. ``http://127.0.0.1:40123``.

        Raises
        ------
        RuntimeError
            If the server is not running.

        """
        if self._url is None:
            raise RuntimeError("the emulator is not running")
        return self._url

    # -- configuration --------------------------------------------------------------------------

    def declare(self, defn: ResourceDef) -> ResourceDef:
        """Serve one more resource; returns ``defn``."""
        self.call(self.store.declare, defn)
        return defn

    def declare_crd(self, crd: Mapping[str, Any] | str | Path) -> ResourceDef:
        """Serve the resource of an ``apiextensions.k8s.io/v1`` CRD (dict or YAML file path).

        The CRD object is stored too (``Established``, as `crd_object` shows it), unless one
        of that name is there already: clients read it as from a real API server.

        Returns
        -------
        ResourceDef
            Group, kind, names, scope, served versions and status subresource of the CRD.

        Raises
        ------
        ValueError
            If it is not a CRD (see :func:`resources_from_crd`).

        """
        return self.call(self._declare_crd, crd)

    def _declare_crd(self, crd: Mapping[str, Any] | str | Path) -> ResourceDef:
        """Serve the CRD's resource and store the CRD object (`crd_object`), if new."""
        doc = crd_document(crd)
        defn = resources_from_crd(doc)
        self.store.declare(defn)
        crds = self.store.resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        name = str(doc["metadata"]["name"])
        try:
            self.store.get(crds, None, name)
        except ApiError as e:
            if e.status != 404:
                raise
            self.store.create(crds, None, crd_object(doc))
        return defn

    # -- identities -----------------------------------------------------------------------------

    @property
    def admin(self) -> Identity:
        """The unrestricted identity (user ``admin``); the default of every client helper."""
        return self.handler.admin

    @property
    def access_log(self) -> AccessLog:
        """Every authorization decision: who asked for what, allowed or denied."""
        return self.handler.access_log

    def add_identity(self, identity: Identity) -> Identity:
        """Accept ``identity``'s bearer token from now on; returns ``identity``.

        Examples
        --------
        >>> from mock_kubernetes.rbac import RBACAuthorizer           # doctest: +SKIP
        >>> user = service_account_user("ns", "sa")
        >>> kube.add_identity(Identity(user, RBACAuthorizer.from_files("rbac.yaml")))

        """
        self.handler.identities[identity.token] = identity
        return identity

    def kubeconfig(self, identity: Identity | None = None) -> dict[str, Any]:
        """Return a kubeconfig document (context ``emulator``) for :attr:`url`.

        Parameters
        ----------
        identity : Identity, optional
            Whose bearer token the user entry carries (default: the admin).

        """
        who = identity or self.admin
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": who.name, "user": {"token": who.token}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": who.name}}
            ],
            "current-context": "emulator",
        }

    def write_kubeconfig(self, path: str | Path, identity: Identity | None = None) -> Path:
        """Write :meth:`kubeconfig` (of ``identity``, default admin) to ``path``; return it."""
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(identity)), encoding="utf-8")
        return path

    def connection_info(self, identity: Identity | None = None) -> kopf.ConnectionInfo:
        """Return credentials for a ``@kopf.on.login`` handler (no kubeconfig needed).

        Parameters
        ----------
        identity : Identity, optional
            Whose bearer token kopf sends (default: the admin).

        Examples
        --------
        >>> @kopf.on.login()                                   # doctest: +SKIP
        ... def login(**_): return kube.connection_info()

        """
        import kopf

        who = identity or self.admin
        return kopf.ConnectionInfo(
            server=self.url, scheme="Bearer", token=who.token, default_namespace="default"
        )

    def api_client(self, identity: Identity | None = None) -> kubernetes.client.ApiClient:
        """Return a ``kubernetes.client.ApiClient`` configured explicitly for :attr:`url`.

        The configuration is built here, not loaded from ``$KUBECONFIG`` (which the
        ``kubernetes`` package reads at import time), and is not made the global default.

        Parameters
        ----------
        identity : Identity, optional
            Whose bearer token the client sends (default: the admin).

        """
        import kubernetes.client

        config = kubernetes.client.Configuration()
        config.host = self.url
        config.api_key = {"BearerToken": f"Bearer {(identity or self.admin).token}"}
        return kubernetes.client.ApiClient(config)

    # -- direct object access (no HTTP) ---------------------------------------------------------

    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)`` on the emulator's loop and return its result.

        Store operations must run on that loop (they feed watch queues); from any other thread
        this waits for the result, on the loop itself (or before start) it runs directly.

        Raises
        ------
        Exception
            Whatever ``fn`` raises, e.g. :class:`~mock_kubernetes.store.ApiError`.

        """
        loop = self._loop
        if loop is None or not loop.is_running() or _running_loop() is loop:
            return fn(*args, **kwargs)

        async def _call() -> _T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(_call(), loop).result(timeout=10)

    def _resource(self, api_version: str, plural_or_kind: str) -> ResourceDef:
        group, _, version = api_version.rpartition("/")
        try:
            return self.store.resolve(group, version, plural_or_kind)
        except ApiError:
            return self.store.find_kind(api_version, plural_or_kind)

    def get(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Return one object (a copy) or ``None`` if absent.

        Parameters
        ----------
        api_version : str
            ``v1`` or ``group/version``.
        plural : str
            Plural name or kind of the resource.
        name : str
            ``metadata.name``.
        namespace : str or None
            The namespace (``None`` for cluster-scoped resources).

        """
        defn = self._resource(api_version, plural)
        version = api_version.rpartition("/")[2]
        try:
            return self.call(self.store.get, defn, namespace, name, version)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Return the objects of a resource (all namespaces when ``namespace`` is ``None``)."""
        defn = self._resource(api_version, plural)
        version = api_version.rpartition("/")[2]
        result = self.call(
            self.store.list, defn, namespace, label_selector=label_selector, version=version
        )
        items: list[dict[str, Any]] = result["items"]
        return items

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object from its ``apiVersion``, ``kind`` and ``metadata.namespace``.

        Raises
        ------
        ApiError
            As the API would answer (409 if it exists, 404 for an unknown kind...).

        """
        defn = self.store.find_kind(body["apiVersion"], body["kind"])
        namespace = body.get("metadata", {}).get("namespace")
        return self.call(
            self.store.create, defn, namespace, body, version=body["apiVersion"].rpartition("/")[2]
        )

    def patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch (RFC 7386) an object, on the main endpoint or ``subresource="status"``."""
        defn = self._resource(api_version, plural)
        return self.call(
            self.store.patch,
            defn,
            namespace,
            name,
            "application/merge-patch+json",
            dict(patch),
            subresource=subresource,
            version=api_version.rpartition("/")[2],
        )

    def wait_for(
        self,
        api_version: str,
        plural: str,
        condition: Callable[[Any], bool],
        *,
        name: str | None = None,
        namespace: str | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """Wait until ``condition`` holds, re-checking on every change of the resource.

        Event-driven (a watch inside the emulator), not polling: the condition is evaluated on
        the current state and again after each change.

        Parameters
        ----------
        api_version : str
            ``v1`` or ``group/version``.
        plural : str
            Plural name or kind of the resource.
        condition : callable
            With ``name``: called with the object, or ``None`` while it does not exist.
            Without ``name``: called with the list of objects (of ``namespace``, or all).
        name : str or None
            The object to watch.
        namespace : str or None
            Its namespace, or the namespace to list (all when ``None``).
        timeout : float
            Seconds to wait.

        Returns
        -------
        Any
            The object (or list) for which the condition held.

        Raises
        ------
        TimeoutError
            If the condition does not hold within ``timeout`` seconds.

        """
        defn = self._resource(api_version, plural)
        version = api_version.rpartition("/")[2]
        store = self.store

        def current() -> Any:
            if name is None:
                return store.list(defn, namespace, version=version)["items"]
            try:
                return store.get(defn, namespace, name, version)
            except ApiError:
                return None

        async def wait() -> Any:
            # Subscribe and evaluate in one step (no await in between): nothing is missed.
            events = store.watch(defn, namespace, resource_version=str(store.resource_version))
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                state = current()
                if condition(state):
                    return state
                async for _ in events:
                    state = current()
                    if condition(state):
                        return state
            raise TimeoutError("the emulator was closed while waiting")

        async def wait_with_timeout() -> Any:
            try:
                return await asyncio.wait_for(wait(), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"{plural} {namespace or ''}/{name or ''}: condition not met within {timeout} s"
                ) from None

        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("the emulator is not running")
        return asyncio.run_coroutine_threadsafe(wait_with_timeout(), loop).result()

    def delete(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """Delete an object (finalizers are honoured, as in the API).

        Through the window of ``handler.deletes`` when it is open for ``plural``
        (`mock_kubernetes.inflight`), as a DELETE request: this call then returns once the
        window has passed.
        """
        defn = self._resource(api_version, plural)
        version = api_version.rpartition("/")[2]
        deletes = self.handler.deletes
        if deletes.applies(defn.plural):

            async def in_flight() -> dict[str, Any]:
                read = self.store.read_for_delete(defn, namespace, name)
                if read is None:
                    return self.store.delete(defn, namespace, name, version=version)
                await deletes.wait()
                return self.store.commit_delete(defn, read)

            loop = self._loop
            if loop is None or not loop.is_running():
                raise RuntimeError("the emulator is not running")
            return asyncio.run_coroutine_threadsafe(in_flight(), loop).result()
        return self.call(self.store.delete, defn, namespace, name, version=version)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
