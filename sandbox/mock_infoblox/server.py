"""Run the mock WAPI on 127.0.0.1 in a background thread with its own event loop (for tests)."""

from __future__ import annotations

import ssl

from aiohttp import web

from mock_infoblox.app import create_app, faults_of
from mock_infoblox.store import InfobloxStore
from mock_phpipam.faults import FaultInjector
from mock_phpipam.runner import AppServer

__all__ = ["MockInfobloxServer"]


class MockInfobloxServer(AppServer):
    """The mock WAPI server, started on an ephemeral port in a daemon thread.

    Parameters
    ----------
    store:
        The grid state; a new empty `InfobloxStore` when None.
    faults:
        Fault injection; an inactive injector when None (see `mock_infoblox.app.create_app`).
    host, port, ssl_context:
        Where and how to serve (see `mock_phpipam.runner.AppServer`).

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
        super().__init__(host=host, port=port, ssl_context=ssl_context, name="mock Infoblox")
        self.store = store if store is not None else InfobloxStore()
        self._app = create_app(self.store, faults)
        self.faults: FaultInjector = faults_of(self._app)

    def make_app(self) -> web.Application:
        """Return the WAPI application on `store` (built once: it holds the fault injector)."""
        return self._app

    def before_stop(self) -> None:
        """Let hung requests go, so that stopping does not wait for them."""
        self.faults.release_hangs()

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:41234`` (append ``/wapi/v2.12/...``)."""
        return self.base_url
