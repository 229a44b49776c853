"""BackendCache under threads: one build per key, no client closed while a worker holds it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import pytest

from backends.base import IPAMBackend
from bridge.reconcilers.backend_clients import BackendCache

KEY = ("ns", "PHPIPAMIPPool", "pool", "")
WAIT = 10.0  # generous: the machine is loaded


class FakeBackend:
    """A backend that only knows whether it was closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def make(name: str) -> Callable[[], IPAMBackend]:
    """Return a build of a `FakeBackend` named ``name``."""
    return lambda: cast(IPAMBackend, FakeBackend(name))


def fake(backend: IPAMBackend | None) -> FakeBackend:
    assert isinstance(backend, FakeBackend)
    return backend


class SlowBuilds:
    """Builds that block until released, counting how many were started."""

    def __init__(self) -> None:
        self.started = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.error: Exception | None = None

    def __call__(self) -> IPAMBackend:
        with self.lock:
            self.started += 1
            n = self.started
        assert self.release.wait(WAIT)
        if self.error is not None:
            raise self.error
        return cast(IPAMBackend, FakeBackend(f"b{n}"))


def in_threads(count: int, target: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            value = target()
        except BaseException as exc:  # collected for the assertion
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(value)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    return results, errors


def wait_until(predicate: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError("condition not met in time")


def test_threads_missing_at_once_build_one_client_and_share_it() -> None:
    cache = BackendCache()
    build = SlowBuilds()
    results, errors = in_threads(8, lambda: cache.get(KEY, "f1", build))
    wait_until(lambda: build.started >= 1)
    build.release.set()
    wait_until(lambda: len(results) + len(errors) == 8)
    assert errors == []
    assert build.started == 1
    assert len({id(r) for r in results}) == 1


def test_a_failed_build_is_shared_by_its_waiters_not_retried_by_each() -> None:
    cache = BackendCache()
    build = SlowBuilds()
    build.error = RuntimeError("wrong password")
    results, errors = in_threads(6, lambda: cache.get(KEY, "f1", build))
    wait_until(lambda: build.started >= 1)
    build.release.set()
    wait_until(lambda: len(results) + len(errors) == 6)
    assert build.started == 1  # one login tried, not six
    assert len(errors) == 6 and all(str(e) == "wrong password" for e in errors)
    assert len(cache) == 0  # nothing cached: the next get builds again
    build.error = None
    assert fake(cache.get(KEY, "f1", build)).name == "b2"


def test_a_replaced_client_is_closed_only_when_its_holder_lets_go() -> None:
    cache = BackendCache()
    taken = threading.Event()
    finish = threading.Event()
    seen: list[FakeBackend] = []

    def worker() -> None:
        with cache.holding():
            seen.append(fake(cache.get(KEY, "f1", make("old"))))
            taken.set()
            assert finish.wait(WAIT)
            seen.append(fake(cache.reuse(KEY, {"a": 1})))

    thread = threading.Thread(target=worker)
    thread.start()
    assert taken.wait(WAIT)
    old = seen[0]
    with cache.holding():
        new = fake(cache.get(KEY, "f2", make("new"), spec={"a": 1}))
    assert new is not old
    assert not old.closed  # the worker still uses it
    assert cache.sizes()["retired"] == 1
    finish.set()
    thread.join(WAIT)
    assert old.closed and not new.closed
    assert cache.sizes() == {"entries": 1, "retired": 0, "held": 0, "building": 0}


def test_a_dropped_pools_client_is_closed_after_its_last_holder() -> None:
    cache = BackendCache()
    with cache.holding():
        backend = fake(cache.get(KEY, "f1", make("b")))
        with cache.holding():  # scopes nest: taken twice, held until the outer one ends
            assert fake(cache.get(KEY, "f1", make("never"))) is backend
        cache.drop(KEY[:3])
        assert not backend.closed and len(cache) == 0
    assert backend.closed
    assert cache.sizes()["held"] == 0


def test_clients_taken_outside_a_holding_scope_are_closed_when_replaced() -> None:
    cache = BackendCache()
    old = fake(cache.get(KEY, "f1", make("old")))
    cache.get(KEY, "f2", make("new"))
    assert old.closed


@pytest.mark.parametrize("count", [1, 3])
def test_close_closes_held_and_retired_clients(count: int) -> None:
    cache = BackendCache()
    with cache.holding():
        backends = [fake(cache.get(KEY, f"f{i}", make(str(i)))) for i in range(count)]
        cache.close()
    assert all(b.closed for b in backends)
