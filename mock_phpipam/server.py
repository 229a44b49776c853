"""Run the mock in a background thread with its own event loop (tests, ``ipam-bridge demo``)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from types import TracebackType

from aiohttp import web

from mock_phpipam.app import create_app, phpipam_faults
from mock_phpipam.faults import FaultInjector
from mock_phpipam.store import Store

__all__ = ["MockPhpipamServer"]

log = logging.getLogger(__name__)


class MockPhpipamServer:
    """A running mock phpIPAM on ``host:port`` (port 0 = an ephemeral port).

    Parameters
    ----------
    store:
        The state to serve (default: an empty `Store`); tests keep a reference to inspect it.
    faults:
        Fault injection (default: an inactive `phpipam_faults` injector).
    host:
        Address to bind; keep ``127.0.0.1`` for tests.
    port:
        Port to bind; 0 picks a free one (see `port` after `start`).
    ssl_context:
        Serve HTTPS with this context (e.g. from ``trustme``).
    shutdown_timeout:
        Seconds `stop` lets in-flight requests finish before cancelling them.

    Examples
    --------
    >>> with MockPhpipamServer(store) as server:          # doctest: +SKIP
    ...     requests.post(f"{server.url}/capi/user/", auth=("Admin", "ipamadmin"))
    """

    def __init__(
        self,
        store: Store | None = None,
        faults: FaultInjector | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        shutdown_timeout: float = 0.5,
    ) -> None:
        self.store = store if store is not None else Store()
        self.faults = faults if faults is not None else phpipam_faults()
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._ssl = ssl_context
        self._shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        """The bound TCP port.

        Raises
        ------
        RuntimeError
            When the server is not running.
        """
        if self._port is None:
            raise RuntimeError("the mock phpIPAM server is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """``http(s)://host:port`` (the admin API is under ``/_mock``)."""
        scheme = "https" if self._ssl is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The API base URL a pool's ``spec.endpoint`` takes: ``<base_url>/api``."""
        return f"{self.base_url}/api"

    def app_url(self, app_id: str) -> str:
        """Return ``<url>/<app_id>`` (requests go to ``<app_url>/<controller>/...``)."""
        return f"{self.url}/{app_id}"

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 10.0) -> MockPhpipamServer:
        """Start serving in a daemon thread and return once the socket listens.

        Raises
        ------
        RuntimeError
            When already running, or the server did not start within ``timeout`` seconds.
        OSError
            When the address cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("the mock phpIPAM server is already running")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="mock-phpipam", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"mock phpIPAM did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._error
        log.info("mock phpIPAM listening on %s", self.url)
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self._requested_port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        app = create_app(self.store, self.faults)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await self._runner.setup()
        site = web.SockSite(self._runner, sock, ssl_context=self._ssl)
        await site.start()

    async def _cleanup(self) -> None:
        self.faults.release_hangs()
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (hung requests are dropped) and join the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._cleanup(), loop)
            try:
                future.result(timeout)
            except Exception:  # pragma: no cover - best effort on a broken loop
                log.exception("mock phpIPAM cleanup failed")
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None
        self._runner = None
        self._port = None

    def __enter__(self) -> MockPhpipamServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
