"""Trace claims' releases from the claim's deletion to its finalizer removal, step by step.

``python -m benchmarks --only trace-release``: the operator in a process of its own
(`benchmarks.operator_process.OperatorProcess`, as in the hot-path benchmark) against the
in-memory API server and a mock phpIPAM with latencies (``--trace-latency``, default IPAM
40 ms, API reads 3 ms and writes 10 ms, as ``--hot-runs``' realistic run) binds ``claims``
claims, then they are deleted at once, as the hot-path benchmark does. The operator writes
the DEBUG lines of `benchmarks.operator_process.TRACE_LOGGERS` to a file of its own (its
own log stays at INFO); no line is logged, nor any time read, when DEBUG is off:

- the work queue (`bridge.runtime.workqueue`): a key queued, not queued (the echo of our
  write), woken by a token, handed to a worker by the event loop, a pass starting in its
  worker thread, the pass's decision, the pass over (the event loop took the result);
- the expectations (`bridge.runtime.expectations`): each watch event of a claim or an
  IPAddress (its version, and whether it was our write's), each write's answered version;
- each API request (`bridge.runtime.rest`) and each IPAM request (`backends.transport`):
  method, path, status and seconds, in the worker thread of the pass that sent it;
- the claim reconciler's release decisions (`bridge.reconcilers.claims`).

Each line carries its POSIX time and thread. A claim's timeline starts when the benchmark's
DELETE of it returned (the API server set its ``deletionTimestamp``) and holds, in order,
the steps of its passes (a request's "sent" time is its answer's time less its seconds).
The report gives, for each step, how long after the previous step of the same claim it
came (median, p90 and count over the claims that had it), the passes per release, and
the whole release (deletion to the finalizer removal answered, and to the claim's DELETED
event seen). Figures only; nothing passes or fails.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import CREDENTIALS, SUBNET_ID, percentile, seed_for, table
from benchmarks.hot_path import NAMESPACE, _bound, _settle, under_load
from benchmarks.operator_process import OperatorProcess
from bridge.capi import GROUP
from mock_kubernetes.sandbox import Sandbox
from mock_phpipam.server import MockPhpipamServer
from mock_phpipam.store import Store

__all__ = ["TraceResult", "format_result", "parse_trace", "run_trace_release"]

_KEY = re.compile(r"ClaimKey\(namespace='([^']*)', name='([^']*)'\)")
_EXPECTATION = re.compile(r"\('(ipaddressclaims|ipaddresses)', '([^']*)', '([^']*)'\)")
_REQUEST = re.compile(r"^(?:phpIPAM |Infoblox )?(\S+) (\S+) -> (\d+) in ([0-9.]+)s$")
_API_PATH = re.compile(r"/namespaces/[^/]+/(ipaddressclaims|ipaddresses)/[^/?]+(/status)?")


@dataclass
class Step:
    """One step of a claim's release: its POSIX time and what it was."""

    at: float
    label: str


@dataclass
class TraceResult:
    """The steps of each traced release (see the module docstring)."""

    claims: int
    latency_ms: float
    api_ms: tuple[float, float]
    seconds: float = 0.0  # the release phase: first deletion to every claim gone
    timelines: dict[str, list[Step]] = field(default_factory=dict)  # by claim name
    lines: int = 0  # trace lines read
    workdir: Path | None = None  # trace.log, operator.log, timelines.json (every step)


def _key_name(text: str) -> str | None:
    found = _KEY.search(text)
    return found.group(2) if found else None


def _decision(text: str) -> str:
    """Name a pass's decision (`bridge.runtime.workqueue.Result`'s repr)."""
    if "wake_on=()" in text:
        return "done" if "after=None" in text else "requeued after a delay"
    if "EndpointToken" in text:
        return "parked for an IPAM place"
    if "'expectation'" in text:
        return "parked for our write's echo"
    return "parked"


def _woken_by(text: str) -> str:
    if "EndpointToken" in text:
        return "woken: an IPAM place"
    if "'expectation'" in text:
        return "woken: our write's echo"
    return "woken"


def _request_label(logger: str, method: str, what: str) -> str:
    """Name an API or IPAM request (``what``: the URL or the IPAM client's path)."""
    if logger == "backends.transport":
        if "search" in what:
            return "IPAM search"
        return "IPAM delete" if method == "DELETE" else f"IPAM {method} {what}"
    found = _API_PATH.search(what)
    if found is None:
        return f"API {method} {what}"
    resource = found.group(1) + (found.group(2) or "")
    return f"API {method} {resource}"


