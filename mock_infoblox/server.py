"""Run the mock WAPI on 127.0.0.1 in a background thread with its own event loop (for tests)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from types import TracebackType

from aiohttp import web

from mock_infoblox.app import create_app, faults_of
from mock_infoblox.store import InfobloxStore
from mock_phpipam.faults import FaultInjector

__all__ = ["MockInfobloxServer"]


class MockInfobloxServer:
    """The mock WAPI server, started on an ephemeral port in a daemon thread.

    Parameters
    ----------
    store:
        The grid state; a new empty `InfobloxStore` when None.
    faults:
        Fault injection; an inactive injector when None (see `mock_infoblox.app.create_app`).
    host:
        Address to listen on (default ``127.0.0.1``).
    port:
        Port; 0 (default) lets the OS pick a free one.
    ssl_context:
        Serve HTTPS with this context (e.g. from ``trustme``); plain HTTP when None.

    Attributes
    ----------
    store:
        The state the server serves (tests may read and change it while it runs).
    faults:
        The fault injector (``server.faults.update(error_rate=1.0)``).

    Examples
    --------
    >>> with MockInfobloxServer(InfobloxStore.from_seed({...})) as server:  # doctest: +SKIP
    ...     requests.get(f"{server.url}/wapi/v2.12/network", auth=("admin", "infoblox"))
    """

    def __init__(
        self,
        store: InfobloxStore | None = None,
        faults: FaultInjector | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.store = store if store is not None else InfobloxStore()
        self._app = create_app(self.store, faults)
        self.faults: FaultInjector = faults_of(self._app)
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The port the server listens on (known once `start` returned)."""
        return self._port

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:41234`` (append ``/wapi/v2.12/...``)."""
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    def start(self, timeout: float = 10.0) -> MockInfobloxServer:
        """Start serving and wait until the socket listens.

        Parameters
        ----------
        timeout:
            Seconds to wait for the server to listen.

        Returns
        -------
        MockInfobloxServer
            self, with `url` set.

        Raises
        ------
        RuntimeError
            If the server is already running or did not start within ``timeout``.
        OSError
            If the port cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("the server is already running")
        self._thread = threading.Thread(target=self._run, name="mock-infoblox", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("mock Infoblox server did not start in time")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (open connections are closed) and join the thread.

        Parameters
        ----------
        timeout:
            Seconds to wait for the thread to end.
        """
        loop, stop, thread = self._loop, self._stop, self._thread
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            self.faults.release_hangs()
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        self._thread = None

    def __enter__(self) -> MockInfobloxServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() when it happens before ready
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(self._app, shutdown_timeout=0.5, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port, ssl_context=self._ssl)
            await site.start()
            self._port = int(runner.addresses[0][1])
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
