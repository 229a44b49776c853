"""Fixtures of the mock_phpipam tests: a seeded store, a running mock, a logged-in client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from phpipam_mock_helpers import SEED, Api

from mock_phpipam import ManualClock, MockPhpipamServer, Store


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def store(clock: ManualClock) -> Store:
    return Store(SEED, clock=clock)


@pytest.fixture
def server(store: Store) -> Iterator[MockPhpipamServer]:
    with MockPhpipamServer(store) as srv:
        yield srv


@pytest.fixture
def api(server: MockPhpipamServer) -> Iterator[Api]:
    client = Api(server)
    client.login()
    yield client
    client.session.close()