def parse_trace(lines: Iterable[str], deleted: dict[str, float]) -> dict[str, list[Step]]:
    """Return each deleted claim's steps from the operator's trace lines.

    Parameters
    ----------
    lines:
        The trace file's lines (`benchmarks.operator_process.TRACE_FORMAT`).
    deleted:
        The POSIX time each claim's DELETE returned, by claim name: only later lines of
        that claim count.

    Returns
    -------
    dict
        By claim name, its steps in time order, the first being ``deleted``. A request of a
        worker thread belongs to the claim whose pass runs in that thread.
    """
    timelines: dict[str, list[Step]] = {n: [Step(t, "deleted")] for n, t in deleted.items()}
    running: dict[str, str] = {}  # thread -> claim whose pass runs in it
    parked: set[str] = set()  # claims whose last pass parked for an IPAM place

    def add(name: str | None, at: float, label: str) -> None:
        if name is not None and name in deleted and at >= deleted[name]:
            timelines[name].append(Step(at, label))

    for line in lines:
        parts = line.rstrip("\n").split("\t", 3)
        if len(parts) != 4:
            continue
        at, thread, logger, message = float(parts[0]), parts[1], parts[2], parts[3]
        if logger == "bridge.runtime.workqueue":
            name = _key_name(message)
            if message.startswith("pass of ") and " starts" in message:
                if name is not None:
                    running[thread] = name
                add(name, at, "pass starts (worker)")
            elif message.startswith("pass of ") and " decided " in message:
                running.pop(thread, None)
                decision = _decision(message)
                if decision == "parked for an IPAM place" and name is not None:
                    parked.add(name)
                add(name, at, "pass decided: " + decision)
            elif message.startswith("pass of ") and message.endswith(" over"):
                add(name, at, "pass over (event loop)")
            elif " queued, due in " in message:
                woken = name in parked
                parked.discard(name or "")
                add(name, at, "queued: a place freed" if woken else "queued")
            elif " not queued" in message:
                add(name, at, "not queued (our echo)")
            elif " woken by " in message:
                add(name, at, _woken_by(message))
            elif message.endswith(" handed to a worker"):
                add(name, at, "handed to a worker (event loop)")
        elif logger == "bridge.runtime.expectations":
            found = _EXPECTATION.search(message)
            if found is None or not message.startswith("observed "):
                continue
            plural = found.group(1)
            what = "claim" if plural == "ipaddressclaims" else "IPAddress"
            gone = "version gone" in message
            ours = message.endswith("(ours)")
            label = f"event: {what} {'DELETED' if gone else 'changed'}{' (ours)' if ours else ''}"
            add(found.group(3) if plural == "ipaddressclaims" else None, at, label)
        elif logger in ("bridge.runtime.rest", "backends.transport"):
            request = _REQUEST.match(message)
            name = running.get(thread)
            if request is None or name is None:
                continue
            method, what, seconds = request.group(1), request.group(2), float(request.group(4))
            label = _request_label(logger, method, what)
            add(name, at - seconds, f"{label} sent")
            add(name, at, f"{label} answered")
        elif logger == "bridge.reconcilers.claims" and message.startswith("release of claim "):
            name = message.removeprefix("release of claim ").split(":", 1)[0].split("/")[-1]
            decision = message.split(": ", 2)[1] if message.count(": ") >= 2 else "?"
            add(name, at, f"release logged: {decision}")
    for steps in timelines.values():
        steps.sort(key=lambda s: s.at)
    return timelines


