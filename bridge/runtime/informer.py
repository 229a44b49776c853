"""List, then watch: one resource's informer, in a thread of its own (client-go's reflector).

It lists a scope (a namespace, or all) into its `bridge.runtime.store.Store` (the first list
fills it, a later one replaces the scope), then watches from the list's resourceVersion with
bookmarks, applying each event to the store in the watch's order before handing it to its
`Sink`. A watch the API server ends (its ``timeoutSeconds``) is resumed from the last
resourceVersion seen. Any other end (410 Gone, an error answer, a broken connection, no byte
for `STALL_SECONDS` while a real API server sends a bookmark about once a minute) makes the
scope suspect at once and lists again, after a backoff when it keeps failing: a restarted
watch never tells of the objects deleted meanwhile.

Nothing here knows of CAPI or of IPAM: the caller chooses the objects, their keys and what
an event leads to (`Informer`'s parameters).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import urllib3
from kubernetes.client import ApiException

from bridge.runtime.gateway import Collection, WatchStream
from bridge.runtime.store import Key, Relisted, Scope, Store

__all__ = [
    "BACKOFF_SECONDS",
    "STALL_SECONDS",
    "WATCH_SECONDS",
    "Event",
    "Informer",
    "Listed",
    "Sink",
]

log = logging.getLogger(__name__)

#: Seconds a watch request asks the API server to serve it (``timeoutSeconds``): then it is
#: resumed from the last resourceVersion.
WATCH_SECONDS: Final = 300
#: Seconds without an event or a bookmark after which a watch is dead (a real API server
#: sends a bookmark about every 60 s): the read timeout of the watch's socket.
STALL_SECONDS: Final = 90.0
#: Seconds before each further attempt to list after a failure (the last one repeats).
BACKOFF_SECONDS: Final[tuple[float, ...]] = (0.5, 1.0, 2.0, 5.0, 10.0)
#: What ends a watch without a bug: an error answer, a broken or silent connection, a line
#: that is not JSON (a connection cut mid-line).
BROKEN: Final = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)
#: Seconds a stopping informer waits for its thread.
STOP_SECONDS: Final = 5.0


@dataclass(frozen=True)
class Listed:
    """The first list of an informer's scope, as stored: ``(key, body)`` of each object."""

    items: list[tuple[Key, dict[str, Any]]]


@dataclass(frozen=True)
class Event:
    """One watch event of a wanted object, after the store applied it.

    Attributes
    ----------
    type:
        ``ADDED``, ``MODIFIED`` or ``DELETED``.
    key:
        The object's key in the store.
    body:
        The object as the event shows it (for ``DELETED``: as it was last).
    changed:
        Whether the store changed (False for a version already stored or a DELETED of
        another object; see `Store.apply`).
    """

    type: str
    key: Key
    body: dict[str, Any]
    changed: bool


class Sink(Protocol):
    """What an informer tells, in its own thread (hand work to the event loop yourself)."""

    def listed(self, listed: Listed) -> None:
        """Take the first list of the scope, stored."""

    def relisted(self, relisted: Relisted) -> None:
        """Take what a later list of the scope changed: objects gone, objects changed."""

    def event(self, event: Event) -> None:
        """Take one watch event, applied to the store."""


class _RelistError(Exception):
    """The watch ended in a way that needs a fresh list (410 Gone, an error event)."""


