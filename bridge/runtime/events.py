"""Events told about objects: correlated as client-go does, posted off the caller's thread.

Events are told, not relied on: the API refuses them in a terminating namespace (403), and
that must never stop a reconcile. `EventRecorder` posts them with a few background threads,
so the worker that decided goes on at once instead of waiting for the API server (as
client-go's event recorder does, https://pkg.go.dev/k8s.io/client-go/tools/record).

Before posting, each Event passes an `EventCorrelator`, with the rules and defaults of
client-go's ``EventCorrelator`` (``tools/record/events_cache.go``, ``NewEventCorrelator``):

- **aggregation**: events about one object with one type and reason whose messages differ
  are "similar"; once 10 distinct messages were seen with less than 10 minutes between
  one and the next, each further one is told as a single Event whose message is
  ``(combined from similar events): <message>``;
- **counting**: an Event equal to one told before (object, type, reason, message; or the
  aggregate) PATCHes that Event's ``count``, ``lastTimestamp`` and ``message`` instead of
  creating another;
- **spam filter**: a token bucket per object (burst 25, one token every 5 minutes); an
  Event without a token is dropped.

Each of the three keeps at most 4096 keys (least recently used dropped first), so memory
stays bounded whatever the number of objects.

Posted in the background, at most `MAX_QUEUED_EVENTS` Events wait or are being sent at once;
a further one is dropped and counted (`EventRecorder.dropped`, the hook ``on_drop``): as
client-go's broadcaster, whose queue holds ``maxQueuedEvents`` (1,000) and drops the rest
(``watch.NewLongQueueBroadcaster`` with ``DropIfChannelFull``), so an API server that
answers slowly costs bounded memory, never a worker.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from kubernetes.client import ApiException

from bridge.runtime.fence import LeadershipLostError

__all__ = [
    "AGGREGATE_INTERVAL_SECONDS",
    "AGGREGATE_MAX_EVENTS",
    "CACHE_ENTRIES",
    "COMBINED_PREFIX",
    "MAX_QUEUED_EVENTS",
    "POSTING_THREADS",
    "SPAM_BURST",
    "SPAM_REFILL_SECONDS",
    "EventCorrelator",
    "EventPoster",
    "EventRecorder",
    "EventSink",
    "Posting",
]

log = logging.getLogger(__name__)

#: Threads posting Events in the background, by default (each may hold an API connection).
POSTING_THREADS: Final = 4
#: Events waiting to be posted, or being posted, at most (client-go's ``maxQueuedEvents``).
MAX_QUEUED_EVENTS: Final = 1000
#: Why an Event was dropped (the ``reason`` label of ``ipam_bridge_events_dropped_total``):
#: the posting queue was full, or the object's spam bucket was empty.
DROPPED_QUEUE_FULL: Final = "queue_full"
DROPPED_SPAM_FILTER: Final = "spam_filter"
#: Keys kept by each of the correlator's caches (client-go's ``maxLruCacheEntries``).
CACHE_ENTRIES: Final = 4096
#: Distinct messages of similar events before they are combined (``defaultAggregateMaxEvents``).
AGGREGATE_MAX_EVENTS: Final = 10
#: Longest gap between similar events that still counts them together (seconds).
AGGREGATE_INTERVAL_SECONDS: Final = 600.0
#: The message prefix of a combined Event (``EventAggregatorByReasonMessageFunc``).
COMBINED_PREFIX: Final = "(combined from similar events): "
#: Events one object may have at once (``defaultSpamBurst``).
SPAM_BURST: Final = 25
#: Seconds per new token of an object's bucket (``defaultSpamQPS`` = 1/300).
SPAM_REFILL_SECONDS: Final = 300.0
#: The Event's ``source.component`` and ``reportingComponent``.
COMPONENT: Final = "ipam-bridge"
#: Longest message of an Event (the API server refuses longer ones).
MESSAGE_MAX_CHARS: Final = 1024

K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A mapping that keeps its ``size`` most recently used keys (not thread-safe)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Similar:
    """Distinct messages of similar events and when the last one was seen."""

    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass
class _Told:
    """An Event told before: its name, count and first timestamp."""

    name: str
    count: int
    first: str


@dataclass
class _Bucket:
    """A token bucket: tokens left at ``at`` (seconds)."""

    tokens: float
    at: float


@dataclass(frozen=True)
class Posting:
    """What to send for one Event: create it, or patch the one told before.

    Attributes
    ----------
    namespace:
        Where the Event lives (the object's namespace; ``default`` for a cluster-scoped one).
    event:
        The whole ``core/v1`` Event as JSON (name, count, timestamps...): created as is,
        or when the patched Event is gone (404).
    patch:
        None: create ``event``. Else a JSON merge patch of ``count``, ``lastTimestamp`` and
        ``message`` of the Event named ``event["metadata"]["name"]``.
    """

    namespace: str
    event: dict[str, Any]
    patch: dict[str, Any] | None = None


def _timestamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class EventCorrelator:
    """Aggregates, counts and rate-limits Events as client-go's ``EventCorrelator``.

    See the module for the rules (``k8s.io/client-go/tools/record/events_cache.go``:
    ``EventAggregator.EventAggregate``, ``eventLogger.eventObserve``,
    ``EventSourceObjectSpamFilter.Filter``, in that order). Thread-safe.

    Parameters
    ----------
    clock:
        Wall-clock time in seconds (``time.time``; tests pass a fake): the timestamps and
        the intervals.
    entries:
        Keys kept by each cache (least recently used dropped first).
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.time, entries: int = CACHE_ENTRIES
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._similar: _Lru[tuple[str, ...], _Similar] = _Lru(entries)
        self._told: _Lru[tuple[str, ...], _Told] = _Lru(entries)
        self._buckets: _Lru[tuple[str, ...], _Bucket] = _Lru(entries)

    def correlate(
        self, obj: Mapping[str, Any], type: str, reason: str, message: str
    ) -> Posting | None:
        """Return what to send for an Event of ``type``/``reason``/``message`` about ``obj``.

        Returns
        -------
        Posting or None
            None when the object's spam bucket is empty (the Event is dropped).
        """
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or None,
            "uid": meta.get("uid"),
        }
        fields = ("kind", "namespace", "name", "uid", "apiVersion")
        subject = tuple(str(involved[k] or "") for k in fields)
        message = message[:MESSAGE_MAX_CHARS]
        with self._lock:
            now = self._clock()
            message, key = self._aggregate((*subject, type, reason), message, now)
            told = self._told.get(key)
            stamp = _timestamp(now)
            if told is None:
                told = _Told(f"{involved['name']}.{time.time_ns():x}", 1, stamp)
            else:
                told = _Told(told.name, told.count + 1, told.first)
            self._told.put(key, told)
            if not self._take(subject, now):
                return None
        namespace = str(involved["namespace"] or "default")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": told.name, "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v},
            "type": type,
            "reason": reason,
            "message": message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": told.first,
            "lastTimestamp": stamp,
            "count": told.count,
        }
        patch = None
        if told.count > 1:
            patch = {"count": told.count, "lastTimestamp": stamp, "message": message}
        return Posting(namespace, event, patch)

    def _aggregate(
        self, group: tuple[str, ...], message: str, now: float
    ) -> tuple[str, tuple[str, ...]]:
        """Return the message to tell and the key it is counted under (aggregation)."""
        similar = self._similar.get(group)
        if similar is None or now - similar.last > AGGREGATE_INTERVAL_SECONDS:
            similar = _Similar()
        similar.messages.add(message)
        similar.last = now
        self._similar.put(group, similar)
        if len(similar.messages) < AGGREGATE_MAX_EVENTS:
            return message, (*group, message)
        similar.messages.pop()  # do not grow the set beyond the limit
        return (COMBINED_PREFIX + message)[:MESSAGE_MAX_CHARS], group

    def _take(self, subject: tuple[str, ...], now: float) -> bool:
        """Take a token of ``subject``'s bucket; False when it has none."""
        bucket = self._buckets.get(subject)
        if bucket is None:
            bucket = _Bucket(float(SPAM_BURST), now)
        tokens = min(float(SPAM_BURST), bucket.tokens + (now - bucket.at) / SPAM_REFILL_SECONDS)
        taken = tokens >= 1.0
        self._buckets.put(subject, _Bucket(tokens - 1.0 if taken else tokens, now))
        return taken

    def sizes(self) -> tuple[int, int, int]:
        """Return the keys held by the aggregation, counting and spam caches."""
        with self._lock:
            return len(self._similar), len(self._told), len(self._buckets)


