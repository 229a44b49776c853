"""Serve an aiohttp application from a background thread with its own event loop.

Both mocks (`mock_phpipam.server.MockPhpipamServer`, `mock_infoblox.server.MockInfobloxServer`)
run this way in tests and in ``ipam-bridge demo``: start on a free port, serve while the
caller's thread goes on, stop in well under a second even with requests hanging.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from types import TracebackType
from typing import Self

from aiohttp import web

__all__ = ["AppServer"]

log = logging.getLogger(__name__)


class AppServer:
    """An aiohttp application served on ``host:port`` from a daemon thread.

    Subclasses provide the application (`make_app`) and may release resources before the
    server stops (`before_stop`, e.g. hung requests of a fault injector).

    Parameters
    ----------
    host:
        Address to bind; keep ``127.0.0.1`` for tests.
    port:
        Port to bind; 0 picks a free one (see `port` once started).
    ssl_context:
        Serve HTTPS with this context (e.g. from ``trustme``); plain HTTP when None.
    shutdown_timeout:
        Seconds `stop` lets in-flight requests finish before cancelling them.
    name:
        Thread name and log label.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        shutdown_timeout: float = 0.5,
        name: str = "mock",
    ) -> None:
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._ssl = ssl_context
        self._shutdown_timeout = shutdown_timeout
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def make_app(self) -> web.Application:
        """Return the application to serve (called once per `start`, in the server thread)."""
        raise NotImplementedError

    def before_stop(self) -> None:
        """Release what could hold requests open (called by `stop`, in the caller's thread)."""

    # -- addresses ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port.

        Raises
        ------
        RuntimeError
            When the server is not running.
        """
        if self._port is None:
            raise RuntimeError(f"the {self._name} server is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """``http(s)://host:port``."""
        scheme = "https" if self._ssl is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        """Start serving and return once the socket listens.

        Raises
        ------
        RuntimeError
            When already running, or the server did not start within ``timeout`` seconds.
        OSError
            When the address cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError(f"the {self._name} server is already running")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the {self._name} server did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._error
        log.info("%s listening on %s", self._name, self.base_url)
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
        self._runner = web.AppRunner(
            self.make_app(), access_log=None, shutdown_timeout=self._shutdown_timeout
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=self._ssl).start()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (hung requests are dropped) and join the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self.before_stop()
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._cleanup(), loop)
            try:
                future.result(timeout)
            except Exception:  # best effort on a broken loop; the thread is joined anyway
                log.exception("%s cleanup failed", self._name)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None
        self._runner = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
