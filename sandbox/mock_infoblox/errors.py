"""WAPI error answers: the exception the mock raises and the bodies NIOS sends back."""

from __future__ import annotations

from typing import Any

__all__ = [
    "LOCKED_HTML",
    "UNAUTHORIZED_HTML",
    "WAPIError",
    "conflict",
    "data_error",
    "not_found",
    "proto_error",
    "read_only_member",
]

#: The Apache page NIOS answers with on a missing or wrong password or an expired cookie
#: (401 bodies are HTML, not JSON; https://ipam.illinois.edu/wapidoc/ "Error handling").
UNAUTHORIZED_HTML = """<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html><head>
<title>401 Authorization Required</title>
</head><body>
<h1>Authorization Required</h1>
<p>This server could not verify that you
are authorized to access the document
requested.  Either you supplied the wrong
credentials (e.g., bad password), or your
browser doesn't understand how to supply
the credentials required.</p>
</body></html>
"""

#: The 401 page of a locked-out account. The exact NIOS page is not recorded in public
#: material; the mock's says "locked" as the grid's message does.
LOCKED_HTML = """<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html><head>
<title>401 Authorization Required</title>
</head><body>
<h1>Authorization Required</h1>
<p>Account is locked: too many failed login attempts. Try again later.</p>
</body></html>
"""


class WAPIError(Exception):
    """An error the mock answers in WAPI's three-key JSON shape.

    Parameters
    ----------
    status:
        HTTP status (400 for protocol, data and conflict errors, 404 for unknown refs).
    error:
        The ``Error`` value, e.g. ``"AdmConProtoError: Unknown object type (foo)"``.
    code:
        The ``code`` value, e.g. ``"Client.Ibap.Proto"``.
    text:
        The ``text`` value: the human part of ``error``.

    Notes
    -----
    The body shape ``{"Error": ..., "code": ..., "text": ...}`` and the status codes are
    those of the WAPI 2.x documentation (https://ipam.illinois.edu/wapidoc/, "Error handling").
    """

    def __init__(self, status: int, error: str, code: str, text: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.code = code
        self.text = text

    def body(self) -> dict[str, Any]:
        """Return the JSON body NIOS sends for this error.

        Returns
        -------
        dict
            ``{"Error": ..., "code": ..., "text": ...}``.
        """
        return {"Error": self.error, "code": self.code, "text": self.text}


def proto_error(text: str) -> WAPIError:
    """Build a 400 ``Client.Ibap.Proto`` error (bad argument, field, type, EA or method).

    Parameters
    ----------
    text:
        The message, e.g. ``"Unknown extensible attribute: Site"``.

    Returns
    -------
    WAPIError
        Status 400, ``Error`` prefixed with ``AdmConProtoError: ``.
    """
    return WAPIError(400, f"AdmConProtoError: {text}", "Client.Ibap.Proto", text)


def data_error(text: str) -> WAPIError:
    """Build a 400 ``Client.Ibap.Data`` error (e.g. no free address left).

    Parameters
    ----------
    text:
        The message, e.g. ``"Cannot find 1 available IP address(es) in this network."``.

    Returns
    -------
    WAPIError
        Status 400, ``Error`` = ``AdmConDataError: None (IBDataError: IB.Data:<text>)``.
    """
    return WAPIError(
        400, f"AdmConDataError: None (IBDataError: IB.Data:{text})", "Client.Ibap.Data", text
    )


def conflict(text: str) -> WAPIError:
    """Build a 400 ``Client.Ibap.Data.Conflict`` error (duplicate name or address).

    Parameters
    ----------
    text:
        The message, e.g. ``"The record 'node1.example.com' already exists."``.

    Returns
    -------
    WAPIError
        Status 400 (NIOS never answers 409), ``Error`` =
        ``AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:<text>)``.
    """
    return WAPIError(
        400,
        f"AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:{text})",
        "Client.Ibap.Data.Conflict",
        text,
    )


def not_found(text: str) -> WAPIError:
    """Build a 404 ``Client.Ibap.Data.NotFound`` error (unknown ref or view).

    Parameters
    ----------
    text:
        The message, e.g. ``"Reference record:host/abc:x/default not found"``.

    Returns
    -------
    WAPIError
        Status 404, ``Error`` prefixed with ``AdmConDataNotFoundError: ``.
    """
    return WAPIError(404, f"AdmConDataNotFoundError: {text}", "Client.Ibap.Data.NotFound", text)


def read_only_member() -> WAPIError:
    """Return the error of a write sent to a Grid Master Candidate (read-only API access).

    Returns
    -------
    WAPIError
        Status 403, ``Client.Ibap.Proto``. The exact NIOS text is not recorded in public
        material; the mock's names the read-only member.
    """
    text = "Write operations are not allowed: this member has read-only API access"
    return WAPIError(403, f"AdmConProtoError: {text}", "Client.Ibap.Proto", text)
