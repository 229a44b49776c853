"""The ``ApiClient`` every Kubernetes request goes through, and its connection pool.

`OperatorApiClient` (the official client's ``ApiClient`` with a timeout on each request, a
fence before each write, each write's whole timeout cut to the Lease's time left and one
attempt per request: no urllib3 retry) and
`api_client`, which makes one from the kubeconfig or the in-cluster configuration with a
connection pool sized for the threads that call at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client import (
    ApiClient,
)

from bridge.runtime.kubeconfig import load_configuration

__all__ = ["WRITE_METHODS", "OperatorApiClient", "api_client"]


#: HTTP methods that change something on the API server (checked by the fence).
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _is_event(url: str) -> bool:
    """Return True for a request on Events (``core/v1`` or ``events.k8s.io``)."""
    path = url.split("?", 1)[0]
    return path.endswith("/events") or "/events/" in path or "/events.k8s.io/" in path


class OperatorApiClient(ApiClient):
    """An ``ApiClient`` whose every request has a timeout and whose writes pass a fence.

    The kubernetes client sends a request without any timeout unless each call passes
    ``_request_timeout`` (a documented per-call parameter of every API method): a connection
    that died silently then hangs its worker for ever. ``ApiClient.call_api`` is the public
    method every API method's request goes through, so this subclass supplies the default
    there; a call's own ``_request_timeout`` wins.

    Before each POST, PUT, PATCH and DELETE other than an Event, ``fence`` is called in the
    calling thread (`bridge.runtime.fence.Fence.check`): it raises when this replica may not write,
    and the request is not sent. Such a write is then sent with one total timeout (urllib3's
    ``Timeout(total=...)``, which the kubernetes client makes of a single number: connecting
    and each wait for bytes end by it) of its read timeout cut by ``write_timeout``
    (`bridge.runtime.fence.Fence.bound`: to the time the Lease stays valid), so the replica
    stops waiting on a write before its fence closes. Events are notes, not state, and the
    Event saying that a replica stopped leading is posted after its fence closed.

    Requests are sent once: the configuration's ``retries`` is set to False (urllib3 makes
    no further attempt, each of which would get the whole timeout again, so that a write
    could still go out after the Lease ran out). As client-go's REST client, which retries
    no write on a broken connection, whoever asked tries again: the work queue with its
    backoff, the informer, the election every retry period.

    Parameters
    ----------
    configuration:
        The client configuration (`load_configuration`); its ``retries`` is set to False.
    timeout:
        ``(connect, read)`` timeout of each request in seconds (urllib3's meaning: the read
        timeout bounds each wait for bytes, not the whole answer); None: the client's
        default (no timeout).
    fence:
        Raises before a write that must not be sent; None: every write is sent.
    write_timeout:
        Takes a write's timeout in seconds (``math.inf``: none) and returns it cut to the
        Lease's time left, or raises to refuse the write; None: writes keep ``timeout``.
    """

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        timeout: tuple[float, float] | None = None,
        fence: Callable[[], None] | None = None,
        write_timeout: Callable[[float], float] | None = None,
    ) -> None:
        configuration.retries = False
        super().__init__(configuration)
        self.timeout = timeout
        self.fence = fence
        self.write_timeout = write_timeout

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        """``ApiClient.call_api`` with the default timeout and the fence (see the class).

        Raises
        ------
        bridge.runtime.fence.LeadershipLostError
            From ``fence``, for a write this replica may not send.
        kubernetes.client.ApiException, urllib3.exceptions.HTTPError
            As ``ApiClient.call_api`` (a timeout is urllib3's ``TimeoutError``).
        """
        timeout = self.timeout if _request_timeout is None else _request_timeout
        if method.upper() in WRITE_METHODS and not _is_event(url):
            if self.fence is not None:
                self.fence()
            if self.write_timeout is not None:
                timeout = self.write_timeout(_whole(timeout))
        return super().call_api(
            method,
            url,
            header_params=header_params,
            body=body,
            post_params=post_params,
            _request_timeout=timeout,
        )


def _whole(timeout: Any) -> float:
    """Return the seconds a write may take in all under ``_request_timeout`` ``timeout``.

    A number is already a total (the kubernetes client's ``rest`` module makes it
    ``urllib3.Timeout(total=...)``); a ``(connect, read)`` pair gives its read timeout (the
    longer wait, for an answer); None gives ``math.inf``.
    """
    if isinstance(timeout, int | float):
        return float(timeout)
    if isinstance(timeout, tuple) and len(timeout) == 2:
        return float(max(timeout))
    return math.inf


def api_client(
    configuration: kubernetes.client.Configuration | None = None,
    *,
    pool_size: int = 10,
    timeout: tuple[float, float] | None = None,
    fence: Callable[[], None] | None = None,
    write_timeout: Callable[[float], float] | None = None,
) -> OperatorApiClient:
    """Return an `OperatorApiClient` on ``configuration`` (default: `load_configuration()`).

    Loading the configuration may read files and run a kubeconfig's exec plugin: call this
    off the event loop.

    Parameters
    ----------
    pool_size:
        HTTP connections kept per host (one per concurrent worker thread).
    timeout:
        ``(connect, read)`` seconds of every request (``Settings.kube_timeout``); None: none.
    fence:
        Called before every write but Events; raises to refuse it (`fence.Fence.check`).
    write_timeout:
        Cuts the timeout of every write but Events (`fence.Fence.bound`); see
        `OperatorApiClient`.
    """
    configuration = configuration or load_configuration()
    configuration.connection_pool_maxsize = max(pool_size, 4)
    return OperatorApiClient(
        configuration, timeout=timeout, fence=fence, write_timeout=write_timeout
    )
