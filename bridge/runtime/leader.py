"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the leader handles objects.

Several replicas run for the Lease ``ipam-bridge`` in the operator's namespace, with
controller-runtime's timings (lease 15 s, renew deadline 10 s, retry 2 s;
``IPAM_BRIDGE_LEADER_ELECTION_*``). The leader works (`Leadership` starts the work queue and
the resync when it wins); the others stand by (their watches run, nothing is written). A
leader that cannot renew within the deadline stops handling at once and exits 1
(`OperatorStop`): its `bridge.runtime.fence.Fence` refuses every write from the deadline on,
in the writing thread, and the exit is armed from a thread of the election, so neither needs
the event loop. On a clean stop the leader lets its work end, revokes its fence, waits for
its threads (bounded) and only then gives the Lease up (`Leadership.close`,
`ElectionLock.release`): no write of it goes out once a standby may lead.

The election is the official client's ``kubernetes.leaderelection`` in a daemon thread;
`ElectionLock` adds what its ``LeaseLock`` lacks (our ``ApiClient``, request timeouts,
transport errors as failed tries, `ElectionLock.stop` and `ElectionLock.release`, complete
``MicroTime`` values) and `Leadership` watches the renew deadline itself, to the moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import enum
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import ApiClient, ApiException, CoordinationV1Api
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from bridge.metrics import Metrics
from bridge.runtime.fence import Fence, LeadershipLostError
from bridge.runtime.gateway import Kube, api_client
from bridge.runtime.kubeconfig import load_configuration, service_account_namespace
from bridge.settings import Settings

__all__ = [
    "LEASE_NAME",
    "ElectionLock",
    "ElectionStoppedError",
    "Leadership",
    "LeadershipLostError",
    "LeaseReason",
    "OperatorStop",
    "Timings",
    "election_client",
    "holder_identity",
    "lease_fence",
    "lease_namespace",
    "stop_tasks",
]

log = logging.getLogger(__name__)

#: The Lease every replica runs for (``kubectl get lease ipam-bridge -n <namespace>``).
LEASE_NAME = "ipam-bridge"


class LeaseReason(enum.StrEnum):
    """Reasons of the Events ipam-bridge posts on its leader election Lease.

    The reason client-go's leader election gives its Events (``LeaderElection``).
    """

    #: Lease Event: Normal when a replica became the leader; Warning when the leader stopped
    #: leading (it could not renew the Lease in time, or lost it), and exits.
    LEADER_ELECTION = "LeaderElection"


#: Shortest timeout of one Lease request (past the renew deadline a try fails at once).
MIN_REQUEST_TIMEOUT = 0.1
#: Seconds a clean stop lets the work end (in-flight reconciles, an audit or purge pass) with
#: the fence open, then the seconds it waits, the fence revoked, for what did not end. With
#: the informers' stops (5 s each at most) they fit the Deployment's
#: ``terminationGracePeriodSeconds`` of 60.
STOP_DRAIN_SECONDS = 10.0
STOP_JOIN_SECONDS = 5.0
#: Seconds a clean stop lets the Events still queued be posted before the fence is revoked.
STOP_EVENTS_SECONDS = 2.0


class ElectionStoppedError(Exception):
    """Raised by a stopped `ElectionLock`: it ends the official election loop."""


@dataclass(frozen=True)
class Timings:
    """The election's timings, in seconds (see `Settings`, ``leader_election_*``)."""

    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    @classmethod
    def of(cls, settings: Settings) -> Timings:
        """Return the timings ``settings`` set."""
        return cls(
            settings.leader_election_lease_seconds,
            settings.leader_election_renew_deadline_seconds,
            settings.leader_election_retry_seconds,
        )


def lease_namespace(settings: Settings) -> str:
    """Return the namespace of the Lease.

    ``IPAM_BRIDGE_LEADER_ELECTION_NAMESPACE`` when set; else, in a pod (service account, no
    kubeconfig), the service account's namespace (the operator's); else ``default``.
    """
    if "leader_election_namespace" not in settings.model_fields_set:
        return service_account_namespace() or settings.leader_election_namespace
    return settings.leader_election_namespace


def holder_identity() -> str:
    """Return a new holder identity: ``<pod name or host name>_<16 random hex digits>``.

    The pod name comes from ``POD_NAME`` (the Deployment sets it from ``metadata.name``);
    the random part makes a restarted container a new candidate, as controller-runtime's.
    """
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(8)}"