class Informer:
    """The list-then-watch of one resource in one scope, feeding one store part.

    Parameters
    ----------
    name:
        For logs and the thread's name (``ipaddressclaims``, ``ipaddressclaims in ns``...).
    list:
        Lists the scope's objects (`bridge.runtime.gateway.Kube.list_collection`); raises
        on failure.
    watch:
        Opens a watch of the scope from a resourceVersion, with a ``read_timeout`` keyword
        in seconds (`bridge.runtime.gateway.Kube.watch`); raises ``ApiException`` for an
        error answer.
    store:
        The store part this informer feeds.
    key:
        The store key of an object (its body).
    wanted:
        Whether an object belongs in the store (others are ignored: never stored, never
        told); it must depend only on immutable fields.
    sink:
        Told of lists and events (`Sink`).
    scope:
        The keys this informer's list covers (None: every key of the part).
    backoff:
        Seconds before each further attempt after a failure (`BACKOFF_SECONDS`).
    stall:
        Seconds without an event or a bookmark after which the watch is dead
        (`STALL_SECONDS`): given to ``watch`` as its ``read_timeout``.
    """

    def __init__(
        self,
        name: str,
        *,
        list: Callable[[], Collection],
        watch: Callable[..., WatchStream],
        store: Store,
        key: Callable[[Mapping[str, Any]], Key],
        wanted: Callable[[Mapping[str, Any]], bool],
        sink: Sink,
        scope: Scope | None = None,
        backoff: Sequence[float] = BACKOFF_SECONDS,
        stall: float = STALL_SECONDS,
    ) -> None:
        self.name = name
        self._list = list
        self._watch = watch
        self._store = store
        self._key = key
        self._wanted = wanted
        self._sink = sink
        self._scope = scope
        self._backoff = tuple(backoff) or (1.0,)
        self.stall = stall
        #: `time.monotonic` of the last event, bookmark or list that succeeded.
        self._heard = time.monotonic()
        self._stopped = threading.Event()
        self._tried = threading.Event()  # the first list was tried (stored, or failed)
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        #: Lists made (the first one included) and watches opened: for tests and logs.
        self.lists = 0
        self.watches = 0

    # -- control ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the informer's thread (a daemon): it lists, then watches until `stop`."""
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()

    def wait_tried(self, timeout: float | None = None) -> bool:
        """Block until the first list was tried (stored or failed); True if it was.

        A first list that failed is tried again in the background; until one succeeds,
        the store part is not synced and its lookups read the API.
        """
        return self._tried.wait(timeout)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop watching: the open watch is closed at once; wait up to ``timeout`` seconds."""
        self._stopped.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def quiet(self) -> float:
        """Return the seconds since the last event, bookmark or list of this informer.

        Beyond `stall` the watch is dead and being replaced; beyond twice that, not even a
        list gets through.
        """
        return time.monotonic() - self._heard

    @property
    def alive(self) -> bool:
        """True while the informer's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        first = True
        while not self._stopped.is_set():
            try:
                if version is None:
                    try:
                        version = self._list_once(first)
                    finally:
                        self._tried.set()
                    first = False
                version = self._watch_once(version)
                failures = 0
            except _RelistError as exc:
                failures += 1
                log.info("watch of %s must list again: %s", self.name, exc)
                self._store.suspect(self._scope)
                version = None
                if failures > 1:
                    self._pause(failures - 1)
            except Exception as exc:  # the thread outlives anything: list again
                if self._stopped.is_set():
                    break
                failures += 1
                what = "list" if version is None else "watch"
                if isinstance(exc, BROKEN):
                    log.warning(
                        "%s of %s failed (%s): listing again", what, self.name, _describe(exc)
                    )
                else:
                    log.exception("%s of %s failed: listing again", what, self.name)
                if not first:
                    self._store.suspect(self._scope)
                version = None
                self._pause(failures)
        log.debug("informer of %s stopped", self.name)

    def _pause(self, failures: int) -> None:
        self._stopped.wait(self._backoff[min(failures, len(self._backoff)) - 1])

    def _list_once(self, first: bool) -> str:
        """List the scope into the store; return the list's resourceVersion.

        Raises
        ------
        Exception
            Whatever the list raised (the store is left as it was).
        """
        relisting = None if first else self._store.begin_relist()
        self.lists += 1
        try:
            collection = self._list()
            items = [(self._key(body), body) for body in collection.items if self._wanted(body)]
            self._heard = time.monotonic()
        except BaseException:
            if relisting is not None:
                self._store.end_relist(relisting)
            raise
        if first:
            self._store.fill(items, self._scope)
            self._tell(self._sink.listed, Listed(items))
            log.info("%s listed: %d stored", self.name, len(items))
        else:
            result = self._store.replace(items, relisting, scope=self._scope)
            self._tell(self._sink.relisted, result)
            log.info(
                "%s listed again: %d gone, %d changed",
                self.name,
                len(result.gone),
                len(result.changed),
            )
        return collection.resource_version

    def _watch_once(self, version: str) -> str:
        """Watch from ``version`` until the server ends the watch; return the last version.

        Raises
        ------
        _RelistError
            For 410 Gone or an ``ERROR`` event: list again.
        ApiException, urllib3.exceptions.HTTPError, OSError, ValueError
            When the request fails, the connection breaks or a line is not JSON.
        """
        try:
            stream = self._watch(version, read_timeout=self.stall)
        except ApiException as exc:
            if exc.status == 410:
                raise _RelistError("410 Gone") from exc
            raise
        with self._lock:
            self._stream = stream
        self.watches += 1
        try:
            if self._stopped.is_set():
                return version
            for raw in stream:
                kind = str(raw.get("type") or "")
                body = raw.get("object")
                self._heard = time.monotonic()
                if not isinstance(body, dict):
                    continue
                if kind == "ERROR":
                    raise _RelistError(
                        f"{body.get('code')} {body.get('reason')}: {body.get('message')}"
                    )
                version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK" or not self._wanted(body):
                    continue
                key = self._key(body)
                changed = self._store.apply(key, body, deleted=kind == "DELETED")
                self._tell(self._sink.event, Event(kind, key, body, changed))
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        return version

    def _tell(self, call: Callable[[Any], None], what: Any) -> None:
        """Hand ``what`` to the sink; a failing sink is logged, and the watch goes on."""
        try:
            call(what)
        except Exception:  # the informer outlives a bug of its sink
            if not self._stopped.is_set():
                log.exception("the sink of %s failed", self.name)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return type(exc).__name__
