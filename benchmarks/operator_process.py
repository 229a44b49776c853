"""``ipam-bridge run`` in a process of its own, for the benchmarks: its own GIL, its own RSS.

`OperatorProcess` starts ``python -m benchmarks.operator_process`` with the environment of
the caller (a `mock_kubernetes.sandbox.Sandbox` entered with ``start_operator=False`` puts the
kubeconfig and the ``IPAM_BRIDGE_*`` settings there), so the emulated API server and the mock
IPAM stay in the benchmark's process and the operator runs as it does in a pod. ``SIGUSR1``
starts the wall-clock sampler (`benchmarks.sampler.Sampler`) of the operator's threads,
``SIGUSR2`` writes its figures as JSON to ``$BENCH_PROFILE`` and stops it. With
``$BENCH_CPROFILE`` set to a file, the whole operator run is under cProfile (CPU, for finding
hot spots such as kopf's index barrier, see `bridge.runtime.cache`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from benchmarks.sampler import Sampler

__all__ = ["OperatorProcess", "main"]

PROFILE_ENV = "BENCH_PROFILE"


def _operator_threads(name: str) -> bool:
    return name.startswith("ipam-bridge-worker") or name == "MainThread"


def main() -> int:
    """Run the operator (``ipam-bridge run``) with the sampler behind SIGUSR1/SIGUSR2."""
    from bridge.cli import main as cli_main

    state: dict[str, Any] = {}

    def start(_signum: int, _frame: FrameType | None) -> None:
        sampler = Sampler(_operator_threads)
        state["sampler"] = sampler.__enter__()

    def dump(_signum: int, _frame: FrameType | None) -> None:
        sampler: Sampler | None = state.pop("sampler", None)
        if sampler is None:
            return
        sampler.__exit__(None, None, None)
        path = os.environ.get(PROFILE_ENV)
        if path:
            Path(path).write_text(
                json.dumps({"top": sampler.top(18), "idle": sampler.wait_share()}),
                encoding="utf-8",
            )

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)
    return cli_main(["run"])


def _memory_kib(pid: int) -> dict[str, int]:
    """Return ``VmRSS`` and ``VmHWM`` (peak) of a process in KiB (Linux ``/proc``)."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


class OperatorProcess:
    """The operator in a child process (a context manager: started on entry, SIGTERM on exit).

    Parameters
    ----------
    profile:
        A file for the sampler's JSON (see the module docstring); None: no profile.
    log:
        A file for the operator's output (default: discarded).
    """

    def __init__(self, profile: Path | None = None, log: Path | None = None) -> None:
        self.profile = profile
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> Self:
        env = dict(os.environ, IPAM_BRIDGE_LOG_LEVEL="WARNING")
        if self.profile is not None:
            env[PROFILE_ENV] = str(self.profile)
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.started = time.monotonic()
        cprofile = os.environ.get("BENCH_CPROFILE")  # a file: the whole run under cProfile
        command = [sys.executable, "-m", "benchmarks.operator_process"]
        if cprofile:
            command[1:1] = ["-m", "cProfile", "-o", cprofile]
        self.process = subprocess.Popen(
            command,
            env=env,
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

    def stop_profile(self, timeout: float = 5.0) -> dict[str, Any]:
        """Stop sampling; return ``{"top": [[place, share], ...], "idle": share}`` (or {})."""
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
        return {k: v / 1024 for k, v in _memory_kib(self.process.pid).items()}


if __name__ == "__main__":
    sys.exit(main())