class EventPoster(Protocol):
    """What sends Events (`bridge.runtime.gateway.Kube`)."""

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create the ``core/v1`` Event ``event``; raise ``ApiException`` when refused."""

    def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the Event ``name``; raise ``ApiException`` (404: it is gone)."""


class EventSink(Protocol):
    """Where reconcilers tell Events (`EventRecorder`, or a test's fake)."""

    def post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Tell an Event of ``type`` (``Normal``/``Warning``) about ``obj``; never raise."""


class EventRecorder:
    """Posts Events through ``poster`` after an `EventCorrelator`; never raises a refusal.

    A refused Event is logged at DEBUG. A patch of an Event that is gone (404: it expired,
    by default after an hour) creates it again; a create of a name that exists (409: a
    later patch of the same Event, sent by another posting thread, got there first) is
    dropped, as that Event tells it already. An Event the spam filter or a full queue
    drops is counted (`dropped`) and told to ``on_drop``.

    Parameters
    ----------
    poster:
        What sends an Event (the gateway).
    background:
        True: Events are posted by up to `POSTING_THREADS` threads, at most ``max_queued``
        waiting or being posted at once (`close` posts those still queued), and any other
        error is logged. False: each is posted at once in the caller's thread and an
        error other than ``ApiException`` propagates.
    correlator:
        The correlator (a fresh one by default).
    on_drop:
        Called with `DROPPED_QUEUE_FULL` or `DROPPED_SPAM_FILTER` for each Event dropped
        (``bridge.metrics.Metrics.event_dropped``); quick, any thread.
    max_queued:
        How many Events may wait or be posted at once (`MAX_QUEUED_EVENTS`).
    """

    def __init__(
        self,
        poster: EventPoster,
        *,
        background: bool = True,
        correlator: EventCorrelator | None = None,
        on_drop: Callable[[str], None] | None = None,
        max_queued: int = MAX_QUEUED_EVENTS,
    ) -> None:
        self._poster = poster
        self._background = background
        self.correlator = correlator or EventCorrelator()
        self._on_drop = on_drop
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._queued = 0  # submitted to the pool, not yet sent
        self._dropped: dict[str, int] = {}

    @property
    def dropped(self) -> dict[str, int]:
        """Return how many Events were dropped so far, by why (`DROPPED_QUEUE_FULL`...)."""
        with self._lock:
            return dict(self._dropped)

    @property
    def queued(self) -> int:
        """Return how many Events wait to be posted or are being posted now."""
        with self._lock:
            return self._queued

    def _drop(self, why: str) -> None:
        with self._lock:
            self._dropped[why] = self._dropped.get(why, 0) + 1
        if self._on_drop is not None:
            self._on_drop(why)

    def post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """Tell an Event of ``type`` with ``reason`` and ``message`` about ``obj``."""
        posting = self.correlator.correlate(obj, type, reason, message)
        if posting is None:
            log.debug("event %s dropped: too many Events about the object", reason)
            self._drop(DROPPED_SPAM_FILTER)
            return
        if not self._background:
            self._send(posting)
            return
        with self._lock:
            full = self._queued >= self._max_queued
            if not full:
                self._queued += 1
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=POSTING_THREADS, thread_name_prefix="ipam-bridge-events"
                    )
            pool = self._pool
        if full:
            log.debug("event %s dropped: %d Events queued already", reason, self._max_queued)
            self._drop(DROPPED_QUEUE_FULL)
            return
        try:
            if pool is None:
                raise RuntimeError("closed")
            pool.submit(self._send_queued, posting)
        except RuntimeError:  # shut down: closing
            self._send_queued(posting)

    def _send_queued(self, posting: Posting) -> None:
        """Send a posting that was counted as queued; it no longer counts afterwards."""
        try:
            self._send(posting)
        finally:
            with self._lock:
                self._queued -= 1

    def _send(self, posting: Posting) -> None:
        reason = posting.event["reason"]
        try:
            self._deliver(posting)
        except ApiException as exc:
            log.debug("event %s not posted: %s %s", reason, exc.status, exc.reason)
        except LeadershipLostError as exc:  # stopping, or the Lease was lost
            if not self._background:
                raise
            log.debug("event %s not posted: %s", reason, exc)
        except Exception:
            if not self._background:
                raise
            log.exception("event %s not posted", reason)  # nobody else would see it

    def _deliver(self, posting: Posting) -> None:
        """Patch the Event told before (create it when gone), or create a new one."""
        if posting.patch is not None:
            name = posting.event["metadata"]["name"]
            try:
                self._poster.patch_event(posting.namespace, name, posting.patch)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
        try:
            self._poster.create_event(posting.namespace, posting.event)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def close(self) -> None:
        """Post the Events still queued, then stop the background threads."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
