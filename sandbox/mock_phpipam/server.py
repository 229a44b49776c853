"""Run the mock in a background thread with its own event loop (tests, ``ipam-bridge demo``)."""

from __future__ import annotations

import ssl

from aiohttp import web

from mock_phpipam.app import create_app, phpipam_faults
from mock_phpipam.faults import FaultInjector
from mock_phpipam.runner import AppServer
from mock_phpipam.store import Store

__all__ = ["MockPhpipamServer"]


class MockPhpipamServer(AppServer):
    """A running mock phpIPAM on ``host:port`` (port 0 = an ephemeral port).

    Parameters
    ----------
    store:
        The state to serve (default: an empty `Store`); tests keep a reference to inspect it.
    faults:
        Fault injection (default: an inactive `phpipam_faults` injector).
    host, port, ssl_context, shutdown_timeout:
        Where and how to serve (see `mock_phpipam.runner.AppServer`).

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
        super().__init__(
            host=host,
            port=port,
            ssl_context=ssl_context,
            shutdown_timeout=shutdown_timeout,
            name="mock phpIPAM",
        )
        self.store = store if store is not None else Store()
        self.faults = faults if faults is not None else phpipam_faults()

    def make_app(self) -> web.Application:
        """Return the phpIPAM API application on `store` with `faults`."""
        return create_app(self.store, self.faults)

    def before_stop(self) -> None:
        """Let hung requests go, so that stopping does not wait for them."""
        self.faults.release_hangs()

    @property
    def url(self) -> str:
        """The API base URL a pool's ``spec.endpoint`` takes: ``<base_url>/api``."""
        return f"{self.base_url}/api"

    def app_url(self, app_id: str) -> str:
        """Return ``<url>/<app_id>`` (requests go to ``<app_url>/<controller>/...``)."""
        return f"{self.url}/{app_id}"
