"""`ObjectClient` over `gateway.Kube`: expectations of our writes, an IPAddress deleted unread."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiException, V1ObjectMeta, V1Secret

from bridge.capi import ADDRESS_FINALIZER
from bridge.objects.client import ObjectClient as Kube
from bridge.runtime.expectations import GONE, Expectations
from bridge.runtime.gateway import Outcome, Write, _finalizer_patch


class FakeCustom:
    """The CustomObjectsApi calls `Kube.delete_ip_address` makes, recorded."""

    def __init__(self, stored_version: str, stored_uid: str = "") -> None:
        self.stored_version = stored_version
        self.stored_uid = stored_uid
        self.calls: list[tuple[str, ...]] = []
        self.delete_uids: list[str] = []  # the preconditions.uid of each DELETE ("": none)

    def get(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("get",))
        meta = {"finalizers": [ADDRESS_FINALIZER], "resourceVersion": self.stored_version}
        if self.stored_uid:
            meta["uid"] = self.stored_uid
        return {"metadata": meta}

    def patch(self, *args: Any, status: bool = False) -> dict[str, Any]:
        version = args[-1]["metadata"]["resourceVersion"]
        self.calls.append(("patch", version))
        if version != self.stored_version:
            raise ApiException(status=409, reason="Conflict")
        # As the API server answers: the object as stored, at a new resourceVersion.
        return {"metadata": {"finalizers": [], "resourceVersion": str(int(version) + 1)}}

    def delete(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("delete",))
        self.delete_uids.append(args[5] if len(args) > 5 else "")
        return {}


def kube_with(custom: FakeCustom) -> tuple[Kube, Expectations]:
    kube = Kube.__new__(Kube)
    kube.custom = custom  # type: ignore[assignment]
    kube.expectations = Expectations()
    return kube, kube.expectations


def seen(version: str) -> dict[str, Any]:
    return {"metadata": {"finalizers": [ADDRESS_FINALIZER], "resourceVersion": version}}


def test_an_ipaddress_seen_in_the_cache_is_deleted_without_a_read() -> None:
    custom = FakeCustom("7")
    kube, expectations = kube_with(custom)
    kube.delete_ip_address("v1beta2", "ns", "m1", seen("7"))
    assert custom.calls == [("patch", "7"), ("delete",)]
    # The claim's next pass waits until the watch tells of the deletion.
    assert expectations.pending(("ipaddresses", "ns", "m1")) > 0


def test_both_echoes_of_an_ipaddress_deletion_are_ours() -> None:
    # The ProtectAddress removal (MODIFIED at version 8) and the deletion (DELETED): neither
    # event may queue the claim's pass again (AddressEvents queue the claim unless ours).
    kube, expectations = kube_with(FakeCustom("7"))
    kube.delete_ip_address("v1beta2", "ns", "m1", seen("7"))
    key = ("ipaddresses", "ns", "m1")
    assert expectations.observed(key, "8")
    assert expectations.pending(key) > 0  # still waiting for the deletion itself
    assert expectations.observed(key, "9", deleted=True)
    assert expectations.pending(key) == 0.0


def test_a_stale_cache_costs_one_read_on_the_conflict_path_only() -> None:
    custom = FakeCustom("9")
    kube, expectations = kube_with(custom)
    kube.delete_ip_address("v1beta2", "ns", "m1", seen("7"))
    assert custom.calls == [("patch", "7"), ("get",), ("patch", "9"), ("delete",)]
    assert expectations.observed(("ipaddresses", "ns", "m1"), "10", deleted=True)


def test_our_writes_of_claims_are_expected_by_their_version_or_deletion() -> None:
    kube, expectations = kube_with(FakeCustom("1"))
    key = ("ipaddressclaims", "ns", "c1")
    written = Write(Outcome.WRITTEN, {"metadata": {"resourceVersion": "12", "finalizers": ["f"]}})
    assert kube._expect("ipaddressclaims", "ns", "c1", written) is written
    assert expectations.pending(key) > 0 and expectations.ours(key, "12")
    # The last finalizer off a claim being deleted: the API server deletes it.
    gone = {"metadata": {"resourceVersion": "13", "deletionTimestamp": "t", "finalizers": []}}
    kube._expect("ipaddressclaims", "ns", "c1", Write(Outcome.WRITTEN, gone))
    assert expectations.ours(key, GONE, deleted=True) and not expectations.ours(key, "13")
    # Nothing written (a conflict, a claim gone): nothing to wait for.
    other = ("ipaddressclaims", "ns", "c2")
    kube._expect("ipaddressclaims", "ns", "c2", Write(Outcome.CONFLICT))
    assert expectations.pending(other) == 0.0


def test_the_delete_of_an_ipaddress_carries_the_uid_seen() -> None:
    custom = FakeCustom("7", stored_uid="u1")
    kube, _ = kube_with(custom)
    body = seen("7")
    body["metadata"]["uid"] = "u1"
    assert kube.delete_ip_address("v1beta2", "ns", "m1", body).outcome is Outcome.WRITTEN
    assert custom.delete_uids == ["u1"]


def test_another_ipaddress_of_the_same_name_is_not_deleted_in_place_of_the_one_seen() -> None:
    # The one seen (uid u1) was deleted and another made under its name (uid u2): the
    # finalizer write of the stale view meets a 409, the read shows another uid.
    custom = FakeCustom("9", stored_uid="u2")
    kube, _ = kube_with(custom)
    body = seen("7")
    body["metadata"]["uid"] = "u1"
    assert kube.delete_ip_address("v1beta2", "ns", "m1", body).outcome is Outcome.GONE
    assert custom.calls == [("patch", "7"), ("get",)]  # no write to the other object
    assert custom.delete_uids == []


# -- typed outcomes of writes -------------------------------------------------------------------


def _answering(status: int | None) -> Any:
    """A merge-patch call that answers ``status`` (an ApiException), or the patched object."""

    def patch(name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if status is not None:
            raise ApiException(status=status, reason="refused")
        return {"metadata": {"name": name, **body["metadata"]}}

    return patch


def claim_meta(finalizers: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c1",
            "namespace": "ns",
            "finalizers": finalizers,
            "resourceVersion": "5",
        }
    }


def set_finalizer(obj: dict[str, Any], finalizer: str, present: bool, patch: Any) -> Write:
    """`Kube.set_finalizer`'s patch, sent through ``patch(name, namespace, body)``."""
    meta = obj["metadata"]
    return _finalizer_patch(
        meta, finalizer, present, lambda body: patch(meta["name"], meta["namespace"], body)
    )


