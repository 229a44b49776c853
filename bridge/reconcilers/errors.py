"""Operator-side errors, and the one place backend errors become condition reasons.

A backend raises `backends.errors.BackendError`; `bridge` turns it once into a `PoolError`
(what is wrong with the pool: a reason for the pool's Ready condition) or a `ClaimError`
(what blocks a claim: a reason for the claim's Ready condition). Handlers turn these into a
condition, an Event and a kopf ``TemporaryError`` with a delay.
"""

from __future__ import annotations

from backends.errors import (
    AuthenticationFailedError,
    BackendError,
    InvalidRequestError,
    SubnetExhaustedError,
    SubnetNotFoundError,
    TLSVerificationError,
)
from bridge.capi import Reason
from bridge.settings import Settings

__all__ = [
    "ClaimError",
    "PoolError",
    "claim_error_from",
    "exhausted_message",
    "pool_error_from",
    "retry_delay",
]

#: What to do about an IPAM server whose certificate is not trusted.
TLS_HINT = (
    "set spec.tls.caSecretRef to a Secret holding the CA bundle (PEM) that signed the "
    "endpoint's certificate"
)


def retry_delay(settings: Settings, reason: str) -> float:
    """Return how long an object waits before it is looked at again, by the reason it waits.

    The one place that decides retry delays (seconds). Causes a person must fix (wrong
    credentials, unknown subnet, bad spec, TLS, a name conflict, a hostname another
    management cluster or claim owns) wait
    ``requeue_config_error_seconds``; an exhausted pool ``requeue_exhausted_seconds`` (how
    often the pool probes its IPAM while claims wait for an address: the claims themselves
    are parked, see `claims`); everything else (an unreachable IPAM, an API conflict)
    ``requeue_seconds``. Waits that an event ends (paused, pool not Ready, no free address)
    are parked in the work queue and poll nothing.
    """
    if reason == Reason.POOL_EXHAUSTED:
        return settings.requeue_exhausted_seconds
    if reason in _PERSON_REASONS:
        return settings.requeue_config_error_seconds
    return settings.requeue_seconds


class PoolError(Exception):
    """A pool cannot be used.

    Parameters
    ----------
    reason:
        The pool's Ready condition reason (``CredentialsNotFound``, ``AuthenticationFailed``,
        ``SubnetNotFound``, ``InvalidSpec``, ``BackendUnavailable``, ...).
    message:
        What is wrong, for people; never contains a secret.
    needs_person:
        True when retrying soon cannot help (wrong credentials, unknown subnet, bad spec):
        the object is retried after the longer delay.
    """

    def __init__(self, reason: Reason, message: str, *, needs_person: bool) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.needs_person = needs_person


class ClaimError(Exception):
    """A claim cannot be fulfilled (or released) right now.

    Parameters
    ----------
    reason:
        The claim's Ready condition reason (``PoolNotReady``, ``PoolExhausted``,
        ``AllocationFailed``).
    message:
        What blocks it, for people.
    delay:
        Seconds before the operator tries again.
    """

    def __init__(self, reason: Reason, message: str, *, delay: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.delay = delay


#: Reasons whose cause a person must fix: retried slowly.
_PERSON_REASONS = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.CREDENTIALS_NOT_FOUND,
        Reason.AUTHENTICATION_FAILED,
        Reason.SUBNET_NOT_FOUND,
        Reason.TLS_VERIFICATION_FAILED,
        Reason.POOL_NOT_READY,
        Reason.HOSTNAME_TAKEN,
    }
)


def pool_error_from(exc: BackendError, pool_display: str) -> PoolError:
    """Translate a backend error met while checking a pool into a `PoolError`.

    An untrusted TLS certificate gives ``TLSVerificationFailed`` with the verification
    message and what to do about it.
    """
    if isinstance(exc, TLSVerificationError):
        return PoolError(
            Reason.TLS_VERIFICATION_FAILED,
            f"{pool_display}: {exc.message}; {TLS_HINT}",
            needs_person=True,
        )
    if isinstance(exc, AuthenticationFailedError):
        return PoolError(
            Reason.AUTHENTICATION_FAILED, f"{pool_display}: {exc.message}", needs_person=True
        )
    if isinstance(exc, SubnetNotFoundError):
        return PoolError(
            Reason.SUBNET_NOT_FOUND, f"{pool_display}: {exc.message}", needs_person=True
        )
    if isinstance(exc, InvalidRequestError):
        return PoolError(Reason.INVALID_SPEC, f"{pool_display}: {exc.message}", needs_person=True)
    return PoolError(
        Reason.BACKEND_UNAVAILABLE,
        f"{pool_display}: IPAM unavailable: {exc.message}",
        needs_person=False,
    )


def exhausted_message(pool_display: str) -> str:
    """Return the message of a claim waiting on an exhausted pool (one text, always)."""
    return f"{pool_display} has no free address; waiting for one to be released"


def claim_error_from(
    exc: BackendError,
    pool_display: str,
    *,
    retry_seconds: float,
    config_error_seconds: float,
    exhausted_seconds: float,
) -> ClaimError:
    """Translate a backend error met while allocating or releasing into a `ClaimError`.

    Exhausted subnets give ``PoolExhausted``; problems of the pool's configuration
    (credentials, subnet, rejected requests, an untrusted TLS certificate) give
    ``PoolNotReady``; the rest (unreachable IPAM, lost races beyond the retry budget) give
    ``AllocationFailed``.
    """
    if isinstance(exc, TLSVerificationError):
        return ClaimError(
            Reason.POOL_NOT_READY,
            f"{pool_display}: {exc.message}; {TLS_HINT}",
            delay=config_error_seconds,
        )
    if isinstance(exc, SubnetExhaustedError):
        # The same text as a claim that waits behind the exhaustion gate shows: a waiting
        # claim's condition must not change (and be written) each time it looks again.
        return ClaimError(
            Reason.POOL_EXHAUSTED, exhausted_message(pool_display), delay=exhausted_seconds
        )
    if isinstance(exc, AuthenticationFailedError | SubnetNotFoundError | InvalidRequestError):
        return ClaimError(
            Reason.POOL_NOT_READY, f"{pool_display}: {exc.message}", delay=config_error_seconds
        )
    return ClaimError(
        Reason.ALLOCATION_FAILED, f"{pool_display}: {exc.message}", delay=retry_seconds
    )
