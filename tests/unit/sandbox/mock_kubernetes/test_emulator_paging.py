"""Paged lists of the in-memory Kubernetes API: limit, continue, 410 on an expired token."""

from __future__ import annotations

from emulator_helpers import WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes


def names(body: dict) -> list[str]:
    return [i["metadata"]["name"] for i in body["items"]]


def test_a_list_is_paged_by_limit_and_continue(api: Api) -> None:
    for name in ("e", "a", "d", "b", "c"):
        assert api("POST", WIDGETS_PATH, widget(name))[0] == 201
    status, first = api("GET", f"{WIDGETS_PATH}?limit=2")
    assert status == 200 and names(first) == ["a", "b"]
    token, rv = first["metadata"]["continue"], first["metadata"]["resourceVersion"]
    assert api("POST", WIDGETS_PATH, widget("bb"))[0] == 201  # after the first page
    status, second = api("GET", f"{WIDGETS_PATH}?limit=2&continue={token}")
    assert status == 200 and names(second) == ["bb", "c"]
    assert second["metadata"]["resourceVersion"] == rv  # the first page's
    status, last = api("GET", f"{WIDGETS_PATH}?limit=2&continue={second['metadata']['continue']}")
    assert status == 200 and names(last) == ["d", "e"] and "continue" not in last["metadata"]
    status, whole = api("GET", WIDGETS_PATH)
    assert names(whole) == ["a", "b", "bb", "c", "d", "e"] and "continue" not in whole["metadata"]


def test_a_continue_token_older_than_the_kept_history_is_410_expired(
    api: Api, kube: EmulatedKubernetes
) -> None:
    for name in ("a", "b", "c"):
        api("POST", WIDGETS_PATH, widget(name))
    _, first = api("GET", f"{WIDGETS_PATH}?limit=1")
    api("POST", WIDGETS_PATH, widget("d"))
    kube.store.expire_history()  # compacted, as after an API server restart
    status, body = api("GET", f"{WIDGETS_PATH}?limit=1&continue={first['metadata']['continue']}")
    assert (status, body["reason"], body["code"]) == (410, "Expired", 410)
    status, body = api("GET", f"{WIDGETS_PATH}?limit=1&continue=not-a-token")
    assert status == 400
