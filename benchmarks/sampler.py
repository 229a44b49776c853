"""A wall-clock sampling profiler of chosen threads: where the time of one claim goes.

cProfile sees only the thread it runs in and CPU-bound frames; a claim's time is mostly
spent waiting (HTTP to the API server, HTTP to the IPAM, a lock, an idle worker). The
sampler looks at the stacks of the operator's threads every few milliseconds
(``sys._current_frames``) and counts, per sample and thread, the innermost frame of the
project's own code (``bridge/``, ``backends/``) with the library call it is in, so that
"waiting in ``Kube.get_claim`` (urllib3)" and "running ``capi.claim_status``" are told apart.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self

__all__ = ["Sampler"]

_ROOT = Path(__file__).resolve().parents[1]
_OURS = tuple(str(_ROOT / d) for d in ("bridge", "backends"))
_SKIP = (str(_ROOT / "sandbox"),)


def _ours(filename: str) -> bool:
    return filename.startswith(_OURS) and not filename.startswith(_SKIP)


def _where(frame: FrameType | None) -> tuple[str, str]:
    """Return (innermost project function, the library it is waiting in) of a stack."""
    leaf = frame
    library = ""
    while frame is not None:
        code = frame.f_code
        if _ours(code.co_filename):
            rel = Path(code.co_filename).relative_to(_ROOT).with_suffix("")
            return f"{'.'.join(rel.parts)}.{code.co_qualname}", library
        if not library and leaf is not None:
            module = frame.f_globals.get("__name__", "?")
            library = str(module).split(".", 1)[0]
        frame = frame.f_back
    return "", library


class _Periodic:
    """A daemon thread that runs ``_run`` from ``with`` to the end of the block."""

    def __init__(self, name: str, interval: float) -> None:
        self._name = name
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError


class Sampler(_Periodic):
    """Sample the stacks of the threads ``select`` accepts (by name) every ``interval`` s.

    Use as a context manager around the measured phase; `top` returns the figures.

    Parameters
    ----------
    select:
        Called with a thread's name; True to sample it.
    interval:
        Seconds between samples (the GIL makes the real rate lower under load).
    """

    def __init__(self, select: Callable[[str], bool], interval: float = 0.005) -> None:
        self._select = select
        super().__init__("bench-sampler", interval)
        self.samples: Counter[str] = Counter()
        self.thread_samples = 0

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self._interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me or not self._select(names.get(ident, "")):
                    continue
                where, library = _where(frame)
                label = (where or "(idle: no project frame)") + (
                    f"  [in {library}]" if library else ""
                )
                self.samples[label] += 1
                self.thread_samples += 1

    def top(self, n: int = 15) -> list[tuple[str, float]]:
        """Return the ``n`` most sampled places with their share of all thread samples."""
        total = self.thread_samples or 1
        return [(label, count / total) for label, count in self.samples.most_common(n)]

    def wait_share(self) -> float:
        """Share of samples spent idle (a worker thread with no project frame: no work)."""
        total = self.thread_samples or 1
        idle = sum(c for label, c in self.samples.items() if label.startswith("(idle"))
        return idle / total


class CpuSampler(_Periodic):
    """Sample every thread's stack, weighted by the CPU time it used since the last sample.

    A statistical CPU profile without a profiler's per-call cost (which inflates code made of
    many small calls): every ``interval`` seconds each thread's CPU clock
    (``time.pthread_getcpuclockid``) is read, and the CPU it used since the last look is
    credited to the functions on its stack now: to the innermost one (own) and to each one
    on the stack (cumulative). Use as a context manager; `figures` returns the tables.
    """

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__("bench-cpu-sampler", interval)
        self.own: dict[str, float] = {}
        self.cumulative: dict[str, float] = {}
        self.total = 0.0

    @staticmethod
    def _label(frame: FrameType) -> str:
        code = frame.f_code
        path = Path(code.co_filename)
        parts = path.parts
        where = path.name
        for marker in ("site-packages", "bridge", "backends", "mock_kubernetes"):
            if marker in parts[:-1]:
                where = "/".join(parts[parts.index(marker) + (marker == "site-packages") :])
                break
        return f"{where}:{code.co_qualname}"

    def _run(self) -> None:
        import time

        me = threading.get_ident()
        last: dict[int, float] = {}
        while not self._stop.wait(self._interval):
            frames = sys._current_frames()
            for thread in threading.enumerate():
                ident = thread.ident
                if ident is None or ident == me or thread.native_id is None:
                    continue
                try:
                    clock = time.pthread_getcpuclockid(ident)
                    now = time.clock_gettime(clock)
                except OSError:
                    continue
                used = now - last.get(ident, now)
                last[ident] = now
                frame = frames.get(ident)
                if used <= 0 or frame is None:
                    continue
                self.total += used
                leaf = self._label(frame)
                self.own[leaf] = self.own.get(leaf, 0.0) + used
                seen: set[str] = set()
                while frame is not None:
                    label = self._label(frame)
                    if label not in seen:
                        seen.add(label)
                        self.cumulative[label] = self.cumulative.get(label, 0.0) + used
                    frame = frame.f_back

    def figures(self, n: int = 15) -> dict[str, object]:
        """Return ``{"cpu": s, "own": [[label, s]...], "cumulative": [[label, s]...]}``."""
        return {
            "cpu": self.total,
            "own": sorted(self.own.items(), key=lambda kv: -kv[1])[:n],
            "cumulative": sorted(self.cumulative.items(), key=lambda kv: -kv[1])[:n],
        }