def test_a_finalizer_write_tells_written_unchanged_gone_and_conflict_apart() -> None:
    written = set_finalizer(claim_meta([]), "f", True, _answering(None))
    assert written.outcome is Outcome.WRITTEN and written.written
    assert written.obj is not None and written.obj["metadata"]["finalizers"] == ["f"]
    unchanged = set_finalizer(claim_meta(["f"]), "f", True, _answering(500))
    assert unchanged == Write(Outcome.UNCHANGED)  # no request: the 500 is never met
    assert set_finalizer(claim_meta([]), "f", True, _answering(404)).outcome is Outcome.GONE
    conflict = set_finalizer(claim_meta([]), "f", True, _answering(409))
    assert conflict.outcome is Outcome.CONFLICT
    with pytest.raises(ApiException):
        set_finalizer(claim_meta([]), "f", True, _answering(422))


class Existing(FakeCustom):
    """An API server that holds an IPAddress of the created name (a create answers 409)."""

    def create(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("create",))
        raise ApiException(status=409, reason="AlreadyExists")


def test_an_ipaddress_create_answering_409_returns_the_existing_one() -> None:
    custom = Existing("7")
    kube, _ = kube_with(custom)
    body = {"metadata": {"name": "m1", "namespace": "ns"}, "spec": {}}
    result = kube.create_ip_address("v1beta2", body)
    assert result.outcome is Outcome.CONFLICT
    assert result.obj == {"metadata": {"finalizers": [ADDRESS_FINALIZER], "resourceVersion": "7"}}
    assert custom.calls == [("create",), ("get",)]


def test_deleting_an_ipaddress_that_is_gone_is_gone_not_written() -> None:
    class Gone(FakeCustom):
        def get(self, *args: Any) -> dict[str, Any]:
            raise ApiException(status=404, reason="NotFound")

    kube, expectations = kube_with(Gone("7"))
    assert kube.delete_ip_address("v1beta2", "ns", "m1").outcome is Outcome.GONE
    assert expectations.pending(("ipaddresses", "ns", "m1")) > 0  # until its DELETED comes
    assert kube.delete_ip_address("v1beta2", "ns", "m1", seen("7")).written


class FakeCore:
    """The CoreV1Api calls `Kube.set_secret_finalizer` makes: one Secret, its version moving."""

    def __init__(self, finalizers: list[str] | None, *, changes: int = 0) -> None:
        self.finalizers = finalizers  # None: no such Secret
        self.version = 1
        self.changes = changes  # how many writes another writer beats (409)
        self.patches: list[dict[str, Any]] = []

    def read_namespaced_secret(self, name: str, namespace: str) -> V1Secret:
        if self.finalizers is None:
            raise ApiException(status=404, reason="Not Found")
        meta = V1ObjectMeta(finalizers=list(self.finalizers), resource_version=str(self.version))
        return V1Secret(metadata=meta)

    def patch_namespaced_secret(
        self, name: str, namespace: str, body: dict[str, Any], **kwargs: Any
    ) -> V1Secret:
        self.patches.append(body)
        if self.changes:  # the Secret changed between the read and this write
            self.changes -= 1
            self.version += 1
            raise ApiException(status=409, reason="Conflict")
        assert body["metadata"]["resourceVersion"] == str(self.version)
        self.finalizers = body["metadata"]["finalizers"]
        return V1Secret(metadata=V1ObjectMeta(finalizers=self.finalizers))


def secret_kube(core: FakeCore) -> Kube:
    kube = Kube.__new__(Kube)
    kube.core = core  # type: ignore[assignment]
    return kube


def test_a_secret_finalizer_write_answers_a_write_and_a_conflict_is_not_raised() -> None:
    changed = FakeCore([ADDRESS_FINALIZER], changes=1)
    kube = secret_kube(changed)
    assert kube.set_secret_finalizer("ns", "s", ADDRESS_FINALIZER, False).outcome is (
        Outcome.CONFLICT
    )
    assert changed.finalizers == [ADDRESS_FINALIZER]  # nothing written: the caller retries
    assert kube.set_secret_finalizer("ns", "s", ADDRESS_FINALIZER, False).outcome is (
        Outcome.WRITTEN
    )
    assert changed.finalizers == []
    assert kube.set_secret_finalizer("ns", "s", ADDRESS_FINALIZER, False).outcome is (
        Outcome.UNCHANGED
    )
    assert len(changed.patches) == 2
    missing = secret_kube(FakeCore(None))
    assert missing.set_secret_finalizer("ns", "s", ADDRESS_FINALIZER, True).outcome is (
        Outcome.GONE
    )
