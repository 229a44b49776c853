"""A store: one resource's objects by key, as its watch last told (client-go's Store).

Only an informer feeds it (`bridge.runtime.informer`), in the watch's order; reconciles
read it (`Store.lookup`), as controller-runtime's cached client does. Our own writes never
go in: the watch brings them back like anyone else's (what a reconcile may do meanwhile is
`bridge.runtime.expectations`). resourceVersions are opaque, only compared for equality.
Absence is trusted once the initial list was seen, and not while a relist is due
(`Store.suspect`, `Store.replace`).

The stored bodies are shared, read-only dicts without ``metadata.managedFields``; a
``compact`` store (claims, IPAddresses: thousands) keeps compact JSON instead, decoded for
each reader (~1 KB of JSON takes ~5 KB as dicts). Thread-safe: the informers' threads write,
worker threads read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

__all__ = [
    "MISSING",
    "MISSING_UNKNOWN",
    "TYPED_MAX",
    "Key",
    "Relisted",
    "Relisting",
    "Scope",
    "Store",
    "version_of",
]

#: A stored object's key, chosen by the caller (e.g. ``(namespace, name)``).
Key = Hashable
#: The keys one list covers (a namespace's, say): True for a key the list would hold.
#: None stands for every key (a list of the whole resource).
Scope = Callable[[Key], bool]

#: `Store.lookup`: the object is absent, and the initial listing was seen.
MISSING: Final = "missing"
#: `Store.lookup`: not in the store, but the listing was not seen yet: read the API.
MISSING_UNKNOWN: Final = "unknown"

#: How many typed values (`Store.lookup_typed`) one part keeps at most.
TYPED_MAX: Final = 1024

T = TypeVar("T")


def version_of(body: Mapping[str, Any] | None) -> str:
    """Return ``metadata.resourceVersion`` of an object (``""`` when absent)."""
    return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")


def _uid(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("uid") or "")


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return a plain dict of ``body`` without ``metadata.managedFields`` (never read)."""
    copy = dict(body)
    meta = copy.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        copy["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return copy


class _Stored:
    """One stored object: its resourceVersion and uid, and its body (a dict, or JSON bytes)."""

    __slots__ = ("data", "typed", "uid", "version")

    def __init__(self, body: Mapping[str, Any], compact: bool) -> None:
        # Typed values of this version by parse function (`Store.lookup_typed`).
        self.typed: dict[Callable[[dict[str, Any]], Any], Any] | None = None
        trimmed = _trim(body)
        self.version = version_of(trimmed)
        self.uid = _uid(trimmed)
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


@dataclass(frozen=True)
class Relisted:
    """What a fresh list changed in one `Store` (`Store.replace`).

    Attributes
    ----------
    gone:
        ``(key, body as last stored)`` of the objects stored but not listed: deleted while
        the watch did not tell.
    changed:
        ``(key, body as listed)`` of the objects listed and not stored, or stored in
        another resourceVersion.
    """

    gone: list[tuple[Key, dict[str, Any]]]
    changed: list[tuple[Key, dict[str, Any]]]


class Relisting:
    """One relist in flight (`Store.begin_relist`): the keys events touched since."""

    __slots__ = ("touched",)

    def __init__(self) -> None:
        self.touched: set[Key] = set()


class Store:
    """The objects of one resource, by key, as last told by their watch or list.

    Parameters
    ----------
    resource:
        A name for messages (``ipaddressclaims``...).
    trust_absence:
        False: `lookup` never answers `MISSING`, an absent key is read from the API (for
        resources whose absence is rare, such as pools and Clusters).
    compact:
        True: keep each body as compact JSON, decoded for each reader (for resources with
        thousands of objects; see the module docstring).
    """

    def __init__(self, resource: str, *, trust_absence: bool = True, compact: bool = False) -> None:
        self.resource = resource
        self._trust_absence = trust_absence
        self._compact = compact
        self._lock = threading.Lock()
        self._objects: dict[Key, _Stored] = {}
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

    # -- feeding (the informer) -------------------------------------------------------------

    def apply(self, key: Key, body: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """Apply one watch event (ADDED, MODIFIED or, with ``deleted``, DELETED).

        A DELETED removes the stored object only when its uid is the event's (a DELETED of
        an older object of the same name leaves the one stored now).

        Returns
        -------
        bool
            True when the store changed (a new object or another version, or a deletion of
            the stored object); False for a version already stored or a DELETED of another
            object.
        """
        with self._lock:
            for relisting in self._relistings:
                relisting.touched.add(key)
            current = self._objects.get(key)
            if deleted:
                if current is None or current.uid != _uid(body):
                    return False
                self._untype(self._objects.pop(key))
                return True
            if current is not None and current.version == version_of(body):
                return False
            self._untype(current)
            self._objects[key] = _Stored(body, self._compact)
            return True

    def _untype(self, stored: _Stored | None) -> None:
        """Drop the typed values of ``stored``, replaced or removed (lock held)."""
        if stored is not None and stored.typed is not None:
            self._typed.pop(id(stored), None)
            stored.typed = None

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
        been listed (`fill` or `replace`), the part is not marked synced yet.

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
            self._listed(scope)
        return count

    def _listed(self, scope: Scope | None) -> None:
        """Record that ``scope`` was listed; mark synced once every expected one was (lock held).

        client-go's ``HasSynced`` is true only after the initial list of every informer: a
        part filled by one list per namespace is synced once each of them has come.
        """
        self._unfilled.discard(scope)
        if not self._unfilled:
            self._synced = True

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
        """Make the store what a fresh list says; mark synced once every scope was listed.

        The list replaces every entry of ``scope`` (None: every entry) except those an
        event touched since ``relisting`` began (`begin_relist`; None: no event is newer
        than the list), and ``scope`` is no longer suspect (`suspect`: another scope's
        suspicion stays, such as that of a watch still broken, even if it covers the same
        keys).

        Returns
        -------
        Relisted
            The objects gone (stored in ``scope``, not listed) and changed (new or another
            version).
        """
        listed = {key: _Stored(body, self._compact) for key, body in items}
        gone: list[tuple[Key, _Stored]] = []
        changed: list[tuple[Key, _Stored]] = []
        with self._lock:
            touched = relisting.touched if relisting is not None else set()
            if relisting in self._relistings:
                self._relistings.remove(relisting)
            for typed in self._typed.values():
                typed.typed = None
            self._typed.clear()
            for key in [k for k in self._objects if k not in listed and k not in touched]:
                if scope is None or scope(key):
                    gone.append((key, self._objects.pop(key)))
            for key, stored in listed.items():
                current = self._objects.get(key)
                if key not in touched and (current is None or stored.version != current.version):
                    self._objects[key] = stored
                    changed.append((key, stored))
            self._listed(scope)
            self._suspects.discard(scope)
        return Relisted(
            [(key, stored.body()) for key, stored in gone],
            [(key, stored.body()) for key, stored in changed],
        )

    # -- reading ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once every scope given to `expect` was listed (without `expect`: one list)."""
        return self._synced

    @property
    def suspected(self) -> bool:
        """True between `suspect` and the `replace` of its scope (lookups read the API)."""
        return bool(self._suspects)

    def get(self, key: Key) -> dict[str, Any] | None:
        """Return the stored object (shared, or decoded afresh when compact: never modify it)."""
        with self._lock:
            found = self._objects.get(key)
        return None if found is None else found.body()

    def version(self, key: Key) -> str | None:
        """Return the stored object's resourceVersion (None: not stored); nothing decoded."""
        with self._lock:
            found = self._objects.get(key)
        return None if found is None else found.version

    def __contains__(self, key: Key) -> bool:
        """Tell whether an object is stored under ``key`` (nothing decoded)."""
        with self._lock:
            return key in self._objects

    def lookup(self, key: Key) -> dict[str, Any] | str:
        """Return the stored object, or `MISSING` (absent, trusted) or `MISSING_UNKNOWN`.

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
        """Return ``parse`` of the stored object, or `MISSING` / `MISSING_UNKNOWN` as `lookup`.

        ``parse`` turns a body into an immutable value (a frozen model): its result is kept
        for the object's current stored version and returned again, without decoding or
        parsing, until that version is replaced, removed or listed anew. At most
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
        """Iterate over a snapshot of the stored objects."""
        with self._lock:
            snapshot = list(self._objects.values())
        return (stored.body() for stored in snapshot)

    def __len__(self) -> int:
        """Return how many objects are stored."""
        with self._lock:
            return len(self._objects)
