"""List, then watch: one resource's informer, in a thread of its own (client-go's reflector).

It lists a scope (a namespace, or all) into its `bridge.runtime.store.Store` (the first list
fills it, a later one replaces the scope), then watches from the list's resourceVersion with
bookmarks, applying each event to the store in the watch's order before handing it to its
`Sink`. A watch that ends (the API server's ``timeoutSeconds``, a broken connection, an error
answer) is resumed from the last resourceVersion seen, as client-go's reflector does: the
API server replays what happened meanwhile, and the store stays trusted. Only a gap makes
the scope suspect at once and lists it again: 410 Gone (the version is older than the API
server's watch history), or no byte for `STALL_SECONDS` while a real API server sends a
bookmark about once a minute (a dead connection: what it missed is not known). A watch that
ends at once without an event, or cannot be opened, is opened again after a backoff
(`BACKOFF_SECONDS`, client-go's backoff manager), reset by a healthy watch; a list that
fails is tried again after the same backoff.

Nothing here knows of CAPI or of IPAM: the caller chooses the objects, their keys and what
an event leads to (`Informer`'s parameters).
"""

from __future__ import annotations

import json
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
    "SHORT_WATCH_SECONDS",
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
#: Seconds before each further attempt after a failure (a list, a watch that could not be
#: opened or ended at once), the last one repeating: client-go's reflector backoff manager
#: (0.8 s, doubling, capped at 30 s; without its jitter), reset by a healthy watch.
BACKOFF_SECONDS: Final[tuple[float, ...]] = (0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0)
#: A watch that ends within this many seconds without an event or a bookmark ended "at
#: once" (client-go's "very short watch"): the next one waits for the backoff.
SHORT_WATCH_SECONDS: Final = 1.0
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
    """The watch has a gap and needs a fresh list (410 Gone, silent for the stall limit)."""


@dataclass(frozen=True)
class _WatchEnd:
    """How one watch ended: the version to resume from, and whether it was healthy.

    ``healthy``: it brought an event or a bookmark, or lasted `SHORT_WATCH_SECONDS`;
    ``error``: what broke it (None: the API server ended it).
    """

    version: str
    healthy: bool
    error: BaseException | None = None


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
                end = self._watch_once(version)
                if self._stopped.is_set():
                    break
                version = end.version
                failures = 0 if end.healthy else failures + 1
                self._log_end(end, failures)
                if failures:
                    self._pause(failures)
            except _RelistError as exc:
                failures += 1
                log.warning("watch of %s failed (%s): listing again", self.name, exc)
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

    def _log_end(self, end: _WatchEnd, failures: int) -> None:
        """Log a watch that broke, could not be opened or ended at once (then resumed).

        A watch the API server ended after a while is resumed without a word.
        """
        if end.error is None and not failures:
            return
        why = "ended at once without an event" if end.error is None else _describe(end.error)
        if not failures:
            log.info(
                "watch of %s ended (%s): resuming from resourceVersion %s",
                self.name,
                why,
                end.version,
            )
            return
        log.log(
            logging.INFO if end.error is None else logging.WARNING,
            "watch of %s: %s; resuming from resourceVersion %s in %g s",
            self.name,
            why,
            end.version,
            self._delay(failures),
        )

    def _delay(self, failures: int) -> float:
        """Return the backoff in seconds after ``failures`` (>= 1) failures in a row."""
        return self._backoff[min(failures, len(self._backoff)) - 1]

    def _pause(self, failures: int) -> None:
        self._stopped.wait(self._delay(failures))

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

    def _watch_once(self, version: str) -> _WatchEnd:
        """Watch from ``version`` until the watch ends; return how it ended.

        A watch the API server ends, a broken connection, an error answer or an ``ERROR``
        event other than 410 end it with the last version seen, to resume from.

        Raises
        ------
        _RelistError
            For 410 Gone (an answer or an ``ERROR`` event), or no byte for `stall` seconds.
        Exception
            Whatever else was raised (a bug: list again).
        """
        began, heard = time.monotonic(), False
        try:
            stream = self._watch(version, read_timeout=self.stall)
        except _WATCH_BROKEN as exc:
            _raise_gap(exc)
            return _WatchEnd(version, False, exc)
        with self._lock:
            self._stream = stream
        self.watches += 1
        try:
            if self._stopped.is_set():
                return _WatchEnd(version, True)
            for raw in stream:
                heard, body = True, raw.get("object")
                self._heard = time.monotonic()
                if isinstance(body, dict):
                    version = self._handle(str(raw.get("type") or ""), body, version)
        except _WATCH_BROKEN as exc:
            _raise_gap(exc)
            return _WatchEnd(version, heard or self._lasted(began), exc)
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        return _WatchEnd(version, heard or self._lasted(began))

    @staticmethod
    def _lasted(began: float) -> bool:
        """Whether a watch opened at ``began`` lasted `SHORT_WATCH_SECONDS` or more."""
        return time.monotonic() - began >= SHORT_WATCH_SECONDS

    def _handle(self, kind: str, body: dict[str, Any], version: str) -> str:
        """Apply one watch event to the store and tell it; return the version it brings.

        Raises
        ------
        _RelistError
            For an ``ERROR`` event of code 410 (the version is too old).
        _WatchError
            For another ``ERROR`` event: the watch ends, resumed from ``version``.
        """
        if kind == "ERROR":
            message = f"{body.get('code')} {body.get('reason')}: {body.get('message')}"
            if body.get("code") == 410:
                raise _RelistError(message)
            raise _WatchError(message)
        version = str((body.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK" or not self._wanted(body):
            return version
        key = self._key(body)
        changed = self._store.apply(key, body, deleted=kind == "DELETED")
        self._tell(self._sink.event, Event(kind, key, body, changed))
        return version

    def _tell(self, call: Callable[[Any], None], what: Any) -> None:
        """Hand ``what`` to the sink; a failing sink is logged, and the watch goes on."""
        try:
            call(what)
        except Exception:  # the informer outlives a bug of its sink
            if not self._stopped.is_set():
                log.exception("the sink of %s failed", self.name)


class _WatchError(ValueError):
    """An ``ERROR`` event other than 410: the watch ends, and is resumed (a `BROKEN` end)."""


#: What ends a watch that is then resumed (or listed again: `_raise_gap`): `BROKEN`, but
#: of ``ValueError`` only a line that is not JSON and an ``ERROR`` event (another is a bug).
_WATCH_BROKEN: Final = (
    ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
    json.JSONDecodeError,
    _WatchError,
)


def _raise_gap(exc: BaseException) -> None:
    """Raise `_RelistError` when ``exc`` leaves a gap: 410 Gone, or a watch silent too long.

    urllib3's ``ReadTimeoutError`` is the read timeout of the watch's socket, its stall
    limit: nothing came for that long, and what the connection missed is not known.
    """
    if isinstance(exc, ApiException) and exc.status == 410:
        raise _RelistError("410 Gone") from exc
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        raise _RelistError(type(exc).__name__) from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    if isinstance(exc, _WatchError):
        return f"ERROR event {exc}"
    return type(exc).__name__
