"""Events told about objects: posted off the caller's thread, never raised.

Events are told, not relied on: the API refuses them in a terminating namespace (403), and
that must never stop a reconcile. `EventRecorder` posts them with a few background threads,
so the worker that decided goes on at once instead of waiting for the API server (as
client-go's event recorder does, https://pkg.go.dev/k8s.io/client-go/tools/record).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Mapping
from typing import Any, Final, Protocol

from kubernetes.client import ApiException

__all__ = ["POSTING_THREADS", "EventPoster", "EventRecorder", "EventSink"]

log = logging.getLogger(__name__)

#: Threads posting Events in the background, by default (each may hold an API connection).
POSTING_THREADS: Final = 4


class EventPoster(Protocol):
    """What posts one Event (`bridge.runtime.gateway.Kube.post_event`)."""

    def post_event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Create an Event about ``obj``; raise ``ApiException`` when refused."""


class EventSink(Protocol):
    """Where reconcilers tell Events (`EventRecorder`, or a test's fake)."""

    def post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Tell an Event of ``type`` (``Normal``/``Warning``) about ``obj``; never raise."""


class EventRecorder:
    """Posts Events through ``poster``; a refused one is logged at DEBUG, never raised.

    Parameters
    ----------
    poster:
        What sends an Event (the gateway).
    background:
        True: Events are posted by up to ``workers`` threads (`close` posts those still
        queued) and any other error is logged. False: each is posted at once in the
        caller's thread and an error other than ``ApiException`` propagates.
    workers:
        Threads posting in the background.
    """

    def __init__(
        self, poster: EventPoster, *, background: bool = True, workers: int = POSTING_THREADS
    ) -> None:
        self._poster = poster
        self._background = background
        self._workers = workers
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Post an Event of ``type`` with ``reason`` and ``message`` about ``obj``."""
        if not self._background:
            self._post(obj, type, reason, message)
            return
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix="ipam-bridge-events"
                )
            pool = self._pool
        try:
            pool.submit(self._post, obj, type, reason, message)
        except RuntimeError:  # shut down: closing
            self._post(obj, type, reason, message)

    def _post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        try:
            self._poster.post_event(obj, type=type, reason=reason, message=message)
        except ApiException as exc:
            log.debug("event %s not posted: %s %s", reason, exc.status, exc.reason)
        except Exception:
            if not self._background:
                raise
            log.exception("event %s not posted", reason)  # nobody else would see it

    def close(self) -> None:
        """Post the Events still queued, then stop the background threads."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
