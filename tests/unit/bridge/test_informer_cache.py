"""`bridge.runtime.cache` and `bridge.objects.cache`: the informer cache claims are decided from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiException

from bridge.capi import GROUP
from bridge.objects.cache import Cache, prime, relist
from bridge.runtime.cache import (
    HOLD_SECONDS,
    MISSING,
    MISSING_UNKNOWN,
    TYPED_MAX,
    ObjectCache,
    newer,
)


def obj(name: str, rv: str, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv}, **extra}


def test_resource_versions_are_opaque_and_the_watch_order_tells_the_latest() -> None:
    assert newer("9", "10") and newer("10", "9") and not newer("7", "7")
    assert newer("abc", "9") and newer("9", "") and not newer("", "")
    part = ObjectCache("clusters")
    part.apply(("ns", "c"), obj("c", "10"))
    # A numerically smaller version that arrives later (e.g. a restored etcd) is the latest.
    assert part.apply(("ns", "c"), obj("c", "9")) is True
    assert part.get(("ns", "c")) == obj("c", "9")


def test_absence_is_trusted_only_once_the_listing_was_seen() -> None:
    part = ObjectCache("ipaddresses")
    assert part.lookup(("ns", "a")) == MISSING_UNKNOWN
    part.apply(("ns", "a"), obj("a", "5"))
    assert part.lookup(("ns", "a")) == obj("a", "5")
    part.mark_synced()
    assert part.lookup(("ns", "b")) == MISSING


def test_an_event_older_than_our_write_through_changes_nothing() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    assert part.apply(("ns", "c"), obj("c", "10")) is True
    part.put(("ns", "c"), obj("c", "12", status={"ready": True}))
    # The watch events of our two writes arrive afterwards: the first is older, the second
    # is the echo of what was written through. Neither changes the cache (nor queues).
    assert part.apply(("ns", "c"), obj("c", "11")) is False
    assert part.apply(("ns", "c"), obj("c", "12", status={"ready": True})) is False
    assert part.get(("ns", "c")) == obj("c", "12", status={"ready": True})
    # Someone else's later change does.
    assert part.apply(("ns", "c"), obj("c", "13")) is True


def test_our_deletion_leaves_a_tombstone_until_the_watch_says_deleted() -> None:
    part = ObjectCache("ipaddresses")
    part.mark_synced()
    part.apply(("ns", "a"), obj("a", "20"))
    part.forget(("ns", "a"))
    assert part.lookup(("ns", "a")) == MISSING
    assert part.apply(("ns", "a"), obj("a", "20")) is False  # late MODIFIED of the old one
    assert part.lookup(("ns", "a")) == MISSING
    assert part.apply(("ns", "a"), obj("a", "21"), deleted=True) is False  # nothing left
    # A new object of the same name is taken.
    assert part.apply(("ns", "a"), obj("a", "30")) is True
    assert part.apply(("ns", "a"), obj("a", "31"), deleted=True) is True
    assert part.lookup(("ns", "a")) == MISSING


def test_our_last_finalizer_removal_never_stores_an_object_already_deleted() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    part.apply(("ns", "c"), obj("c", "10"))
    gone = obj("c", "11")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    # The watch's DELETED arrives before the worker writes through what the API returned
    # for its finalizer removal (the body of an object deleted by that very write).
    assert part.apply(("ns", "c"), gone, deleted=True) is True
    part.put(("ns", "c"), gone)
    assert part.get(("ns", "c")) is None and len(part) == 0
    # In the other order the write-through drops it, and the DELETED finds nothing.
    part.apply(("ns", "c"), obj("c", "10"))
    part.put(("ns", "c"), gone)
    assert len(part) == 0
    assert part.apply(("ns", "c"), gone, deleted=True) is False


def test_writes_go_through_only_where_the_cache_is_fed() -> None:
    """Without watches feeding it (unit tests' fakes), the cache never answers from writes."""
    part = ObjectCache("ipaddressclaims")
    part.put(("ns", "c"), obj("c", "3"))
    part.forget(("ns", "c"))
    assert len(part) == 0 and part.lookup(("ns", "c")) == MISSING_UNKNOWN
    # An object a watch brought in is written through even before the part is synced.
    part.apply(("ns", "d"), obj("d", "4"))
    part.put(("ns", "d"), obj("d", "5"))
    assert part.get(("ns", "d")) == obj("d", "5")


def test_managed_fields_are_not_kept_and_the_event_body_is_not_the_stored_dict() -> None:
    part = ObjectCache("ipaddresses")
    body = obj("a", "1")
    body["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    part.apply(("ns", "a"), body)
    stored = part.get(("ns", "a"))
    assert stored is not None and "managedFields" not in stored["metadata"]
    assert "managedFields" in body["metadata"]  # the caller's body is untouched


def test_cache_dispatches_our_writes_by_resource_and_keys_pools_by_kind() -> None:
    cache = Cache()
    for part in (cache.claims, cache.addresses, cache.pools):
        part.mark_synced()
    cache.stored("ipaddressclaims", obj("c", "1"))
    cache.stored("ipaddresses", obj("c", "2"))
    cache.stored("secrets", obj("s", "3"))  # not cached: ignored
    assert cache.claims.get(("ns", "c")) == obj("c", "1")
    assert cache.addresses.get(("ns", "c")) == obj("c", "2")
    cache.deleted("ipaddresses", "ns", "c")
    assert cache.addresses.lookup(("ns", "c")) == MISSING
    pool = obj("p", "4", namespace="")
    cache.pools.apply(("GlobalPHPIPAMIPPool", *Cache.key_of(pool)), pool)
    assert cache.pools.get(("GlobalPHPIPAMIPPool", "", "p")) == pool
    assert [*cache.pools.values()] == [pool]


class ListingKube:
    """What `prime` lists, from memory; ``clusters`` None: Clusters are not served."""

    def __init__(self, clusters: list[dict[str, Any]] | None, fail: bool = False) -> None:
        self.clusters = clusters
        self.fail = fail

    def list_ip_addresses(self, version: str, namespace: str | None) -> list[dict[str, Any]]:
        if self.fail:
            raise ApiException(status=403, reason="Forbidden")
        ours = obj("a", "1", spec={"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool"}})
        theirs = obj("b", "2", spec={"poolRef": {"apiGroup": GROUP, "kind": "InClusterIPPool"}})
        return [ours, theirs]

    def list_claims(self, version: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        return [obj("k", "5", spec={"poolRef": {"apiGroup": GROUP, "kind": "PHPIPAMIPPool"}})]

    def list_pools(self, kind: str, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        if self.fail:
            raise ApiException(status=403, reason="Forbidden")
        return [obj("p", "3", kind=kind)] if kind == "PHPIPAMIPPool" else []

    def list_clusters(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]] | None:
        return self.clusters


def test_prime_lists_pools_and_clusters_and_leaves_claims_and_addresses_to_informers() -> None:
    cache = Cache()
    prime(cache, ListingKube([obj("c1", "4")]), namespaces=())  # type: ignore[arg-type]
    assert cache.pools.get(("PHPIPAMIPPool", "ns", "p")) is not None
    assert cache.clusters.get(("ns", "c1")) is not None
    assert cache.pools.synced and cache.clusters.synced
    # Their informers' first lists fill these: until then, lookups read the API.
    assert not cache.claims.synced and not cache.addresses.synced
    assert cache.addresses.lookup(("ns", "a")) == MISSING_UNKNOWN


def test_a_failed_list_leaves_its_part_to_api_reads() -> None:
    cache = Cache()
    prime(cache, ListingKube(None, fail=True), namespaces=())  # type: ignore[arg-type]
    assert cache.pools.lookup(("PHPIPAMIPPool", "ns", "p")) == MISSING_UNKNOWN
    # Clusters not served: none exists; pools and Clusters never trust absence (one may be
    # created between the start-up list and kopf's listing): an absent one is read.
    assert cache.clusters.synced and cache.clusters.lookup(("ns", "c1")) == MISSING_UNKNOWN


def test_our_write_through_holds_older_events_whatever_the_version_strings() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    part.apply(("ns", "c"), obj("c", "x1"))
    part.put(("ns", "c"), obj("c", "x3"))
    part.put(("ns", "c"), obj("c", "x2"))  # the later of our two writes
    assert part.apply(("ns", "c"), obj("c", "x0")) is False  # before our writes
    assert part.apply(("ns", "c"), obj("c", "x3")) is False  # echo of the first
    assert part.get(("ns", "c")) == obj("c", "x2")
    assert part.apply(("ns", "c"), obj("c", "x2")) is False  # echo of the second
    assert part.held() == 0
    assert part.apply(("ns", "c"), obj("c", "x9")) is True  # someone else's, after ours


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_tombstones_and_unechoed_writes_are_held_for_a_bounded_time() -> None:
    clock = Clock()
    part = ObjectCache("ipaddresses", clock=clock)
    part.mark_synced()
    part.apply(
        ("ns", "a"),
        obj(
            "a",
            "1",
        ),
    )
    part.forget(("ns", "a"))  # its DELETED never comes (the watch was down)
    part.apply(("ns", "b"), obj("b", "1"))
    part.put(("ns", "b"), obj("b", "2"))  # its echo never comes
    assert part.held() == 2
    assert part.apply(("ns", "a"), obj("a", "1")) is False
    assert part.apply(("ns", "b"), obj("b", "1")) is False
    clock.now = HOLD_SECONDS + 1
    part.forget(("ns", "z"))  # any deletion drops the tombstones past their time
    assert part.apply(("ns", "b"), obj("b", "3")) is True
    assert part.held() == 0


def test_a_relist_drops_what_is_gone_and_reports_what_changed() -> None:
    part = ObjectCache("ipaddressclaims")
    for name in ("kept", "changed", "gone", "touched"):
        part.apply(("ns", name), obj(name, "1"))
    part.forget(("ns", "deleted-by-us"))
    part.put(("ns", "kept"), obj("kept", "2"))  # echo pending
    part.mark_synced()
    part.suspect()
    assert part.lookup(("ns", "nothing")) == MISSING_UNKNOWN
    assert part.lookup(("ns", "gone")) == MISSING_UNKNOWN  # maybe stale: read the API
    assert part.suspected
    relisting = part.begin_relist()
    # An event during the list request is newer than the list: it stays.
    part.apply(("ns", "touched"), obj("touched", "7"))
    result = part.replace(
        [
            (("ns", "kept"), obj("kept", "2")),
            (("ns", "changed"), obj("changed", "5")),
            (("ns", "new"), obj("new", "6")),
            (("ns", "touched"), obj("touched", "3")),
        ],
        relisting,
    )
    assert [key for key, _ in result.gone] == [("ns", "gone")]
    assert result.gone[0][1] == obj("gone", "1")  # the body as last cached
    assert sorted(key for key, _ in result.changed) == [("ns", "changed"), ("ns", "new")]
    assert part.get(("ns", "touched")) == obj("touched", "7")
    assert part.lookup(("ns", "gone")) == MISSING  # absence trusted again
    assert not part.suspected and part.lookup(("ns", "kept")) == obj("kept", "2")
    assert part.held() == 0


def in_namespace(namespace: str) -> Callable[[Any], bool]:
    def scope(key: Any) -> bool:
        return bool(key[0] == namespace)

    return scope


def test_a_relist_of_one_namespace_leaves_the_others_as_they_are() -> None:
    part = ObjectCache("ipaddressclaims")
    a, b = in_namespace("a"), in_namespace("b")
    for ns in ("a", "b"):
        part.apply(
            (ns, "old"), {"metadata": {"name": "old", "namespace": ns, "resourceVersion": "1"}}
        )
    part.mark_synced()
    part.forget(("b", "old"))  # a tombstone of namespace b
    part.suspect(a)
    part.suspect(b)
    # Two relists in flight at once, one per namespace, each with its own touched keys.
    relisting_a, relisting_b = part.begin_relist(), part.begin_relist()
    part.apply(
        ("a", "touched"),
        {"metadata": {"name": "touched", "namespace": "a", "resourceVersion": "9"}},
    )
    result = part.replace([], relisting_a, scope=a)
    assert [key for key, _ in result.gone] == [("a", "old")]  # not ("a", "touched"): newer
    assert ("a", "touched") in part
    assert part.suspected  # namespace b is still to be listed
    assert part.held() == 1  # b's tombstone: b was not listed
    result = part.replace([], relisting_b, scope=b)
    assert result.gone == [] and not part.suspected and part.held() == 0
    part.end_relist(relisting_a)  # harmless once replaced


def test_relist_lists_each_part_afresh_and_keeps_only_ours() -> None:
    cache = Cache()
    cache.claims.apply(("ns", "old"), obj("old", "1"))
    cache.addresses.apply(("ns", "old"), obj("old", "1"))
    kube = ListingKube([obj("c1", "4")])
    claims = relist(cache, kube, "claims", version="v1beta2", namespaces=())  # type: ignore[arg-type]
    addresses = relist(cache, kube, "addresses", version="v1beta2", namespaces=())  # type: ignore[arg-type]
    assert claims is not None and addresses is not None
    assert [key for key, _ in claims.gone] == [("ns", "old")]
    assert [key for key, _ in claims.changed] == [("ns", "k")]
    assert [key for key, _ in addresses.changed] == [("ns", "a")]  # not "b": another provider's
    assert relist(cache, ListingKube(None), "clusters", version="v1beta2", namespaces=()) is None  # type: ignore[arg-type]
    failing = ListingKube(None, fail=True)
    try:
        relist(cache, failing, "addresses", version="v1beta2", namespaces=())  # type: ignore[arg-type]
    except ApiException:
        pass
    else:  # pragma: no cover
        raise AssertionError("the failed list was not raised")
    cache.addresses.apply(("ns", "later"), obj("later", "1"))
    # The failed relist recorded nothing more: a later relist drops what is gone.
    again = relist(cache, kube, "addresses", version="v1beta2", namespaces=())  # type: ignore[arg-type]
    assert again is not None and [key for key, _ in again.gone] == [("ns", "later")]


def test_a_claim_is_settled_only_when_bound_to_a_cached_address_with_our_finalizer() -> None:
    cache = Cache()
    cache.addresses.apply(("ns", "c1"), {"metadata": {"namespace": "ns", "name": "c1"}})
    meta = {
        "namespace": "ns",
        "name": "c1",
        "finalizers": ["ipam.cluster.x-k8s.io/ReleaseAddress"],
    }
    bound: dict[str, Any] = {"metadata": meta, "status": {"addressRef": {"name": "c1"}}}
    assert cache.settled(bound)
    assert not cache.settled({**bound, "status": {}})  # not bound yet
    assert not cache.settled({**bound, "status": {"addressRef": {"name": "other"}}})
    assert not cache.settled({**bound, "metadata": {**meta, "finalizers": []}})
    deleting = {**meta, "deletionTimestamp": "2026-01-01T00:00:00Z"}
    assert not cache.settled({**bound, "metadata": deleting})


def test_a_compact_part_keeps_json_and_answers_as_a_dict_part_does() -> None:
    part, plain = ObjectCache("ipaddressclaims", compact=True), ObjectCache("ipaddressclaims")
    for p in (part, plain):
        assert p.apply(("ns", "a"), obj("a", "1"))
        assert not p.apply(("ns", "a"), obj("a", "1"))  # the version cached already
        p.put(("ns", "a"), obj("a", "2"))
        assert not p.apply(("ns", "a"), obj("a", "2"))  # the echo of our write
        p.apply(("ns", "b"), obj("b", "1"))
    assert part.get(("ns", "a")) == plain.get(("ns", "a")) == obj("a", "2")
    assert ("ns", "b") in part and ("ns", "c") not in part
    found = part.get(("ns", "a"))
    assert found is not None
    found["metadata"]["name"] = "changed"  # a fresh dict: the cache is untouched
    assert part.lookup(("ns", "a")) == obj("a", "2")
    part.forget(("ns", "a"))
    assert not part.apply(("ns", "a"), obj("a", "3"))  # tombstone (same uid)
    part.begin_relist()
    result = part.replace([(("ns", "c"), obj("c", "1"))])
    assert result.gone == [(("ns", "b"), obj("b", "1"))]
    assert result.changed == [(("ns", "c"), obj("c", "1"))]
    assert list(part.values()) == [obj("c", "1")]


def test_a_typed_value_is_kept_per_version_and_goes_with_it() -> None:
    parsed: list[str] = []

    def parse(body: dict[str, Any]) -> tuple[str, str]:
        parsed.append(body["metadata"]["resourceVersion"])
        return ("typed", body["metadata"]["resourceVersion"])

    part = ObjectCache("ipaddressclaims", compact=True)
    assert part.lookup_typed(("ns", "c"), parse) == MISSING_UNKNOWN
    part.mark_synced()
    assert part.lookup_typed(("ns", "c"), parse) == MISSING
    part.apply(("ns", "c"), obj("c", "1"))
    first = part.lookup_typed(("ns", "c"), parse)
    assert first == ("typed", "1") and part.lookup_typed(("ns", "c"), parse) is first
    assert parsed == ["1"]  # the second read neither decoded nor parsed
    part.apply(("ns", "c"), obj("c", "2"))  # a new version: typed afresh
    assert part.lookup_typed(("ns", "c"), parse) == ("typed", "2") and parsed == ["1", "2"]
    part.put(("ns", "c"), obj("c", "3"))  # our own write: typed afresh as well
    assert part.lookup_typed(("ns", "c"), parse) == ("typed", "3")
    part.forget(("ns", "c"))
    assert part.lookup_typed(("ns", "c"), parse) == MISSING
    part.suspect()
    part.apply(("ns", "d"), obj("d", "1"))
    assert part.lookup_typed(("ns", "d"), parse) == MISSING_UNKNOWN  # suspect: read the API


def test_typed_values_are_bounded() -> None:
    part = ObjectCache("ipaddresses", compact=True)
    part.mark_synced()
    for i in range(TYPED_MAX + 10):
        part.apply(("ns", str(i)), obj(str(i), "1"))
        part.lookup_typed(("ns", str(i)), str)
    assert len(part._typed) == TYPED_MAX  # the oldest let go of theirs
    part.apply(("ns", "0"), obj("0", "2"), deleted=True)
    part.begin_relist()
    part.replace([])
    assert not part._typed


def test_an_echo_before_the_answer_keeps_what_the_watch_told_since() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    part.apply(("ns", "c"), obj("c", "1"))
    # Our write made version 2; the watch tells of it, then of someone else's version 3,
    # before our write's answer is written through.
    assert part.apply(("ns", "c"), obj("c", "2")) is True
    assert part.apply(("ns", "c"), obj("c", "3")) is True
    part.put(("ns", "c"), obj("c", "2"))
    assert part.get(("ns", "c")) == obj("c", "3")  # never the older version back
    assert part.held() == 0  # nothing pending: later events are not held back
    assert part.is_own(("ns", "c"), "2") and not part.is_own(("ns", "c"), "3")
    assert part.apply(("ns", "c"), obj("c", "4")) is True


def test_a_write_answered_before_its_echo_is_ours_and_the_echo_is_no_news() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    part.apply(("ns", "c"), obj("c", "1"))
    part.put(("ns", "c"), obj("c", "2"))
    assert part.is_own(("ns", "c"), "2") and not part.is_own(("ns", "c"), "1")
    assert part.apply(("ns", "c"), obj("c", "2")) is False
    # A recreated object (another uid) remembers nothing of the old one.
    recreated = {"metadata": {"name": "c", "uid": "new", "resourceVersion": "9"}}
    assert part.apply(("ns", "c"), recreated)
    assert not part.is_own(("ns", "c"), "2")


def test_a_list_of_the_whole_part_leaves_a_broken_watchs_suspicion() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    everything = in_namespace("ns")  # an informer's own scope, whose watch broke
    part.suspect(everything)
    part.replace([(("ns", "c"), obj("c", "1"))], part.begin_relist())  # another relist
    assert part.suspected  # until the informer lists (its watch is back)
    part.replace([(("ns", "c"), obj("c", "1"))], part.begin_relist(), scope=everything)
    assert not part.suspected


def test_a_part_listed_per_namespace_is_synced_once_every_namespace_was_listed() -> None:
    part = ObjectCache("ipaddressclaims")
    a, b = in_namespace("a"), in_namespace("b")
    part.expect([a, b])
    part.fill([(("a", "c"), obj("c", "1", namespace="a"))], a)
    # Namespace b's first list has not come (it failed): its claims' absence is unknown.
    assert not part.synced and part.lookup(("b", "c")) == MISSING_UNKNOWN
    part.fill([], b)
    assert part.synced and part.lookup(("b", "c")) == MISSING


def test_our_last_finalizer_removal_is_known_as_ours_whichever_comes_first() -> None:
    part = ObjectCache("ipaddressclaims")
    part.mark_synced()
    deleted = {"metadata": {**obj("c", "3")["metadata"], "deletionTimestamp": "t", "uid": "u"}}
    # The answer first, then the DELETED: no news, and nothing kept.
    part.apply(("ns", "c"), obj("c", "1"))
    part.put(("ns", "c"), deleted)
    assert part.apply(("ns", "c"), deleted, deleted=True) is False
    assert part.held() == 0 and not part.deleted_by_us(("ns", "c"))
    # The DELETED first (news), then the answer: the deletion is ours, told once.
    part.apply(("ns", "c"), obj("c", "1"))
    assert part.apply(("ns", "c"), deleted, deleted=True) is True
    part.put(("ns", "c"), deleted)
    assert part.deleted_by_us(("ns", "c")) and not part.deleted_by_us(("ns", "c"))
    assert part.held() == 0
    # Someone else's deletion is not ours.
    part.apply(("ns", "d"), obj("d", "1"))
    assert part.apply(("ns", "d"), obj("d", "2"), deleted=True) is True
    assert not part.deleted_by_us(("ns", "d"))
