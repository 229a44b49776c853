"""Fixtures of the integration tests: the real operator, the emulated API, the IPAM mocks.

Every test gets a fresh emulated Kubernetes API with the operator running in-process
(`mock_kubernetes.Sandbox`) and fresh mock IPAM servers on 127.0.0.1.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from integration_env import CREDENTIALS, INFOBLOX_SEED, NAMESPACE, PHPIPAM_SEED

from mock_infoblox.server import MockInfobloxServer
from mock_infoblox.store import InfobloxStore
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["CREDENTIALS", "INFOBLOX_SEED", "NAMESPACE", "PHPIPAM_SEED"]


@pytest.fixture
def phpipam() -> Iterator[MockPhpipamServer]:
    """A fresh mock phpIPAM seeded with `PHPIPAM_SEED` (its ``.store`` is inspectable)."""
    with MockPhpipamServer(Store(copy.deepcopy(PHPIPAM_SEED))) as server:
        yield server


@pytest.fixture
def infoblox() -> Iterator[MockInfobloxServer]:
    """A fresh WAPI mock seeded with `INFOBLOX_SEED`."""
    with MockInfobloxServer(InfobloxStore.from_seed(copy.deepcopy(INFOBLOX_SEED))) as server:
        yield server


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    """Factory of sandboxes (``make_sandbox(settings={...}, capi_versions=(...))``).

    Each one is entered, gets the namespace `NAMESPACE`, and is closed after the test.
    """
    opened: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        sandbox = Sandbox(**kwargs).__enter__()
        opened.append(sandbox)
        sandbox.namespace(NAMESPACE)
        return sandbox

    yield make
    for sandbox in reversed(opened):
        sandbox.__exit__(None, None, None)


@pytest.fixture
def sandbox(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """The operator running against a fresh emulated API (CAPI v1beta2 preferred)."""
    return make_sandbox()
