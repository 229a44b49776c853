"""The emulated API server cuts one client identity off while the others go on."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.auth import Identity, User


def get(kube: EmulatedKubernetes, identity: Identity, timeout: float) -> requests.Response:
    return requests.get(
        f"{kube.url}/api/v1/namespaces",
        headers={"Authorization": f"Bearer {identity.token}"},
        timeout=timeout,
    )


def test_a_hung_identity_gets_no_answer_while_others_are_served_then_heals(
    kube: EmulatedKubernetes,
) -> None:
    cut = kube.add_identity(Identity(User("replica-a")))
    other = kube.add_identity(Identity(User("replica-b")))
    assert get(kube, cut, 10).status_code == 200

    kube.handler.partition.cut(cut)
    assert kube.handler.partition.mode(cut) == "hang"
    with pytest.raises(requests.ReadTimeout):
        get(kube, cut, 0.5)
    assert get(kube, other, 10).status_code == 200
    assert get(kube, kube.admin, 10).status_code == 200

    # A request hung during the cut is answered once the partition heals.
    answers: list[int] = []
    waiting = threading.Thread(target=lambda: answers.append(get(kube, cut, 30).status_code))
    waiting.start()
    time.sleep(0.3)
    assert answers == []
    kube.handler.partition.heal(cut)
    waiting.join(30)
    assert answers == [200]
    assert kube.handler.partition.mode(cut) is None


def test_a_refused_identity_sees_its_connection_closed_at_once(kube: EmulatedKubernetes) -> None:
    cut = kube.add_identity(Identity(User("replica-a")))
    kube.handler.partition.cut(cut, "refuse")
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        get(kube, cut, 10)
    assert time.monotonic() - started < 5
    assert get(kube, kube.admin, 10).status_code == 200
    kube.handler.partition.heal()
    assert get(kube, cut, 10).status_code == 200
