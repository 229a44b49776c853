"""`bridge.runtime.store` and `bridge.objects.cache`: the store claims are decided from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.objects.cache import PARTS, Cache, informers
from bridge.runtime.store import MISSING, MISSING_UNKNOWN, TYPED_MAX, Store


def obj(name: str, rv: str, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv}, **extra}


def with_uid(name: str, rv: str, uid: str) -> dict[str, Any]:
    body = obj(name, rv)
    body["metadata"]["uid"] = uid
    return body


def test_resource_versions_are_opaque_and_the_watch_order_tells_the_latest() -> None:
    part = Store("clusters")
    part.apply(("ns", "c"), obj("c", "10"))
    # A numerically smaller version that arrives later (e.g. a restored etcd) is the latest.
    assert part.apply(("ns", "c"), obj("c", "9")) is True
    assert part.get(("ns", "c")) == obj("c", "9")
    assert part.version(("ns", "c")) == "9" and part.version(("ns", "x")) is None
    assert part.apply(("ns", "c"), obj("c", "9")) is False  # the version stored already


def test_absence_is_trusted_only_once_the_listing_was_seen() -> None:
    part = Store("ipaddresses")
    assert part.lookup(("ns", "a")) == MISSING_UNKNOWN
    part.apply(("ns", "a"), obj("a", "5"))
    assert part.lookup(("ns", "a")) == obj("a", "5")
    part.fill([])
    assert part.lookup(("ns", "b")) == MISSING


def test_a_late_deleted_of_an_old_uid_leaves_the_new_object() -> None:
    part = Store("ipaddresses")
    part.fill([(("ns", "a"), with_uid("a", "1", "old"))])
    # Recreated under the same name (another uid); the old one's DELETED comes late.
    assert part.apply(("ns", "a"), with_uid("a", "3", "new")) is True
    assert part.apply(("ns", "a"), with_uid("a", "2", "old"), deleted=True) is False
    assert part.get(("ns", "a")) == with_uid("a", "3", "new")
    assert part.apply(("ns", "a"), with_uid("a", "4", "new"), deleted=True) is True
    assert part.lookup(("ns", "a")) == MISSING


def test_every_event_is_applied_in_the_watchs_order_however_many() -> None:
    # No write of ours goes in, so none can hold later events back or put an older version
    # back: six events between a write and its answer all land, the last one stays.
    part = Store("ipaddressclaims", compact=True)
    part.fill([(("ns", "c"), obj("c", "1"))])
    assert all(part.apply(("ns", "c"), obj("c", str(v))) for v in range(2, 8))
    assert part.get(("ns", "c")) == obj("c", "7")
    assert part.apply(("ns", "c"), obj("c", "8")) is True


def test_managed_fields_are_not_kept_and_the_event_body_is_not_the_stored_dict() -> None:
    part = Store("ipaddresses")
    body = obj("a", "1")
    body["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    part.apply(("ns", "a"), body)
    stored = part.get(("ns", "a"))
    assert stored is not None and "managedFields" not in stored["metadata"]
    assert "managedFields" in body["metadata"]  # the caller's body is untouched


def test_pools_are_keyed_by_kind() -> None:
    cache = Cache()
    pool = obj("p", "4", namespace="", kind="GlobalPHPIPAMIPPool")
    cache.pools.apply(Cache.pool_key_of(pool), pool)
    assert cache.pools.get(("GlobalPHPIPAMIPPool", "", "p")) == pool
    assert Cache.pool_key_of(obj("q", "1"), "PHPIPAMIPPool") == ("PHPIPAMIPPool", "ns", "q")
    # Pools and Clusters never trust absence: an absent one is read from the API.
    cache.pools.fill([])
    assert cache.pools.lookup(("PHPIPAMIPPool", "ns", "x")) == MISSING_UNKNOWN


def in_namespace(namespace: str) -> Callable[[Any], bool]:
    def scope(key: Any) -> bool:
        return bool(key[0] == namespace)

    return scope


def test_a_relist_drops_what_is_gone_and_reports_what_changed() -> None:
    part = Store("ipaddressclaims")
    part.fill((("ns", name), obj(name, "1")) for name in ("kept", "changed", "gone", "touched"))
    part.suspect()
    assert part.lookup(("ns", "nothing")) == MISSING_UNKNOWN
    assert part.lookup(("ns", "gone")) == MISSING_UNKNOWN  # maybe stale: read the API
    assert part.suspected
    relisting = part.begin_relist()
    # An event during the list request is newer than the list: it stays.
    part.apply(("ns", "touched"), obj("touched", "7"))
    result = part.replace(
        [
            (("ns", "kept"), obj("kept", "1")),
            (("ns", "changed"), obj("changed", "5")),
            (("ns", "new"), obj("new", "6")),
            (("ns", "touched"), obj("touched", "3")),
        ],
        relisting,
    )
    assert [key for key, _ in result.gone] == [("ns", "gone")]
    assert result.gone[0][1] == obj("gone", "1")  # the body as last stored
    assert sorted(key for key, _ in result.changed) == [("ns", "changed"), ("ns", "new")]
    assert part.get(("ns", "touched")) == obj("touched", "7")
    assert part.lookup(("ns", "gone")) == MISSING  # absence trusted again
    assert not part.suspected and part.lookup(("ns", "kept")) == obj("kept", "1")


def test_a_relist_of_one_namespace_leaves_the_others_as_they_are() -> None:
    part = Store("ipaddressclaims")
    a, b = in_namespace("a"), in_namespace("b")
    part.fill([((ns, "old"), obj("old", "1", namespace=ns)) for ns in ("a", "b")])
    part.suspect(a)
    part.suspect(b)
    # Two relists in flight at once, one per namespace, each with its own touched keys.
    relisting_a, relisting_b = part.begin_relist(), part.begin_relist()
    part.apply(("a", "touched"), obj("touched", "9", namespace="a"))
    result = part.replace([], relisting_a, scope=a)
    assert [key for key, _ in result.gone] == [("a", "old")]  # not ("a", "touched"): newer
    assert ("a", "touched") in part and ("b", "old") in part
    assert part.suspected  # namespace b is still to be listed
    result = part.replace([], relisting_b, scope=b)
    assert [key for key, _ in result.gone] == [("b", "old")] and not part.suspected
    part.end_relist(relisting_a)  # harmless once replaced


def test_a_claim_is_settled_only_when_bound_to_a_stored_address_with_our_finalizer() -> None:
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
    part, plain = Store("ipaddressclaims", compact=True), Store("ipaddressclaims")
    for p in (part, plain):
        assert p.apply(("ns", "a"), obj("a", "1"))
        assert not p.apply(("ns", "a"), obj("a", "1"))  # the version stored already
        assert p.apply(("ns", "a"), obj("a", "2"))
        p.apply(("ns", "b"), obj("b", "1"))
    assert part.get(("ns", "a")) == plain.get(("ns", "a")) == obj("a", "2")
    assert ("ns", "b") in part and ("ns", "c") not in part
    found = part.get(("ns", "a"))
    assert found is not None
    found["metadata"]["name"] = "changed"  # a fresh dict: the store is untouched
    assert part.lookup(("ns", "a")) == obj("a", "2")
    part.begin_relist()
    result = part.replace([(("ns", "c"), obj("c", "1"))])
    assert sorted(key for key, _ in result.gone) == [("ns", "a"), ("ns", "b")]
    assert result.changed == [(("ns", "c"), obj("c", "1"))]
    assert list(part.values()) == [obj("c", "1")]


def test_a_typed_value_is_kept_per_version_and_goes_with_it() -> None:
    parsed: list[str] = []

    def parse(body: dict[str, Any]) -> tuple[str, str]:
        parsed.append(body["metadata"]["resourceVersion"])
        return ("typed", body["metadata"]["resourceVersion"])

    part = Store("ipaddressclaims", compact=True)
    assert part.lookup_typed(("ns", "c"), parse) == MISSING_UNKNOWN
    part.fill([])
    assert part.lookup_typed(("ns", "c"), parse) == MISSING
    part.apply(("ns", "c"), obj("c", "1"))
    first = part.lookup_typed(("ns", "c"), parse)
    assert first == ("typed", "1") and part.lookup_typed(("ns", "c"), parse) is first
    assert parsed == ["1"]  # the second read neither decoded nor parsed
    part.apply(("ns", "c"), obj("c", "2"))  # a new version: typed afresh
    assert part.lookup_typed(("ns", "c"), parse) == ("typed", "2") and parsed == ["1", "2"]
    part.apply(("ns", "c"), obj("c", "2"), deleted=True)
    assert part.lookup_typed(("ns", "c"), parse) == MISSING
    part.suspect()
    part.apply(("ns", "d"), obj("d", "1"))
    assert part.lookup_typed(("ns", "d"), parse) == MISSING_UNKNOWN  # suspect: read the API


def test_typed_values_are_bounded() -> None:
    part = Store("ipaddresses", compact=True)
    part.fill([])
    for i in range(TYPED_MAX + 10):
        part.apply(("ns", str(i)), obj(str(i), "1"))
        part.lookup_typed(("ns", str(i)), str)
    assert len(part._typed) == TYPED_MAX  # the oldest let go of theirs
    part.apply(("ns", "0"), obj("0", "2"), deleted=True)
    part.begin_relist()
    part.replace([])
    assert not part._typed


def test_a_list_of_the_whole_part_leaves_a_broken_watchs_suspicion() -> None:
    part = Store("ipaddressclaims")
    part.fill([])
    everything = in_namespace("ns")  # an informer's own scope, whose watch broke
    part.suspect(everything)
    part.replace([(("ns", "c"), obj("c", "1"))], part.begin_relist())  # another relist
    assert part.suspected  # until the informer lists (its watch is back)
    part.replace([(("ns", "c"), obj("c", "1"))], part.begin_relist(), scope=everything)
    assert not part.suspected


def test_a_part_listed_per_namespace_is_synced_once_every_namespace_was_listed() -> None:
    part = Store("ipaddressclaims")
    a, b = in_namespace("a"), in_namespace("b")
    part.expect([a, b])
    part.fill([(("a", "c"), obj("c", "1", namespace="a"))], a)
    # Namespace b's first list has not come (it failed): its claims' absence is unknown.
    assert not part.synced and part.lookup(("b", "c")) == MISSING_UNKNOWN
    part.fill([], b)
    assert part.synced and part.lookup(("b", "c")) == MISSING


def test_a_relist_of_one_namespace_leaves_a_part_unsynced_while_another_never_listed() -> None:
    # client-go's HasSynced: true only after the initial list of every informer.
    part = Store("ipaddressclaims")
    a, b = in_namespace("a"), in_namespace("b")
    part.expect([a, b])
    part.fill([(("a", "c"), obj("c", "1", namespace="a"))], a)
    part.suspect(a)  # namespace a's watch broke: listed again while b's first list still fails
    part.replace([(("a", "c"), obj("c", "2", namespace="a"))], part.begin_relist(), scope=a)
    assert not part.synced
    assert part.lookup(("b", "c")) == MISSING_UNKNOWN  # never listed: not "missing"
    assert part.lookup(("a", "c")) == obj("c", "2", namespace="a")
    part.fill([], b)
    assert part.synced and part.lookup(("b", "c")) == MISSING


class NoKube:
    def list_collection(self, *args: Any) -> Any:
        raise AssertionError("not called until started")

    def watch(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called until started")


class NoSink:
    def listed(self, listed: Any) -> None: ...
    def relisted(self, relisted: Any) -> None: ...
    def event(self, event: Any) -> None: ...


def test_one_informer_per_resource_pool_kind_and_namespace_each_with_its_own_scope() -> None:
    cache = Cache()
    made = informers(
        cache,
        NoKube(),  # type: ignore[arg-type]
        version="v1beta2",
        cluster_version="v1beta2",
        namespaces=("a", "b"),
        sinks=dict.fromkeys(PARTS, NoSink()),
    )
    names = {part: sorted(i.name for i in made[part]) for part in PARTS}
    assert names["claims"] == ["ipaddressclaims in a", "ipaddressclaims in b"]
    assert names["clusters"] == ["clusters in a", "clusters in b"]
    # Global pool kinds are cluster-scoped: one informer each, whatever the namespaces.
    assert len(names["pools"]) == 2 + 2 * 2
    assert "globalphpipamippools" in names["pools"]
    # Each pool informer's list covers its own kind only: a relist of one kind never drops
    # the pools of another, and the part is synced only once every kind was listed.
    cache.pools.fill([(("PHPIPAMIPPool", "a", "p"), obj("p", "1", namespace="a"))])
    assert not cache.pools.synced
    scopes = [i._scope for i in made["pools"]]
    assert sum(1 for s in scopes if s is not None and s(("PHPIPAMIPPool", "a", "p"))) == 1
    none = informers(
        Cache(),
        NoKube(),  # type: ignore[arg-type]
        version="v1beta2",
        cluster_version=None,
        namespaces=(),
        sinks=dict.fromkeys(PARTS, NoSink()),
    )
    assert none["clusters"] == [] and len(none["claims"]) == 1
