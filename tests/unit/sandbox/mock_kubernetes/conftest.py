"""Fixtures for the in-memory Kubernetes API tests."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest
from emulator_helpers import GADGETS, WIDGETS, Api

from mock_kubernetes import EmulatedKubernetes


@pytest.fixture
def kube() -> Iterator[EmulatedKubernetes]:
    with EmulatedKubernetes(crds=[WIDGETS, GADGETS]) as emulator:
        yield emulator


@pytest.fixture
def api(kube: EmulatedKubernetes) -> Iterator[Api]:
    client = Api(kube.url)
    yield client
    client.session.close()


@pytest.fixture
def client(kube: EmulatedKubernetes) -> Iterator[kubernetes.client.ApiClient]:
    """The official ``kubernetes`` client, configured for the emulator (admin)."""
    with kube.api_client() as api_client:
        yield api_client
