"""Request latency (benchmarks only): a delay before the answer, by verb; watches never wait.

`mock_kubernetes.emulator.KubeEmulator.latency` lets a benchmark give the emulator a real API
server's pace (reads in milliseconds, writes after an etcd commit). The delay is an
``asyncio.sleep`` on the server's loop, so it is observed here by recording those sleeps
rather than by timing anything.
"""

from __future__ import annotations

import types

import pytest
from emulator_helpers import WIDGETS_PATH, Api, widget

from mock_kubernetes import EmulatedKubernetes, emulator


def test_latency_delays_the_listed_verbs_only(
    kube: EmulatedKubernetes, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(emulator, "asyncio", types.SimpleNamespace(sleep=sleep))
    kube.handler.latency.update({"get": 0.002, "create": 0.01})
    assert api("POST", WIDGETS_PATH, widget("w"))[0] == 201
    assert api("GET", f"{WIDGETS_PATH}/w")[0] == 200
    assert api("GET", WIDGETS_PATH)[0] == 200  # a list: no latency set for it
    status, _ = api("GET", WIDGETS_PATH, watch="1", timeoutSeconds="0.1")
    assert status == 200
    assert slept == [0.01, 0.002]