def election_client() -> ApiClient:
    """Return the ``ApiClient`` of the election: our configuration, without urllib3 retries.

    The election tries again every retry period itself; urllib3's retries would multiply
    each request's timeout.
    """
    configuration = load_configuration()
    configuration.retries = False
    return api_client(configuration, pool_size=2)


def _micro(value: datetime.datetime) -> datetime.datetime:
    """Return ``value`` with a non-zero microsecond.

    ``isoformat`` drops a zero fraction, and a real API server refuses a ``MicroTime``
    without its six digits.
    """
    return value if value.microsecond else value.replace(microsecond=1)


class _LeaseApi:
    """A ``CoordinationV1Api`` whose calls have a timeout and raise only ``ApiException``.

    ``LeaseLock``'s requests have no timeout (an API server that stops answering blocks the
    renew loop for ever) and a transport error (urllib3's) ends the election thread without
    ``onstopped_leading``. Here each call is cut at ``timeout()`` seconds, as client-go's
    renew context does, and a transport error is an ``ApiException`` (a failed try).

    Parameters
    ----------
    api:
        The client's Lease API on our ``ApiClient``.
    timeout:
        Returns the timeout of the next request, in seconds.
    """

    def __init__(self, api: CoordinationV1Api, timeout: Callable[[], float]) -> None:
        self._api = api
        self._timeout = timeout

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """Return the method ``name`` of the API, with the timeout and ``ApiException``."""
        method = getattr(self._api, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs, _request_timeout=self._timeout())
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise ApiException(status=0, reason=f"{type(exc).__name__}: {exc}") from exc

        return call


