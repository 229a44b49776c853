"""Process-wide state every test must leave as it found it.

The operator reads its settings from the environment, and kopf keeps a default handler
registry for the whole process (its CLI, and so ``KopfRunner``, replaces it for good). A
test that changed either would silently reconfigure every operator started after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import kopf
import pytest


@pytest.fixture(autouse=True)
def _isolate_process_state() -> Iterator[None]:
    environment = dict(os.environ)
    registry = kopf.get_default_registry()
    yield
    if dict(os.environ) != environment:
        os.environ.clear()
        os.environ.update(environment)
    kopf.set_default_registry(registry)
