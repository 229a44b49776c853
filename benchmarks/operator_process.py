"""``ipam-bridge run`` in a process of its own, for the benchmarks: its own GIL, its own RSS.

`OperatorProcess` starts ``python -m benchmarks.operator_process`` with the environment of
the caller (a `mock_kubernetes.sandbox.Sandbox` entered with ``start_operator=False`` puts the
kubeconfig and the ``IPAM_BRIDGE_*`` settings there), so the emulated API server and the mock
IPAM stay in the benchmark's process and the operator runs as it does in a pod: the
emulator's and the mocks' CPU is never counted in the operator's (`cpu_seconds` reads the
child's own ``/proc/<pid>/stat``).

``SIGUSR1`` starts profiling, ``SIGUSR2`` writes the figures as JSON to ``$BENCH_PROFILE``
and stops it: with ``$BENCH_PROFILER=yappi``, yappi's CPU-clock profile of every thread
(https://github.com/sumerc/yappi: functions by cumulative and by own CPU time, own CPU time
by package); with ``cpu-sampler``, stacks sampled and weighted by each thread's CPU clock
(`benchmarks.sampler.CpuSampler`); otherwise the wall-clock sampler
(`benchmarks.sampler.Sampler`) of the operator's threads. ``$BENCH_YAPPI_DUMP`` keeps each
yappi profile whole, in pstat format. With ``$BENCH_CPROFILE`` set to a file, the whole
operator run is under cProfile (main thread only).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from benchmarks.common import cpu_seconds, memory_kib
from benchmarks.sampler import CpuSampler, Sampler

__all__ = ["OperatorProcess", "main"]

PROFILE_ENV = "BENCH_PROFILE"
PROFILER_ENV = "BENCH_PROFILER"
#: A file name prefix: each yappi profile is also saved in pstat format as ``PREFIX.<n>``.
DUMP_ENV = "BENCH_YAPPI_DUMP"
#: A file: the DEBUG lines of `TRACE_LOGGERS` go there, one per line (`trace_logging`).
TRACE_ENV = "BENCH_TRACE"
#: The loggers whose DEBUG lines trace a claim's passes: the work queue (queued, woken,
#: handed to a worker, each pass's start and decision), the expectations (each write's
#: version, each watch event), each API request, each IPAM request, the claim reconciler.
TRACE_LOGGERS = (
    "bridge.runtime.workqueue",
    "bridge.runtime.expectations",
    "bridge.runtime.rest",
    "backends.transport",
    "bridge.reconcilers.claims",
)
#: The format of a trace line: POSIX time, thread, logger, message, tab-separated.
TRACE_FORMAT = "%(created).6f\t%(threadName)s\t%(name)s\t%(message)s"
_DUMPS = itertools.count(1)
#: How many functions each list of a yappi profile keeps.
TOP = 15


_ROOT = Path(__file__).resolve().parents[1]


def _package(module: str) -> str:
    """Return where a yappi module (a file name, or a C module's name) belongs.

    A third-party package's name, ``stdlib <module>``, ``bridge``/``backends`` (ours), or
    the C module's own name (``builtins``, ``_json``...).
    """
    path = Path(module)
    parts = path.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts[:-1]:
            return parts[parts.index(marker) + 1].removesuffix(".py")
    if path.is_absolute() and path.is_relative_to(_ROOT):
        top, *rest = path.relative_to(_ROOT).parts
        # sandbox/ holds packages (mock_kubernetes, ...): name the package.
        return (rest[0] if top == "sandbox" and rest else top).removesuffix(".py")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("python3"):
            return "stdlib " + parts[i + 1].removesuffix(".py")
    return module


class _Yappi:
    """yappi on every thread with the CPU clock (``yappi.set_clock_type("cpu")``)."""

    def __init__(self) -> None:
        import yappi  # type: ignore[import-untyped]

        self._yappi = yappi

    def start(self) -> None:
        yappi = self._yappi
        yappi.set_clock_type("cpu")
        yappi.clear_stats()
        yappi.start(builtins=True, profile_threads=True)

    def figures(self) -> dict[str, Any]:
        yappi = self._yappi
        yappi.stop()
        raw = yappi.get_func_stats()
        dump = os.environ.get(DUMP_ENV)
        if dump:  # the whole profile, for pstats (``python -m pstats FILE``)
            raw.save(f"{dump}.{next(_DUMPS)}", type="pstat")
        stats = list(raw)
        thread_cpu = sum(t.ttot for t in yappi.get_thread_stats())
        yappi.clear_stats()

        def row(f: Any) -> list[Any]:
            place = f"{Path(f.module).name}:{f.lineno} {f.name}"
            return [place, _package(f.module), f.ncall, f.ttot, f.tsub]

        by_package: dict[str, float] = {}
        for f in stats:
            key = _package(f.module)
            by_package[key] = by_package.get(key, 0.0) + f.tsub
        return {
            "cpu": thread_cpu,
            "cumulative": [row(f) for f in sorted(stats, key=lambda f: -f.ttot)[:TOP]],
            "own": [row(f) for f in sorted(stats, key=lambda f: -f.tsub)[:TOP]],
            "packages": sorted(by_package.items(), key=lambda kv: -kv[1])[:TOP],
        }


def trace_logging(path: str) -> None:
    """Send the DEBUG lines of `TRACE_LOGGERS` to ``path`` only (`TRACE_FORMAT`).

    The loggers stop propagating, so the operator's own log keeps its level and format;
    the operator's logging set-up (`bridge.cli`) leaves named loggers' levels alone.
    """
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(TRACE_FORMAT))
    for name in TRACE_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        logger.propagate = False


def _operator_threads(name: str) -> bool:
    return name.startswith("ipam-bridge-worker") or name == "MainThread"


def main() -> int:
    """Run the operator (``ipam-bridge run``) with the sampler behind SIGUSR1/SIGUSR2."""
    from bridge.cli import main as cli_main

    state: dict[str, Any] = {}
    use_yappi = os.environ.get(PROFILER_ENV) == "yappi"

    def start(_signum: int, _frame: FrameType | None) -> None:
        if os.environ.get(PROFILER_ENV) == "cpu-sampler":
            state["cpu"] = CpuSampler().__enter__()
            return
        if use_yappi:
            profiler = _Yappi()
            profiler.start()
            state["yappi"] = profiler
            return
        sampler = Sampler(_operator_threads)
        state["sampler"] = sampler.__enter__()

    def dump(_signum: int, _frame: FrameType | None) -> None:
        found: dict[str, Any] | None = None
        profiler: _Yappi | None = state.pop("yappi", None)
        if profiler is not None:
            found = profiler.figures()
        cpu: CpuSampler | None = state.pop("cpu", None)
        if cpu is not None:
            cpu.__exit__(None, None, None)
            found = cpu.figures(80)
        sampler: Sampler | None = state.pop("sampler", None)
        if sampler is not None:
            sampler.__exit__(None, None, None)
            found = {"top": sampler.top(18), "idle": sampler.wait_share()}
        path = os.environ.get(PROFILE_ENV)
        if path and found is not None:
            Path(path).write_text(json.dumps(found), encoding="utf-8")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)
    trace = os.environ.get(TRACE_ENV)
    if trace:
        trace_logging(trace)
    return cli_main(["run"])


class OperatorProcess:
    """The operator in a child process (a context manager: started on entry, SIGTERM on exit).

    Parameters
    ----------
    profile:
        A file for the profile's JSON (see the module docstring); None: no profile.
    log:
        A file for the operator's output (default: discarded).
    log_level:
        ``IPAM_BRIDGE_LOG_LEVEL`` of the operator (None: its default, INFO, as in a pod).
    profiler:
        ``"sampler"`` (wall-clock samples of the operator's threads), ``"yappi"`` (CPU
        profile of every thread) or ``"cpu-sampler"`` (CPU-weighted stack samples).
    source:
        Another checkout of this repository (``git worktree add DIR REV``) whose operator
        runs instead of this tree's: the process starts in it, with it first on
        ``PYTHONPATH``, so ``bridge``, ``backends`` and ``benchmarks.operator_process`` are
        imported from it (None: this tree's).
    trace:
        A file for the DEBUG lines of `TRACE_LOGGERS` (`trace_logging`; None: no trace).
    """

    def __init__(
        self,
        profile: Path | None = None,
        log: Path | None = None,
        *,
        log_level: str | None = "WARNING",
        profiler: str = "sampler",
        source: Path | None = None,
        trace: Path | None = None,
    ) -> None:
        self.source = source
        self.trace = trace
        self.profile = profile
        self.log = log
        self.log_level = log_level
        self.profiler = profiler
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> Self:
        env = dict(os.environ)
        env.pop("IPAM_BRIDGE_LOG_LEVEL", None)
        if self.log_level is not None:
            env["IPAM_BRIDGE_LOG_LEVEL"] = self.log_level
        env[PROFILER_ENV] = self.profiler
        if self.profile is not None:
            env[PROFILE_ENV] = str(self.profile)
        env.pop(TRACE_ENV, None)
        if self.trace is not None:
            env[TRACE_ENV] = str(self.trace)
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.source), *filter(None, [env.get("PYTHONPATH")])]
            )
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.started = time.monotonic()
        cprofile = os.environ.get("BENCH_CPROFILE")  # a file: the whole run under cProfile
        command = [sys.executable, "-m", "benchmarks.operator_process"]
        if cprofile:
            command[1:1] = ["-m", "cProfile", "-o", cprofile]
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=self.source,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _signal(self, signum: int) -> None:
        if self.process is not None:
            self.process.send_signal(signum)

    def start_profile(self) -> None:
        """Start sampling the operator's threads."""
        self._signal(signal.SIGUSR1)

    def stop_profile(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop profiling; return its figures (or {}).

        The sampler's: ``{"top": [[place, share], ...], "idle": share}``; yappi's:
        ``{"cpu": seconds, "cumulative": rows, "own": rows, "packages": [[name, seconds]]}``,
        a row being ``[place, package, calls, cumulative s, own s]``.
        """
        if self.profile is None:
            return {}
        self.profile.unlink(missing_ok=True)
        self._signal(signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.profile.exists() and self.profile.stat().st_size:
                time.sleep(0.05)
                loaded: dict[str, Any] = json.loads(self.profile.read_text(encoding="utf-8"))
                return loaded
            time.sleep(0.05)
        return {}

    def memory_mib(self) -> dict[str, float]:
        """Return the operator's RSS now and its peak, in MiB."""
        if self.process is None:
            return {}
        return {k: v / 1024 for k, v in memory_kib(self.process.pid).items()}

    def cpu_seconds(self) -> float:
        """Return the CPU seconds (user + system, all threads) the operator used so far."""
        if self.process is None:
            return 0.0
        return cpu_seconds(self.process.pid)

    def loop_cpu_seconds(self) -> float:
        """Return the CPU seconds (user + system) of the operator's main thread so far.

        The main thread runs kopf's event loop: the watches, kopf's processing of each watch
        event, the event handlers and the work queue's dispatch (the reconciles run in the
        worker threads). Read from ``/proc/<pid>/task/<pid>/stat``, fields 14 and 15
        (https://man7.org/linux/man-pages/man5/proc.5.html).
        """
        if self.process is None:
            return 0.0
        pid = self.process.pid
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text(encoding="utf-8")
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
