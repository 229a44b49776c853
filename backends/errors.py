"""The errors every backend raises, whatever its IPAM.

Each error says whether retrying the same call soon can help (`retryable`): the retry
policies in `backends.retry` retry exactly those. `bridge` maps the classes to condition
reasons in one place (`bridge.reconcilers.errors`).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.base import EntryOwner

__all__ = [
    "AddressUnavailableError",
    "AuthenticationFailedError",
    "BackendError",
    "BackendUnavailableError",
    "ConflictError",
    "EndpointUnavailableError",
    "EntryOwnedError",
    "InvalidRequestError",
    "SubnetExhaustedError",
    "SubnetNotFoundError",
    "TLSVerificationError",
    "tls_failure",
]


class BackendError(Exception):
    """Base of every error a backend raises.

    Parameters
    ----------
    message:
        Human-readable text, safe to show in a condition or event: it never contains a
        password, token or session cookie.
    status:
        The HTTP status of the answer that caused it, or None when there was no answer
        (connection refused, timeout).
    """

    #: Whether the same call may succeed if repeated soon (see `backends.retry`).
    retryable: bool = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BackendUnavailableError(BackendError):
    """The IPAM could not be reached or answered with a transient failure.

    Raised for connection errors, timeouts, HTTP 5xx other than the known permanent ones,
    429, and answers that are not the API's envelope (an HTML error page from a proxy).
    """

    retryable = True


class EndpointUnavailableError(BackendUnavailableError):
    """The endpoint is short-circuited or busy, so the call was not even sent.

    Raised when the endpoint's circuit breaker is open ("endpoint <url> unreachable, next
    try at <time>") or every place of the endpoint is taken ("endpoint <url> busy"; see
    `backends.flowcontrol.FlowControl`). Not retried inside the call: waiting there
    would hold the worker the limit exists to free; the operator tries again later.
    """

    retryable = False


class ConflictError(BackendError):
    """A write lost a race on the IPAM side (another writer took the same address).

    phpIPAM answers a lost first-free race with 409 "IP address already exists" or
    500 "Duplicate entry ... sid_ip_unique"; repeating the allocation computes a new
    first free address, so this is retried.
    """

    retryable = True


class AuthenticationFailedError(BackendError):
    """The credentials were refused (wrong user or password, invalid app token, no permission)."""


class SubnetNotFoundError(BackendError):
    """The subnet or network the pool names does not exist in the IPAM."""


class SubnetExhaustedError(BackendError):
    """No subnet of the pool has a free address left (every subnet was tried, in order)."""


class AddressUnavailableError(BackendError):
    """A requested address cannot be registered (held, outside the pool, or never handed out).

    It is held by another entry, or it lies outside every subnet of the pool, or it is
    never handed out (gateway, network, broadcast).

    Not retried inside the client; nothing was registered. The message names the address
    and, where the IPAM tells, the hostname that holds it.

    Attributes
    ----------
    address:
        The requested address, normalised.
    holder:
        The hostname (phpIPAM ``hostname``, WAPI record ``name``) of the entry holding the
        address, or None when the IPAM does not say or the address lies outside the pool.
    """

    def __init__(
        self, message: str, *, address: str, holder: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, status=status)
        self.address = address
        self.holder = holder


class EntryOwnedError(BackendError):
    """The entry under a claim's hostname belongs to another management cluster or claim.

    Raised by ``allocate`` when `backends.base.may_adopt` refuses the entry found: it is never
    adopted, changed or released. Not retried (``retryable`` False): a person must give the
    pool a ``hostnameSuffix`` (or remove the other entry); the claim waits.

    Attributes
    ----------
    hostname:
        The hostname the entry is registered under.
    address:
        The entry's address, normalised.
    owner:
        The `backends.base.EntryOwner` the entry names.
    """

    def __init__(
        self,
        message: str,
        *,
        hostname: str,
        address: str,
        owner: EntryOwner,
        status: int | None = None,
    ) -> None:
        super().__init__(message, status=status)
        self.hostname = hostname
        self.address = address
        self.owner = owner


class InvalidRequestError(BackendError):
    """The IPAM rejected the request as invalid (bad field, bad value, unsupported call)."""


class TLSVerificationError(BackendError):
    """The IPAM endpoint's TLS certificate could not be verified (untrusted CA, wrong name).

    Not retried: a person must give the pool the CA bundle that signed the certificate
    (``spec.tls.caSecretRef``) or fix the certificate.
    """


def tls_failure(exc: BaseException) -> str | None:
    """Return why TLS verification failed when ``exc`` was caused by it, else None.

    Walks the exception chain (``__cause__``/``__context__``, arguments, urllib3's
    ``MaxRetryError.reason``; bounded): ``requests`` wraps urllib3's error, which wraps the
    standard library's ``ssl.SSLError`` (``ssl.SSLCertVerificationError`` for an untrusted
    certificate). The text returned is the verification message (no URL, no secret), e.g.
    ``"certificate verify failed: self-signed certificate in certificate chain"``.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack and len(seen) < 20:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            detail = current.verify_message or current.reason or "certificate verify failed"
            return f"certificate verify failed: {detail}"
        if isinstance(current, ssl.SSLError):  # e.g. a TLS handshake refused
            return f"TLS error: {current.reason or current}"
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(a for a in current.args if isinstance(a, BaseException))
        reason = getattr(current, "reason", None)  # urllib3 MaxRetryError.reason
        if isinstance(reason, BaseException):
            stack.append(reason)
    return None
