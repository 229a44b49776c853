"""Injected failures of the in-memory Kubernetes API: answer chosen requests with an error.

The emulated API server (`mock_kubernetes.emulator.KubeEmulator`) asks `Faults.take` about
every authorized request before serving it; a matching fault answers it with a ``v1 Status``
of the fault's HTTP status instead (e.g. ``503`` as an overloaded API server or a proxy in
front of it would answer: https://kubernetes.io/docs/reference/using-api/api-concepts/).
"""

from __future__ import annotations

import dataclasses
import http
import threading

__all__ = ["Fault", "Faults"]


@dataclasses.dataclass
class Fault:
    """One injected failure.

    Attributes
    ----------
    method : str or None
        HTTP method it applies to (upper case), or ``None`` for any.
    path : str or None
        URL path it applies to (exact, without the query), or ``None`` for any.
    status : int
        HTTP status of the answer (4xx or 5xx).
    times : int or None
        How many more requests it answers; ``None``: every one until removed.

    """

    method: str | None
    path: str | None
    status: int
    times: int | None

    def matches(self, method: str, path: str) -> bool:
        """Return whether the request ``method path`` is one this fault answers."""
        return (self.method is None or self.method == method.upper()) and (
            self.path is None or self.path == path
        )


class Faults:
    """The injected failures of one emulator; `inject` and `clear` may be called from any thread.

    Examples
    --------
    >>> kube.handler.faults.inject("GET", "/api/v1/namespaces/default/secrets", 503)
    ... # doctest: +SKIP

    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def inject(
        self, method: str | None, path: str | None, status: int, *, times: int | None = 1
    ) -> Fault:
        """Answer the next ``times`` requests ``method path`` with ``status``.

        Parameters
        ----------
        method : str or None
            HTTP method (any case), or ``None`` for any.
        path : str or None
            Exact URL path (no query), or ``None`` for any.
        status : int
            HTTP status of the answer, 400 to 599.
        times : int or None
            How many requests (default 1); ``None`` for every one until `clear`.

        Returns
        -------
        Fault
            The fault, first in line among those matching the same requests.

        Raises
        ------
        ValueError
            If ``status`` is not a 4xx or 5xx code, or ``times`` is below 1.

        """
        if not 400 <= status <= 599:
            raise ValueError(f"status must be 4xx or 5xx, not {status}")
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 (or None), not {times}")
        fault = Fault(method.upper() if method else None, path, status, times)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every injected fault."""
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str) -> int | None:
        """Return the status of the first fault matching ``method path`` and count it, or None.

        A fault whose ``times`` reaches zero is removed.
        """
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times == 0:
                            self._faults.remove(fault)
                    return fault.status
        return None

    @staticmethod
    def reason(status: int) -> str:
        """Return the ``Status.reason`` of ``status``, e.g. ``ServiceUnavailable`` for 503."""
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            return "Unknown"
        return "".join(word.capitalize() for word in phrase.replace("-", " ").split())
