from __future__ import annotations

from collections.abc import Iterator

import pytest
from ib_helpers import PASSWORD, SEED, USER, Wapi

from mock_infoblox import InfobloxStore, MockInfobloxServer


@pytest.fixture(scope="module")
def server() -> Iterator[MockInfobloxServer]:
    with MockInfobloxServer(InfobloxStore(users={USER: PASSWORD})) as srv:
        yield srv


@pytest.fixture
def store(server: MockInfobloxServer) -> InfobloxStore:
    server.store.reset()
    server.store.seed(SEED)
    server.faults.reset()
    return server.store


@pytest.fixture
def wapi(server: MockInfobloxServer, store: InfobloxStore) -> Iterator[Wapi]:
    client = Wapi(server.url)
    yield client
    client.session.close()
