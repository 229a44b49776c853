"""Which object the current reconcile is about, for log lines (a context variable).

kopf puts the handled object's reference on the log records of its handlers; the work queue
(`bridge.runtime.workqueue`) runs reconciles outside kopf's handlers, so `about` sets the same
reference for the lines logged while one object is reconciled. `bridge.cli.ObjectRefFilter`
adds it to every record (the ``[namespace/name]`` prefix of text logs, the ``object`` key of
JSON logs).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["about", "current"]

_current: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "ipam_bridge_object", default=None
)


@contextmanager
def about(api_version: str, kind: str, namespace: str, name: str) -> Iterator[None]:
    """Name the object that the lines logged inside the block are about.

    Parameters
    ----------
    api_version, kind, namespace, name:
        The object's reference, in the shape of kopf's ``k8s_ref`` (no uid).
    """
    token = _current.set(
        {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}
    )
    try:
        yield
    finally:
        _current.reset(token)


def current() -> Mapping[str, str] | None:
    """Return the reference set by the innermost `about` of this thread, or None."""
    return _current.get()
