"""An informer-style cache of one resource's objects: no API read on the hot path.

Watch events (`ObjectCache.apply`), lists (`ObjectCache.fill`, `ObjectCache.replace`) and
our own writes (`ObjectCache.put`, `ObjectCache.forget`) feed it; reconciles read from it
(`ObjectCache.lookup`), as controller-runtime's cached client does
(https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/cache). Which resources are cached,
and under which keys, is the caller's (`bridge.objects.cache`).

What this relies on, and how each risk is closed:

- **Initial listing.** Absence is only trusted once the part is `ObjectCache.synced` (its
  initial list seen): before that, or when the list failed, a lookup that finds nothing
  answers `MISSING_UNKNOWN` and the caller reads the API.
- **Our own writes.** The result of each of our writes (the object the API server returns)
  is put into the cache at once (`ObjectCache.put`), and a deletion leaves a tombstone
  (`ObjectCache.forget`): the next reconcile of the key sees what we wrote even before the
  watch event comes back.
- **Order.** resourceVersions are opaque: only compared for equality
  (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions). The
  watch tells the order: the event that arrives last is the latest, except for the watch
  echoes of our own writes, already written through: those, and events older than them,
  change nothing (`ObjectCache.put` keeps the written versions until their echo).
  `ObjectCache.apply` says whether an event changed anything, so an echo of our own write
  queues no reconcile. An echo may also come before the write's answer (the informer's
  thread reads it first): then the answer changes nothing, since the watch already told of
  that version and maybe of later ones (each entry remembers the last `HISTORY` versions
  of its object), and `ObjectCache.is_own` tells afterwards that the version was ours.
- **Watch restarts** (API server restart, 410 Gone, connection loss): a watch that lists
  again never tells of objects deleted meanwhile. The caller makes the part suspect
  (`ObjectCache.suspect`: lookups read the API meanwhile) and replaces it with a fresh
  list (`ObjectCache.begin_relist`, `ObjectCache.replace`): objects gone and changed are
  returned (`Relisted`). Tombstones and pending write-throughs are dropped by a relist or
  after `HOLD_SECONDS`: memory stays bounded.

The stored bodies are shared, read-only dicts (``metadata.managedFields`` dropped): callers
never modify them in place. A part made with ``compact`` (claims and IPAddresses: thousands
of them) keeps each body as compact JSON instead, with its resourceVersion and uid beside it,
and decodes it for each reader (a fresh dict each time): a body of ~1 KB of JSON takes
~5 KB as Python dicts and strings. Thread-safe: the event loop writes, worker threads read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

__all__ = [
    "HOLD_SECONDS",
    "MISSING",
    "MISSING_UNKNOWN",
    "TYPED_MAX",
    "Key",
    "ObjectCache",
    "Relisted",
    "Relisting",
    "Scope",
    "newer",
]

log = logging.getLogger(__name__)

#: A cached object's key, chosen by the caller (e.g. ``(namespace, name)``).
Key = Hashable
#: The keys one list covers (a namespace's, say): True for a key the list would hold.
#: None stands for every key (a list of the whole resource).
Scope = Callable[[Key], bool]

#: `ObjectCache.lookup`: the object is absent, and the initial listing was seen.
MISSING: Final = "missing"
#: `ObjectCache.lookup`: not in the cache, but the listing was not seen yet: read the API.
MISSING_UNKNOWN: Final = "unknown"


def _version(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")


def _uid(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("uid") or "")


def newer(candidate: str, current: str) -> bool:
    """Return True when resourceVersion ``candidate`` is another version than ``current``.

    resourceVersions are opaque strings: a client may only compare them for equality
    (Kubernetes API concepts, "Resource versions":
    https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions). Which
    of two versions is the later one is told by the order of the watch, never by the
    strings themselves.
    """
    return candidate != current


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return a plain dict of ``body`` without ``metadata.managedFields`` (never read)."""
    copy = dict(body)
    meta = copy.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        copy["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return copy


class _Stored:
    """One cached object: its resourceVersion and uid, and its body (a dict, or JSON bytes)."""

    __slots__ = ("data", "history", "typed", "uid", "version")

    def __init__(
        self,
        body: Mapping[str, Any],
        compact: bool,
        after: _Stored | None = None,
        *,
        ours: bool = False,
    ) -> None:
        # Typed values of this version by parse function (`ObjectCache.lookup_typed`).
        self.typed: dict[Callable[[dict[str, Any]], Any], Any] | None = None
        trimmed = _trim(body)
        self.version = _version(trimmed)
        self.uid = _uid(trimmed)
        # The versions this key held last, oldest first, this one last: (version, written by
        # us). ``after``: the entry this one replaces (None: no history, as after a list).
        earlier = after.history if after is not None and after.uid == self.uid else ()
        self.history: tuple[tuple[str, bool], ...] = (*earlier, (self.version, ours))[-HISTORY:]
        self.data: dict[str, Any] | bytes = (
            json.dumps(trimmed, separators=(",", ":"), default=str).encode() if compact else trimmed
        )

    def body(self) -> dict[str, Any]:
        """Return the body: the shared dict, or a fresh one decoded from JSON."""
        data = self.data
        if isinstance(data, bytes):
            decoded: dict[str, Any] = json.loads(data)
            return decoded
        return data


#: How many versions of a key an entry remembers (`ObjectCache.put`, `ObjectCache.is_own`):
#: more than the watch events that can come between one write of ours and its answer.
HISTORY: Final = 4

#: How many typed values (`ObjectCache.lookup_typed`) one part keeps at most.
TYPED_MAX: Final = 1024

T = TypeVar("T")

#: Seconds a tombstone (our deletion) or a written-through version waiting for its watch
#: echo is kept at most; a relist (`ObjectCache.replace`) drops them all at once.
HOLD_SECONDS: Final = 300.0


@dataclass(frozen=True)
class Relisted:
    """What a fresh list changed in one `ObjectCache` (`ObjectCache.replace`).

    Attributes
    ----------
    gone:
        ``(key, body as last cached)`` of the objects cached but not listed: deleted while
        the watch did not tell.
    changed:
        ``(key, body as listed)`` of the objects listed and not cached, or cached in
        another resourceVersion.
    """

    gone: list[tuple[Key, dict[str, Any]]]
    changed: list[tuple[Key, dict[str, Any]]]


class Relisting:
    """One relist in flight (`ObjectCache.begin_relist`): the keys events touched since."""

    __slots__ = ("touched",)

    def __init__(self) -> None:
        self.touched: set[Key] = set()


class ObjectCache:
    """The objects of one resource, by key, as last seen in a watch, a list or our write.

    Order: the watch delivers one resource's events in the API server's order, so the
    event that arrives last is the latest, except for our own writes, which are put here
    before their watch echo comes back. Each written-through resourceVersion is kept as
    pending until its echo arrives; while one is pending, watch events are older than what
    we wrote and change nothing. A deletion of ours leaves a tombstone (the object's uid):
    events of that object, except its DELETED, change nothing until then. Both are dropped
    by a relist (`replace`, a snapshot newer than any of them) or after `HOLD_SECONDS`.

    Parameters
    ----------
    resource:
        A name for messages (``ipaddressclaims``...).
    clock:
        Monotonic seconds (for the time bound of tombstones and pending writes).
    trust_absence:
        False: `lookup` never answers `MISSING`, an absent key is read from the API (for
        resources whose absence is rare and may be an object created between the start-up
        list and kopf's first listing, such as a pool created with its claims).
    compact:
        True: keep each body as compact JSON, decoded for each reader (for resources with
        thousands of objects; see the module docstring).
    """

    def __init__(
        self,
        resource: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        trust_absence: bool = True,
        compact: bool = False,
    ) -> None:
        self.resource = resource
        self._trust_absence = trust_absence
        self._compact = compact
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[Key, _Stored] = {}
        # Deleted by us: (uid, when), until the watch's DELETED arrives.
        self._tombstones: dict[Key, tuple[str, float]] = {}
        # Written through by us: (versions in write order, when last written), until echoed.
        self._pending: dict[Key, tuple[list[str], float]] = {}
        # The relists in flight (`begin_relist`), each with the keys an event touched since
        # it began: the event is newer than the list, which leaves them as they are.
        self._relistings: list[Relisting] = []
        self._synced = False
        # The scopes whose first list `fill` waits for before the part is synced (`expect`).
        self._unfilled: set[Scope | None] = set()
        # The scopes made suspect (`suspect`) and not listed afresh since.
        self._suspects: set[Scope | None] = set()
        # The stored objects holding typed values (`lookup_typed`), oldest first: at most
        # TYPED_MAX; a value goes with its object, or when its object leaves this list.
        self._typed: dict[int, _Stored] = {}

    # -- feeding ---------------------------------------------------------------------------

    def apply(self, key: Key, body: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """Apply one watch event (listing, ADDED, MODIFIED or, with ``deleted``, DELETED).

        Returns
        -------
        bool
            True when the cache changed (a new object or another version, or a deletion of
            a known object); False for an echo of our own write, an event older than it,
            an event of an object we deleted, or a version already cached.
        """
        with self._lock:
            for relisting in self._relistings:
                relisting.touched.add(key)
            if deleted:
                self._tombstones.pop(key, None)
                self._pending.pop(key, None)
                gone = self._objects.pop(key, None)
                self._untype(gone)
                return gone is not None
            if self._held(key, body):
                return False
            current = self._objects.get(key)
            if current is not None and not newer(_version(body), current.version):
                return False
            self._untype(current)
            self._objects[key] = _Stored(body, self._compact, current)
            return True

    def _held(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Tell whether a tombstone or a pending write of ours makes this event old (locked)."""
        now = self._clock()
        tomb = self._tombstones.get(key)
        if tomb is not None:
            if tomb[0] == _uid(body) and now - tomb[1] < HOLD_SECONDS:
                return True
            del self._tombstones[key]
        pending = self._pending.get(key)
        if pending is None:
            return False
        versions, when = pending
        version = _version(body)
        if version in versions:
            del versions[: versions.index(version) + 1]
            if not versions:
                del self._pending[key]
            return True  # an echo of ours: what it says is cached already (or later)
        if now - when < HOLD_SECONDS:
            return True  # before our write in the watch's order
        del self._pending[key]
        return False

    def put(self, key: Key, body: Mapping[str, Any] | None) -> None:
        """Write-through: record what the API server returned for our own write (None: nothing).

        Only where the cache is fed (synced, or the object already known from a watch):
        where nothing feeds it, as in unit tests, it holds nothing of its own making.

        A body with ``deletionTimestamp`` and no finalizers is an object the API server has
        just deleted (it goes when its last finalizer does,
        https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/): it is
        dropped, never stored. The watch's DELETED may already have arrived; storing it
        would keep a deleted object in memory for good.
        """
        if body is None:
            return
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # Our last finalizer removal: the object is gone (its DELETED may already have
            # come and gone); keeping it would leak it. A tombstone tells its DELETED, or
            # `deleted_by_us` when the DELETED came first, that the deletion was ours.
            with self._lock:
                self._untype(self._objects.pop(key, None))
                self._pending.pop(key, None)
                self._tombstones[key] = (_uid(body), self._clock())
            return
        version = _version(body)
        with self._lock:
            if not self._synced and key not in self._objects:
                return
            self._tombstones.pop(key, None)
            for relisting in self._relistings:
                relisting.touched.add(key)
            current = self._objects.get(key)
            if current is not None and any(v == version for v, _ in current.history):
                # The watch told of this version first (its echo came before this answer),
                # and maybe of later ones: what is cached is as new or newer. Only remember
                # that the version is ours (`is_own`).
                current.history = tuple((v, ours or v == version) for v, ours in current.history)
                return
            self._untype(current)
            self._objects[key] = _Stored(body, self._compact, current, ours=True)
            if version:
                versions = self._pending.get(key, ([], 0.0))[0]
                self._pending[key] = ([*versions, version], self._clock())

    def forget(self, key: Key) -> None:
        """Write-through of our deletion: drop the object, ignore its events until DELETED."""
        now = self._clock()
        with self._lock:
            for old in [
                k for k, (_, when) in self._tombstones.items() if now - when >= HOLD_SECONDS
            ]:
                del self._tombstones[old]
            self._pending.pop(key, None)
            current = self._objects.pop(key, None)
            self._untype(current)
            if current is not None:
                self._tombstones[key] = (current.uid, now)

    def _untype(self, stored: _Stored | None) -> None:
        """Drop the typed values of ``stored``, replaced or removed (lock held)."""
        if stored is not None and stored.typed is not None:
            self._typed.pop(id(stored), None)
            stored.typed = None

    def mark_synced(self) -> None:
        """Record that the initial listing was seen (absence can be trusted from now)."""
        self._synced = True

    def suspect(self, scope: Scope | None = None) -> None:
        """Stop trusting this part until ``scope`` is listed afresh (`replace`).

        Its watch may lag or have gaps. Every lookup then answers `MISSING_UNKNOWN`, so
        callers read the API: an entry may be stale (an object deleted meanwhile), an
        absence may be wrong. ``scope`` None: until the whole part is listed afresh.
        """
        with self._lock:
            self._suspects.add(scope)

    def expect(self, scopes: Iterable[Scope]) -> None:
        """Wait for a first list (`fill`) of each of ``scopes`` before the part is synced.

        For a part filled by several lists (one per namespace): absence is trusted only
        once every one of them has come.
        """
        with self._lock:
            self._unfilled = set(scopes)

    def fill(
        self, items: Iterable[tuple[Key, Mapping[str, Any]]], scope: Scope | None = None
    ) -> int:
        """Apply a first list's objects (as events, in order); mark synced.

        ``scope``: the keys the list covers; while another scope given to `expect` has not
        been filled, the part is not marked synced yet.

        Returns
        -------
        int
            How many objects the listing held.
        """
        count = 0
        for key, body in items:
            self.apply(key, body)
            count += 1
        with self._lock:
            self._unfilled.discard(scope)
            if not self._unfilled:
                self._synced = True
        return count

    def begin_relist(self) -> Relisting:
        """Start recording the keys events touch: call right before the list request.

        Returns the relist's record, for `replace` (or `end_relist` when the list failed):
        `replace` leaves those keys as the events left them (they are newer than the list).
        Several relists (of different scopes) may be in flight at once.
        """
        relisting = Relisting()
        with self._lock:
            self._relistings.append(relisting)
        return relisting

    def end_relist(self, relisting: Relisting) -> None:
        """Stop recording touched keys for ``relisting`` without a `replace` (the list failed)."""
        with self._lock:
            if relisting in self._relistings:
                self._relistings.remove(relisting)

    def replace(
        self,
        items: Iterable[tuple[Key, Mapping[str, Any]]],
        relisting: Relisting | None = None,
        *,
        scope: Scope | None = None,
    ) -> Relisted:
        """Make the cache what a fresh list says; mark synced.

        The list replaces every entry of ``scope`` (None: every entry) except those an
        event touched since ``relisting`` began (`begin_relist`; None: no event is newer
        than the list); tombstones and pending write-throughs in ``scope`` are dropped (the
        list is newer than them), and ``scope`` is no longer suspect (`suspect`: another
        scope's suspicion stays, such as that of a watch still broken, even if it covers the
        same keys).

        Returns
        -------
        Relisted
            The objects gone (cached in ``scope``, not listed) and changed (new or another
            version).
        """
        listed = {key: _Stored(body, self._compact) for key, body in items}
        gone: list[tuple[Key, _Stored]] = []
        changed: list[tuple[Key, _Stored]] = []

        def within(key: Key) -> bool:
            return scope is None or scope(key)

        with self._lock:
            touched: set[Key] = set()
            if relisting is not None:
                touched = relisting.touched
                if relisting in self._relistings:
                    self._relistings.remove(relisting)
            for typed in self._typed.values():
                typed.typed = None
            self._typed.clear()
            for key in [
                k for k in self._objects if k not in listed and k not in touched and within(k)
            ]:
                gone.append((key, self._objects.pop(key)))
            for key, stored in listed.items():
                if key in touched:
                    continue
                current = self._objects.get(key)
                if current is None or newer(stored.version, current.version):
                    self._objects[key] = stored
                    changed.append((key, stored))
            for held in (self._tombstones, self._pending):
                for key in [k for k in held if within(k)]:
                    del held[key]
            self._synced = True
            self._suspects.discard(scope)
        return Relisted(
            [(key, stored.body()) for key, stored in gone],
            [(key, stored.body()) for key, stored in changed],
        )

    # -- reading ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once a listing was seen."""
        return self._synced

    @property
    def suspected(self) -> bool:
        """True between `suspect` and the `replace` of its scope (lookups read the API)."""
        return bool(self._suspects)

    def get(self, key: Key) -> dict[str, Any] | None:
        """Return the cached object (shared, or decoded afresh when compact: never modify it)."""
        with self._lock:
            found = self._objects.get(key)
        return None if found is None else found.body()

    def deleted_by_us(self, key: Key) -> bool:
        """Tell whether our own write deleted the object (`put` of its last finalizer removal).

        For the DELETED that the watch delivered before that write's answer reached `put`:
        `apply` saw news then. Answers once (the record goes with the answer True); the
        record also goes with the DELETED coming after the answer, a relist, or after
        `HOLD_SECONDS`.
        """
        with self._lock:
            return self._tombstones.pop(key, None) is not None and key not in self._objects

    def is_own(self, key: Key, version: str) -> bool:
        """Tell whether ``version`` of the cached object was written by us (`put`).

        For the echo of our own write that the watch delivered before the write's answer
        reached `put`: `apply` saw news then, and a reconcile queued for it may be
        dropped once this answers True (`bridge.runtime.workqueue.WorkQueue.add`).
        Remembers the last `HISTORY` versions of each cached object.
        """
        with self._lock:
            current = self._objects.get(key)
            return current is not None and (version, True) in current.history

    def __contains__(self, key: Key) -> bool:
        """Tell whether an object is cached under ``key`` (nothing decoded)."""
        with self._lock:
            return key in self._objects

    def lookup(self, key: Key) -> dict[str, Any] | str:
        """Return the cached object, or `MISSING` (absent, trusted) or `MISSING_UNKNOWN`.

        `MISSING_UNKNOWN` (read the API) before the first listing, and for every key while
        the part is suspect (`suspect`).
        """
        if self._suspects:
            return MISSING_UNKNOWN
        with self._lock:
            found = self._objects.get(key)
        if found is not None:
            return found.body()
        return MISSING if self._synced and self._trust_absence else MISSING_UNKNOWN

    def lookup_typed(self, key: Key, parse: Callable[[dict[str, Any]], T]) -> T | str:
        """Return ``parse`` of the cached object, or `MISSING` / `MISSING_UNKNOWN` as `lookup`.

        ``parse`` turns a body into an immutable value (a frozen model): its result is kept
        for the object's current cached version and returned again, without decoding or
        parsing, until that version is replaced, forgotten or listed anew. At most
        `TYPED_MAX` values are kept per part (the oldest made go first). The value is shared
        between callers: never modify it. ``parse``'s errors propagate (nothing is kept).
        """
        if self._suspects:
            return MISSING_UNKNOWN
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                return MISSING if self._synced and self._trust_absence else MISSING_UNKNOWN
            typed = found.typed
            if typed is not None and parse in typed:
                kept: T = typed[parse]
                return kept
        value = parse(found.body())
        with self._lock:
            if self._objects.get(key) is not found:
                return value  # replaced or removed meanwhile: nothing to keep it for
            if found.typed is None:
                if len(self._typed) >= TYPED_MAX:
                    self._typed.pop(next(iter(self._typed))).typed = None
                self._typed[id(found)] = found
                found.typed = {}
            found.typed[parse] = value
        return value

    def values(self) -> Iterator[dict[str, Any]]:
        """Iterate over a snapshot of the cached objects."""
        with self._lock:
            snapshot = list(self._objects.values())
        return (stored.body() for stored in snapshot)

    def __len__(self) -> int:
        """Return how many objects are cached."""
        with self._lock:
            return len(self._objects)

    def held(self) -> int:
        """Return how many tombstones and pending write-throughs are kept (bounded memory)."""
        with self._lock:
            return len(self._tombstones) + len(self._pending)
