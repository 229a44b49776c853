"""The retry policies every backend call goes through (tenacity).

What is retried is decided by the error (`BackendError.retryable`): connection errors,
timeouts, transient 5xx, 429 and lost allocation races. Wrong credentials, unknown
subnets, exhausted subnets and invalid requests are not retried here: a person has to fix
them, so they go back to the operator, which retries them much later (a condition reason and
a delay, `bridge.reconcilers.errors.retry_delay`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity

from backends.errors import BackendError

__all__ = ["RetryPolicy", "deadline", "is_retryable", "time_left"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: The monotonic time by which the backend operation running in this thread must end.
_DEADLINE: ContextVar[float | None] = ContextVar("ipam_bridge_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Bound everything run inside to ``seconds`` from now (or an earlier enclosing deadline).

    The transport (`backends.transport`) cuts each request's timeouts to `time_left` and
    starts no request once it is used up; the retry policy starts no attempt after it.

    Yields
    ------
    float
        The deadline, a `time.monotonic` value.
    """
    end = time.monotonic() + seconds
    current = _DEADLINE.get()
    if current is not None:
        end = min(end, current)
    token = _DEADLINE.set(end)
    try:
        yield end
    finally:
        _DEADLINE.reset(token)


def time_left() -> float | None:
    """Return the seconds left of the current `deadline`, or None outside of one."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


def is_retryable(exc: BaseException) -> bool:
    """Return True when ``exc`` is a `BackendError` that a prompt repeat may cure."""
    return isinstance(exc, BackendError) and exc.retryable


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for one backend.

    Attributes
    ----------
    attempts:
        Total tries of one call, the first included (>= 1).
    initial_delay_seconds:
        The first wait; each further wait doubles, plus up to the same again of jitter.
    max_delay_seconds:
        The longest single wait.
    total_seconds:
        The time budget of one call, retries, re-logins and the request in flight included:
        the call runs under a `deadline`, each request's timeouts are cut to the time left,
        and no attempt starts (nor a wait before one) that would end after it.
    sleep:
        The function that waits (tests pass a no-op).
    write_timeout:
        Takes the whole timeout in seconds a request that is not a read would have and
        returns it cut to the time this replica may still write (the operator passes its
        Lease fence's ``bound``), or raises to refuse the request; None: not cut.
    """

    attempts: int = 5
    initial_delay_seconds: float = 0.2
    max_delay_seconds: float = 5.0
    total_seconds: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    write_timeout: Callable[[float], float] | None = field(default=None, compare=False)

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run ``fn()`` under this policy and return its result.

        Parameters
        ----------
        operation:
            A short name for logs (``"phpipam allocate"``); never include secrets.
        fn:
            The call to make; it raises `BackendError` subclasses.

        Raises
        ------
        BackendError
            The last error, unchanged, when it is not retryable or the attempts or the
            time budget are used up.
        """
        with deadline(self.total_seconds) as end:
            return self._retrying(operation, end)(fn)

    def _retrying(self, operation: str, end: float) -> tenacity.Retrying:
        return tenacity.Retrying(
            sleep=self.sleep,
            stop=tenacity.stop_after_attempt(max(1, self.attempts)) | _StopAt(end),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self.initial_delay_seconds,
                max=self.max_delay_seconds,
                jitter=self.initial_delay_seconds,
            ),
            retry=tenacity.retry_if_exception(is_retryable),
            before_sleep=_log_retry(operation),
            reraise=True,
        )


class _StopAt(tenacity.stop.stop_base):
    """Stop when the wait before the next attempt would end at or after ``end``."""

    def __init__(self, end: float) -> None:
        self.end = end

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        # tenacity computes the upcoming wait before it asks the stop condition.
        return time.monotonic() + retry_state.upcoming_sleep >= self.end


def _log_retry(operation: str) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "%s failed (attempt %d): %s; retrying in %.2fs",
            operation,
            state.attempt_number,
            exc,
            delay,
        )

    return before_sleep
