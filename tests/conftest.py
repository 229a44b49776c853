"""Process-wide state every test must leave as it found it.

The operator reads its settings from the environment, kopf keeps a default handler
registry for the whole process (its CLI, and so ``KopfRunner``, replaces it for good), and
``ipam-bridge run`` configures the root logger (``kopf.configure``) with a handler on the
``sys.stderr`` of its moment, which pytest closes after that test. A test that changed any of
them would silently reconfigure every operator started after it in the same process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import kopf
import pytest


@pytest.fixture(autouse=True)
def _isolate_process_state() -> Iterator[None]:
    environment = dict(os.environ)
    registry = kopf.get_default_registry()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))
    if dict(os.environ) != environment:
        os.environ.clear()
        os.environ.update(environment)
    kopf.set_default_registry(registry)