class ElectionLock(LeaseLock):
    """The official ``LeaseLock`` on our ``ApiClient``, with timeouts, `stop` and `release`.

    Parameters
    ----------
    name, namespace:
        The Lease.
    identity:
        This candidate's holder identity (`holder_identity`).
    client:
        The ``ApiClient`` of the election (`election_client`).
    timings:
        The election's timings: a request takes at most the retry period, and while leading
        it is cut at the renew deadline of the current renew round.
    """

    def __init__(
        self, name: str, namespace: str, identity: str, *, client: ApiClient, timings: Timings
    ) -> None:
        super().__init__(name, namespace, identity)
        # LeaseLock's own CoordinationV1Api (default configuration) is replaced by ours.
        self.api_instance = _LeaseApi(  # type: ignore[assignment]
            CoordinationV1Api(client), self.request_timeout
        )
        self.client = client
        self.timings = timings
        self._guard = threading.Lock()  # one Lease request at a time; stop waits for it
        self._stopped = False
        self._renewed: float | None = None  # monotonic start of our last successful write

    @property
    def renewed(self) -> float | None:
        """``time.monotonic()`` when the last successful write of ours began (None: none yet)."""
        return self._renewed

    @property
    def stopped(self) -> bool:
        """True once `stop` or `release` was called: no more Lease requests."""
        return self._stopped

    def request_timeout(self) -> float:
        """Return the timeout of the next Lease request, in seconds.

        The retry period; while leading, no later than the renew deadline of the current
        round (the last successful renew, plus the retry period the loop sleeps, plus the
        renew deadline), as client-go cuts its renew requests with a context.
        """
        timeout = self.timings.retry_seconds
        if self._renewed is not None:
            deadline = (
                self._renewed + self.timings.retry_seconds + self.timings.renew_deadline_seconds
            )
            timeout = min(timeout, deadline - time.monotonic())
        return max(MIN_REQUEST_TIMEOUT, timeout)

    def _check(self) -> None:
        if self._stopped:
            raise ElectionStoppedError(self.identity)

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        """``LeaseLock.get``, refused (`ElectionStoppedError`) once stopped."""
        with self._guard:
            self._check()
            result: tuple[bool, Any] = super().get(name, namespace)
            return result

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        """``LeaseLock.create``, refused (`ElectionStoppedError`) once stopped."""
        return self._write(super().create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        """``LeaseLock.update``, refused (`ElectionStoppedError`) once stopped."""
        return self._write(super().update, name, namespace, updated_record)

    def _write(self, write: Callable[[str, str, Any], Any], *args: Any) -> bool:
        """Call ``write`` (create or update); a success is a renew (`renewed`)."""
        with self._guard:
            self._check()
            started = time.monotonic()
            written = bool(write(*args))
            if written:
                self._renewed = started
            return written

    def time_str_to_iso(self, str_time: str) -> datetime.datetime:
        """``LeaseLock.time_str_to_iso``, never on a whole second (see `_micro`)."""
        return _micro(super().time_str_to_iso(str_time))

    def stop(self) -> None:
        """Refuse every later lock call; waits for a Lease request in flight."""
        with self._guard:
            self._stopped = True

    def release(self) -> bool:
        """Stop, then give the Lease up if this candidate holds it.

        As controller-runtime's ``LeaderElectionReleaseOnCancel``: ``holderIdentity`` empty,
        ``leaseDurationSeconds`` 1, ``acquireTime`` and ``renewTime`` now, written with the
        resourceVersion just read (a conflict means someone else wrote it: nothing to give
        up). A standby's next try then takes the Lease.

        Returns
        -------
        bool
            True when the Lease was released; False when another candidate holds it or the
            API refused (logged).
        """
        with self._guard:
            self._stopped = True
            try:
                lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
                spec = lease.spec
                if spec is None or spec.holder_identity != self.identity:
                    return False
                now = _micro(datetime.datetime.now(datetime.UTC))
                spec.holder_identity = ""
                spec.lease_duration_seconds = 1
                spec.acquire_time = now
                spec.renew_time = now
                self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
            except ApiException as exc:
                log.warning(
                    "could not release the Lease %s/%s: %s %s",
                    self.namespace,
                    self.name,
                    exc.status,
                    exc.reason,
                )
                return False
            return True


class OperatorStop:
    """Stops the operator with an error: kopf's stop flag, then exit code 1.

    ``ipam-bridge run`` passes `flag` to ``kopf.run`` as its stop flag and this object in the
    memo (``memo.operator_stop``); after kopf returns, `reason` set means exit 1
    (`LeadershipLostError`). A request hung on an unreachable API server, or an event loop
    held by a blocking call, could keep the process from ending: after ``grace`` seconds it
    is ended with ``os._exit(1)``.
    """

    def __init__(self) -> None:
        self.flag = asyncio.Event()
        self.reason: str | None = None
        self.returned = False
        """Set by ``ipam-bridge run`` once kopf returned (it reports the reason itself)."""
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def arm(self, reason: str, grace: float) -> None:
        """End the process with exit code 1 ``grace`` seconds from now; any thread.

        Only the first call sets `reason` and starts the timer; kopf's flag is not touched
        (it belongs to the event loop: `__call__`).
        """
        with self._lock:
            if self._timer is not None:
                return
            self.reason = reason
            self._timer = threading.Timer(grace, self._exit)
            self._timer.daemon = True
            self._timer.start()

    def __call__(self, reason: str, grace: float) -> None:
        """Stop kopf with ``reason`` (on the event loop); `arm` the exit after ``grace`` s."""
        self.arm(reason, grace)
        self.flag.set()

    def _exit(self) -> None:
        if not self.returned:
            print(f"ipam-bridge: {self.reason}; exiting", file=sys.stderr, flush=True)
        os._exit(1)


def lease_fence(lock: ElectionLock) -> Fence:
    """Return the fence of ``lock``'s holder (`bridge.runtime.fence.Fence`).

    Writes pass while its last successful renew is younger than the renew deadline.
    """
    return Fence(lambda: lock.renewed, lock.timings.renew_deadline_seconds)


class Leadership:
    """One candidate for the Lease, and the work it starts when it leads.

    `start` runs the official election in a daemon thread. When leadership is won,
    ``start_work`` is called on the event loop and the tasks it returns (the work queue, the
    resync) run until leadership is lost or `close` is called. Losing it (no renew within the
    deadline) cancels them at once and calls ``stop_operator``.

    Parameters
    ----------
    lock:
        This candidate's lock.
    start_work:
        Called on the event loop when leadership is won; returns the tasks of the work.
    metrics:
        ``ipam_bridge_leader`` is set to 1 while leading, else 0.
    stop_operator:
        Called on the event loop with a message and a grace period when leadership is lost
        (`OperatorStop`); None: only the work stops (a runner other than ``ipam-bridge run``).
    arm_exit:
        Called from the election's threads with a message and a grace period when
        leadership is lost, before the event loop hears of it (`OperatorStop.arm`): the
        process ends even if the loop is blocked. None: nothing is armed.
    fence:
        The fence of this replica's writes (`bridge.runtime.fence.Fence`); revoked when leadership
        is lost. Default: one on ``lock.renewed`` and the renew deadline.
    kube:
        Where the Events on the Lease are posted (None: no Event).
    run_election:
        Runs the election of a ``kubernetes.leaderelection`` ``Config`` until it returns
        (tests replace it).
    drained:
        Called in a thread on a clean stop once the work ended, before the fence is revoked
        (posts the Events still queued: ``EventRecorder.close``); None: nothing.
    drain_seconds, join_seconds:
        The bounds of a clean stop (`close`): `STOP_DRAIN_SECONDS`, `STOP_JOIN_SECONDS`.
    """

    def __init__(
        self,
        lock: ElectionLock,
        *,
        start_work: Callable[[], Iterable[asyncio.Task[Any]]],
        metrics: Metrics,
        stop_operator: Callable[[str, float], None] | None = None,
        arm_exit: Callable[[str, float], None] | None = None,
        fence: Fence | None = None,
        kube: Kube | None = None,
        run_election: Callable[[Any], None] = lambda c: leaderelection.LeaderElection(c).run(),
        drained: Callable[[], None] | None = None,
        drain_seconds: float = STOP_DRAIN_SECONDS,
        join_seconds: float = STOP_JOIN_SECONDS,
    ) -> None:
        self.lock = lock
        self._drained = drained
        self.drain_seconds = drain_seconds
        self.join_seconds = join_seconds
        self.timings: Timings = lock.timings
        self.fence = fence or lease_fence(lock)
        self._arm_exit = arm_exit
        self._closed = threading.Event()  # set by `close`; ends the renew-deadline thread
        self._start_work = start_work
        self._metrics = metrics
        self._stop_operator = stop_operator
        self._kube = kube
        self._run_election = run_election
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.leading = False
        """True while this replica leads (its work runs)."""
        self.lost: str | None = None
        """Why leadership was lost (or the election failed); None otherwise."""

    @property
    def where(self) -> str:
        """``<namespace>/<name>`` of the Lease."""
        return f"{self.lock.namespace}/{self.lock.name}"

    @property
    def exit_grace(self) -> float:
        """Seconds a replica that lost the Lease has to exit before it is ended.

        Half the time between giving up (retry period + renew deadline after the last renew)
        and the earliest takeover by a standby (the lease duration after it): in-flight
        reconciles that do not finish by then are abandoned, as controller-runtime abandons
        them (every reconcile is level-triggered and safe to redo, ``docs/architecture.md``).
        At least 0.5 s.
        """
        t = self.timings
        return max(0.5, (t.lease_seconds - t.renew_deadline_seconds - t.retry_seconds) / 2)

    def start(self) -> None:
        """Start running for the Lease (call on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._metrics.leader.set(0)
        timings = self.timings
        config = electionconfig.Config(
            self.lock,
            lease_duration=timings.lease_seconds,
            renew_deadline=timings.renew_deadline_seconds,
            retry_period=timings.retry_seconds,
            onstarted_leading=self._started_leading,
            onstopped_leading=lambda: self._lose(self._not_renewed()),
        )
        threading.Thread(
            target=self._elect, args=(config,), name="ipam-bridge-leader-election", daemon=True
        ).start()
        log.info(
            "running for the leader Lease %s as %s; standing by until it is won",
            self.where,
            self.lock.identity,
        )

    # -- the election's thread -----------------------------------------------------------

    def _elect(self, config: Any) -> None:
        try:
            self._run_election(config)
        except ElectionStoppedError:
            log.debug("leader election of %s stopped", self.lock.identity)
        except Exception as exc:
            log.exception("leader election of %s failed", self.lock.identity)
            self._lose(f"leader election failed: {exc}")

    def _started_leading(self) -> None:
        threading.Thread(
            target=self._guard_renewals, name="ipam-bridge-renew-deadline", daemon=True
        ).start()
        self._call_soon(self._on_won)

    def _guard_renewals(self) -> None:
        """Lose leadership at the renew deadline of the current round, to the moment.

        Runs in a thread of its own from the win until `close`. The deadline is client-go's:
        the last successful renew, plus the retry period, plus the renew deadline. The
        official renew loop notices it only after the retry period it sleeps past it, which
        a custom timing could stretch beyond the lease duration.
        """
        t = self.timings
        won = time.monotonic()
        while not self._closed.is_set():
            renewed = self.lock.renewed
            started = renewed if renewed is not None else won
            left = started + t.retry_seconds + t.renew_deadline_seconds - time.monotonic()
            if left <= 0:
                self._lose(self._not_renewed())
                return
            self._closed.wait(min(left, t.retry_seconds))

    def _lose(self, reason: str) -> None:
        """From an election thread: close the fence, arm the exit, then tell the loop."""
        self.fence.revoke(reason)
        if self._arm_exit is not None and not self._closed.is_set():
            self._arm_exit(reason, self.exit_grace)
        self._call_soon(self._on_lost, reason)

    def _not_renewed(self) -> str:
        return (
            f"lost the leader Lease {self.where}: not renewed within "
            f"{self.timings.renew_deadline_seconds:g} s"
        )

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    # -- the event loop --------------------------------------------------------------------

    def _on_won(self) -> None:
        if self._closed.is_set() or self.lost is not None:
            return
        self.leading = True
        self._tasks = list(self._start_work())
        self._metrics.leader.set(1)
        log.info(
            "became the leader (Lease %s, identity %s): handling claims and pools",
            self.where,
            self.lock.identity,
        )
        self._announce("Normal", f"{self.lock.identity} became leader")

    def _on_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        was_leading, self.leading, self.lost = self.leading, False, reason
        self._metrics.leader.set(0)
        for task in self._tasks:  # a loop callback: not called from one of these tasks
            task.cancel()
        if self._closed.is_set():
            log.warning("%s (while stopping)", reason)
            return
        if was_leading:
            self._announce("Warning", f"{self.lock.identity} stopped leading: {reason}")
        stop = self._stop_operator
        then = "exiting (the pod restarts as a standby)" if stop else "restart the operator"
        log.error("%s: stopped handling claims and pools; %s", reason, then)
        if stop is not None:
            stop(reason, self.exit_grace)

    def _announce(self, type: str, message: str) -> None:
        """Post an Event on the Lease, in a thread of its own (never waited for)."""
        kube = self._kube
        if kube is None:
            return
        lease = self.lock.lease_reference
        uid = getattr(getattr(lease, "metadata", None), "uid", None)
        obj = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.lock.name, "namespace": self.lock.namespace, "uid": uid},
        }

        def post() -> None:
            try:
                kube.post_event(obj, type=type, reason=LeaseReason.LEADER_ELECTION, message=message)
            except Exception as exc:
                log.debug("leader election Event not posted: %s", exc)

        threading.Thread(target=post, name="ipam-bridge-leader-event", daemon=True).start()

    async def close(self) -> None:
        """Stop cleanly: the work, then the fence, then the Lease is given up.

        As controller-runtime's manager with ``LeaderElectionReleaseOnCancel``: the work is
        cancelled and its in-flight passes may end within `drain_seconds` (the Lease still
        renewed, writes allowed); then the fence is revoked, so that no write of this
        replica goes out once the Lease is released (the audit's and the purge's included),
        and what did not end is waited for `join_seconds` more (its writes now refused);
        only then is the Lease released (unless leadership was lost: the holder is checked
        on the server, so a standby releases nothing). What still runs after that is
        abandoned (logged): every pass is level-triggered and safe to redo by the next
        leader.
        """
        self._closed.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if not task.cancelling():  # cancelled once (lost): let it finish
                task.cancel()
        pending = await stop_tasks(tasks, self.drain_seconds)
        if not pending and self._drained is not None and self.leading:
            events = asyncio.create_task(asyncio.to_thread(self._drained))
            await stop_tasks([events], STOP_EVENTS_SECONDS)
        self.fence.revoke(f"stopping: the leader Lease {self.where} is being released")
        pending = await stop_tasks(pending, self.join_seconds)
        if pending:
            log.warning(
                "%s did not end within %g s of the stop; abandoned (their writes are refused)",
                ", ".join(sorted(t.get_name() for t in pending)),
                self.drain_seconds + self.join_seconds,
            )
        if self.lost is None:
            released = await asyncio.to_thread(self.lock.release)
            if released:
                log.info("released the leader Lease %s", self.where)
        else:
            await asyncio.to_thread(self.lock.stop)
        self.leading = False
        self._metrics.leader.set(0)
        await asyncio.to_thread(self.lock.client.close)


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], timeout: float) -> set[asyncio.Task[Any]]:
    """Wait up to ``timeout`` seconds for ``tasks`` (cancelled already) to end; return the rest.

    A task that ends by cancellation or an error is done as any other (its exception is
    retrieved, never raised here).
    """
    waiting = set(tasks)
    if not waiting:
        return set()
    done, pending = await asyncio.wait(waiting, timeout=timeout)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning
    return pending
