"""kopf's part: start-up, clean-up, login and probes; it watches no resource itself."""

from __future__ import annotations

import re
from pathlib import Path

import kopf

from bridge.handlers import lifecycle
from bridge.settings import Settings

HANDLERS = Path(lifecycle.__file__).parent


def test_kopf_has_no_resource_handler() -> None:
    # Every watch is an informer's (`bridge.runtime.informer`): one watch stack.
    resource = re.compile(r"kopf\.(on|index|daemon|timer)\.(?!startup|cleanup|login|probe)\w+")
    for path in HANDLERS.glob("*.py"):
        assert not resource.search(path.read_text(encoding="utf-8")), path.name


def test_kopf_scans_no_resource_and_keeps_its_names_private() -> None:
    settings = kopf.OperatorSettings()
    lifecycle.configure(settings, Settings())
    assert settings.scanning.disabled
    assert settings.persistence.finalizer == lifecycle.KOPF_FINALIZER