def run_trace_release(
    claims: int,
    workers: int,
    *,
    latency_ms: float = 40.0,
    api_ms: tuple[float, float] = (3.0, 10.0),
    timeout: float = 180.0,
    source: Path | None = None,
) -> TraceResult:
    """Bind ``claims`` claims, delete them at once, and trace their releases.

    ``latency_ms`` is added by the mock phpIPAM before every answer and ``api_ms`` (reads,
    writes) by the in-memory API server, as in `benchmarks.hot_path.run_hot_path`;
    ``workers`` is ``IPAM_BRIDGE_WORKERS``; ``source`` runs another checkout's operator
    (its trace holds only the lines its code logs).

    Raises
    ------
    TimeoutError
        When the claims are not all bound (or gone) within ``timeout`` seconds.
    """
    result = TraceResult(claims, latency_ms, api_ms)
    settings = {
        "IPAM_BRIDGE_WORKERS": str(workers),
        "IPAM_BRIDGE_POOL_REFRESH_SECONDS": "3600",
        "IPAM_BRIDGE_RESYNC_SECONDS": "0",
    }
    workdir = Path(tempfile.mkdtemp(prefix="ipam-bridge-trace-"))
    trace = workdir / "trace.log"
    names = [f"t-{i:05d}" for i in range(claims)]
    deleted: dict[str, float] = {}
    with (
        MockPhpipamServer(Store(seed_for(claims))) as phpipam,
        Sandbox(settings=settings, start_operator=False) as sandbox,
    ):
        sandbox.namespace(NAMESPACE)
        sandbox.phpipam_pool(
            NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=SUBNET_ID, credentials=CREDENTIALS
        )
        since = len(sandbox.kube.access_log.records())
        with OperatorProcess(log=workdir / "operator.log", source=source, trace=trace):
            under_load(sandbox, phpipam, since, latency_ms, api_ms)
            for name in names:
                sandbox.claim(NAMESPACE, name, "pool")
            deadline = time.monotonic() + timeout
            while sum(1 for c in sandbox.claims(NAMESPACE) if _bound(c)) < claims:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {claims} claims are not all bound")
                time.sleep(0.05)
            _settle(sandbox)
            start = time.monotonic()
            for name in names:
                sandbox.delete_object(
                    f"{GROUP}/{sandbox.version}", "ipaddressclaims", name, NAMESPACE
                )
                deleted[name] = time.time()
            sandbox.wait_gone(NAMESPACE, timeout=timeout)
            result.seconds = time.monotonic() - start
            _settle(sandbox)
    text = trace.read_text(encoding="utf-8").splitlines()
    result.lines = len(text)
    result.timelines = parse_trace(text, deleted)
    result.workdir = workdir
    (workdir / "timelines.json").write_text(
        json.dumps(
            {
                name: [[round(s.at - steps[0].at, 6), s.label] for s in steps]
                for name, steps in result.timelines.items()
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    return result


def _figures(values: Sequence[float]) -> list[float | int]:
    """Median and p90 in ms, and the count."""
    ms = sorted(1000 * v for v in values)
    return [statistics.median(ms), percentile(ms, 0.9), len(ms)]


def _first(steps: Sequence[Step], label: str, after: float | None) -> float | None:
    """Return the time of the first step whose label starts with ``label`` at/after ``after``."""
    if after is None:
        return None
    return next((s.at for s in steps if s.at >= after and s.label.startswith(label)), None)


def _moments(steps: Sequence[Step]) -> dict[str, float | None]:
    """Name the moments of one claim's release (the keys `SPANS` and `WHOLE` use).

    The first pass (from the claim's deletion); when it parked for an IPAM place, the wake
    and the pass that followed; the releasing pass (the last to start) and its requests.
    """
    first = _first
    m: dict[str, float | None] = {"deleted": steps[0].at}
    m["event"] = first(steps, "event: claim changed", m["deleted"])
    m["queued"] = first(steps, "queued", m["event"])
    m["handed"] = first(steps, "handed to a worker", m["queued"])
    m["starts"] = first(steps, "pass starts", m["handed"])
    m["decided"] = first(steps, "pass decided", m["starts"])
    m["over"] = first(steps, "pass over", m["decided"])
    parked = _first(steps, "pass decided: parked for an IPAM place", m["starts"])
    if parked is not None and parked == m["decided"]:
        m["woken"] = first(steps, "queued: a place freed", m["over"])
        m["woken handed"] = first(steps, "handed to a worker", m["woken"])
        m["woken starts"] = first(steps, "pass starts", m["woken handed"])
    starts = [s.at for s in steps if s.label.startswith("pass starts")]
    m["last starts"] = starts[-1] if starts else None
    for label in (
        "IPAM search sent",
        "IPAM search answered",
        "IPAM delete sent",
        "IPAM delete answered",
        "API PATCH ipaddresses sent",
        "API PATCH ipaddresses answered",
        "API DELETE ipaddresses sent",
        "API DELETE ipaddresses answered",
        "API PATCH ipaddressclaims sent",
        "API PATCH ipaddressclaims answered",
    ):
        # A request's sent time is estimated (its log time less its seconds): 5 ms of slack.
        since = m["last starts"]
        m[label] = first(steps, label, None if since is None else since - 0.005)
    m["last decided"] = first(steps, "pass decided", m["API PATCH ipaddressclaims answered"])
    m["last over"] = first(steps, "pass over", m["last decided"])
    m["claim DELETED"] = first(steps, "event: claim DELETED", m["API PATCH ipaddressclaims sent"])
    return m


#: The spans of a release, in order: (name, from moment, to moment) of `_moments`. The
#: "parked" rows count only the claims whose first pass was refused a place at the IPAM.
SPANS: tuple[tuple[str, str, str], ...] = (
    ("watch: deletion -> claim event seen", "deleted", "event"),
    ("sink: event -> key queued", "event", "queued"),
    ("queue: queued -> handed to a worker", "queued", "handed"),
    ("executor: handed -> first pass starts", "handed", "starts"),
    ("first pass: starts -> decided", "starts", "decided"),
    ("loop: decided -> pass over", "decided", "over"),
    ("parked: pass over -> woken for a place", "over", "woken"),
    ("parked: woken -> handed to a worker", "woken", "woken handed"),
    ("parked: handed -> pass starts", "woken handed", "woken starts"),
    ("releasing pass: starts -> IPAM search sent", "last starts", "IPAM search sent"),
    ("IPAM search (a place held)", "IPAM search sent", "IPAM search answered"),
    ("search answered -> IPAM delete sent", "IPAM search answered", "IPAM delete sent"),
    ("IPAM delete (a place held)", "IPAM delete sent", "IPAM delete answered"),
    ("IPAM answered -> PATCH IPAddress sent", "IPAM delete answered", "API PATCH ipaddresses sent"),
    (
        "PATCH IPAddress (ProtectAddress off)",
        "API PATCH ipaddresses sent",
        "API PATCH ipaddresses answered",
    ),
    (
        "answered -> DELETE IPAddress sent",
        "API PATCH ipaddresses answered",
        "API DELETE ipaddresses sent",
    ),
    ("DELETE IPAddress", "API DELETE ipaddresses sent", "API DELETE ipaddresses answered"),
    (
        "answered -> PATCH claim sent",
        "API DELETE ipaddresses answered",
        "API PATCH ipaddressclaims sent",
    ),
    (
        "PATCH claim (ReleaseAddress off)",
        "API PATCH ipaddressclaims sent",
        "API PATCH ipaddressclaims answered",
    ),
    ("answered -> pass decided (done)", "API PATCH ipaddressclaims answered", "last decided"),
    ("loop: decided -> pass over", "last decided", "last over"),
    (
        "echo: finalizer off -> claim DELETED seen",
        "API PATCH ipaddressclaims answered",
        "claim DELETED",
    ),
)

#: The whole release, from the claim's deletion to a moment of `_moments`.
WHOLE: tuple[tuple[str, str], ...] = (
    ("deletion -> releasing pass starts", "last starts"),
    ("deletion -> IPAM search sent", "IPAM search sent"),
    ("deletion -> claim finalizer removal answered", "API PATCH ipaddressclaims answered"),
    ("deletion -> claim DELETED seen", "claim DELETED"),
)


def _spans(
    moments: Sequence[dict[str, float | None]], spans: Iterable[tuple[str, str, str]]
) -> list[list[object]]:
    rows: list[list[object]] = []
    for name, start, end in spans:
        values = [
            b - a
            for m in moments
            if (a := m.get(start)) is not None and (b := m.get(end)) is not None
        ]
        if values:
            rows.append([name, *_figures(values)])
    return rows


def format_result(result: TraceResult) -> str:
    """Return the trace's report: each span of a release, the passes, the whole release."""
    timelines = {n: s for n, s in result.timelines.items() if len(s) > 1}
    passes = [
        sum(1 for s in steps if s.label.startswith("pass starts")) for steps in timelines.values()
    ]
    moments = [_moments(steps) for steps in timelines.values()]
    spans = _spans(moments, SPANS)
    whole = _spans(moments, [(name, "deleted", end) for name, end in WHOLE])
    counts = ", ".join(
        f"{n} pass{'es' if n != 1 else ''}: {passes.count(n)}" for n in sorted(set(passes))
    )
    return (
        f"(t) release trace: {result.claims} claims deleted at once, IPAM latency "
        f"{result.latency_ms:g} ms, API latency {result.api_ms[0]:g}/{result.api_ms[1]:g} ms; "
        f"all gone in {result.seconds:.2f} s ({result.claims / result.seconds:.1f} claims/s "
        f"with DEBUG tracing on); {result.lines} trace lines, {len(timelines)} claims traced; "
        f"passes per release: {counts}\n"
        "each span of a release, in order (ms; a request's sent time is its log time less its "
        "seconds, so gaps next to a request may read a fraction of a ms below 0)\n"
        + table(["span", "median ms", "p90 ms", "claims"], spans)
        + "\n\nthe whole release:\n"
        + table(["span", "median ms", "p90 ms", "claims"], whole)
        + f"\n(every claim's steps: {result.workdir}/timelines.json; the operator's trace lines: "
        "trace.log beside it)"
    )
