"""The fence: may this replica write now? Checked in the calling thread before every write.

With leader election on, a replica writes (Kubernetes POST/PUT/PATCH/DELETE, IPAM requests
other than reads) only while its Lease is valid by its own monotonic clock: its last
successful renew began less than the renew deadline ago. A replica cut off from the API
server thus stops writing at that instant, whether or not its event loop runs, before a
standby can take the Lease; a write's whole timeout is cut to the time left (`Fence.bound`).
With leader election off, `Fence.open` lets every write through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["MIN_WRITE_SECONDS", "Fence", "LeadershipLostError"]

#: Below this many seconds of Lease left, no write is sent (its answer could not come in time).
MIN_WRITE_SECONDS = 0.05


class LeadershipLostError(RuntimeError):
    """The Lease of this replica is not valid (not renewed within the deadline, or lost).

    Raised by `Fence.check` before a write; the work queue retries the key later without a
    traceback (the process exits meanwhile), and ``ipam-bridge run`` exits 1 with it.
    """


class Fence:
    """Whether this replica's Lease is valid now, by its own clock; thread-safe.

    Parameters
    ----------
    renewed:
        Returns ``time.monotonic()`` at the start of the last successful write of the Lease
        by this replica, or None when it never held it (`leader.ElectionLock.renewed`).
        None as the whole argument: no leader election (`open`).
    renew_deadline_seconds:
        How long after the last renew the Lease counts as held (seconds).
    clock:
        Monotonic time in seconds (tests pass a fake).
    """

    def __init__(
        self,
        renewed: Callable[[], float | None] | None,
        renew_deadline_seconds: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._renewed = renewed
        self.renew_deadline_seconds = renew_deadline_seconds
        self._clock = clock
        self._lock = threading.Lock()  # the first reason to `revoke` stays
        self._revoked: str | None = None

    @classmethod
    def open(cls) -> Fence:
        """Return the fence of a replica without leader election: `check` always passes."""
        return cls(None)

    @property
    def revoked(self) -> str | None:
        """Why the fence was closed for good (`revoke`), else None."""
        return self._revoked

    def revoke(self, reason: str) -> None:
        """Close the fence for good with ``reason`` (the first reason is kept)."""
        with self._lock:
            if self._revoked is None:
                self._revoked = reason

    def left(self) -> float | None:
        """Return the seconds the Lease stays valid (<= 0: not valid); None: no election.

        Returns 0.0 once revoked or when the Lease was never held.
        """
        if self._renewed is None:
            return None
        if self._revoked is not None:
            return 0.0
        renewed = self._renewed()
        if renewed is None:
            return 0.0
        return renewed + self.renew_deadline_seconds - self._clock()

    def bound(self, seconds: float) -> float:
        """Return ``seconds`` (a write's whole timeout) cut to the time the Lease stays valid.

        Parameters
        ----------
        seconds:
            The timeout the write would have without the fence (``math.inf``: none).

        Returns
        -------
        float
            ``min(seconds, left())``; ``seconds`` unchanged without leader election.

        Raises
        ------
        LeadershipLostError
            Less than `MIN_WRITE_SECONDS` of the Lease is left (or it is not held, or the fence
            was revoked): the write is not to be sent.
        """
        left = self.left()
        if left is None:
            return seconds
        if left < MIN_WRITE_SECONDS:
            raise LeadershipLostError(self._refusal(left))
        return min(seconds, left)

    def check(self) -> None:
        """Return when this replica may write; else raise.

        Raises
        ------
        LeadershipLostError
            With leader election on: the fence was revoked, the Lease was never held, or
            its last successful renew is ``renew_deadline_seconds`` old or older.
        """
        left = self.left()
        if left is None or left > 0:
            return
        raise LeadershipLostError(self._refusal(left))

    def _refusal(self, left: float) -> str:
        """Return why a write is refused with ``left`` seconds of the Lease left."""
        reason = self.revoked
        if reason is not None:
            return reason
        if left > 0:
            return (
                f"the leader Lease stays valid {left:.3f} s only, too short for a write: "
                "this replica does not write"
            )
        return (
            f"the leader Lease is not renewed within {self.renew_deadline_seconds:g} s: "
            "this replica does not write"
        )
