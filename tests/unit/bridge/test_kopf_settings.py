"""kopf's settings of the operator: no per-event work that no handler needs."""

from __future__ import annotations

import re
from pathlib import Path

import kopf

from bridge.handlers import lifecycle
from bridge.settings import Settings

HANDLERS = Path(lifecycle.__file__).parent


def test_no_essence_is_built_for_event_handlers() -> None:
    settings = kopf.OperatorSettings()
    lifecycle.configure(settings, Settings())
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, lifecycle.EventsOnlyDiffBase)
    body = kopf.Body({"metadata": {"name": "c", "labels": {"a": "b"}}, "spec": {"x": 1}})
    assert storage.build(body=body) == {}


def test_no_essence_is_read_or_written() -> None:
    # An annotation left by a change handler elsewhere is not even looked at.
    settings = kopf.OperatorSettings()
    lifecycle.configure(settings, Settings())
    storage = settings.persistence.diffbase_storage
    key = "kopf.ipam-bridge.io/last-handled-configuration"
    body = kopf.Body({"metadata": {"name": "c", "annotations": {key: '{"spec": {"x": 0}}'}}})
    assert storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence(spec={"x": 1}))
    assert not patch


def test_every_resource_handler_is_an_event_handler() -> None:
    # The empty essence is right only while no change handler reads it.
    changing = re.compile(r"kopf\.on\.(create|update|delete|resume|field)\(")
    for path in HANDLERS.glob("*.py"):
        assert not changing.search(path.read_text(encoding="utf-8")), path.name
