"""Fault injection for aiohttp mock servers: latency, errors, hangs, redirects, down mode, races.

Generic: a mock passes its own error body (`ErrorFactory`) and, for races, which requests
allocate and what a lost race looks like (`RaceHooks`). The phpIPAM mock uses it, and so can a
WAPI mock. Faults change at runtime from Python (`FaultInjector.update`) or over HTTP
(``GET``/``PUT``/``DELETE <prefix>/faults``, see `FaultInjector.add_routes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "ErrorFactory",
    "FaultConfig",
    "FaultInjector",
    "RaceHooks",
    "plain_error_response",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorFactory = Callable[[int, str], web.StreamResponse]
"""Builds the mock's error answer from an HTTP status and a message."""


class FaultConfig(BaseModel):
    """What to inject; every share is a probability in [0, 1] drawn per request.

    Attributes
    ----------
    latency_seconds:
        Delay added before every answer (seconds).
    error_rate:
        Share of requests answered with one of ``error_statuses`` (without reaching the
        handler, so nothing is changed).
    error_statuses:
        The statuses to pick from (5xx), uniformly.
    error_message:
        Message of injected errors; default: the status's reason phrase.
    hang_rate:
        Share of requests that never get an answer: the server holds them until the client
        gives up, ``hang_seconds`` pass, or the server stops, then drops the connection.
    hang_seconds:
        Upper bound of a hang (seconds). ``hang_rate=1`` simulates a hung endpoint: it
        accepts connections and never answers, for ``hang_seconds`` or until the hang is
        cleared (`FaultInjector.update` with ``hang_rate=0``, `FaultInjector.reset`, or
        `FaultInjector.release_hangs`).
    redirect_to:
        When set, every request is answered with a redirect (``redirect_status``) to this
        URL (a moved server, an HTTP-to-HTTPS front end, a login portal). With
        ``redirect_keep_path`` the request's path and query are appended to it.
    redirect_status:
        The 3xx status of the redirect (301, 302, 303, 307 or 308).
    redirect_keep_path:
        Append the request's path and query to ``redirect_to`` (default) or not.
    down:
        Simulate a dead server for every API request.
    down_mode:
        ``close``: drop the connection without an answer (the client sees a connection
        error; a middleware cannot refuse the TCP connection itself). ``503``: answer 503.
    race_rate:
        Share of allocation requests (see `RaceHooks.matches`) answered as a lost race.
    race_mode:
        ``after``: the allocation happens, then the race error is answered (the client does
        not learn its address). ``instead``: the race error is answered and nothing is
        allocated.
    race_error:
        Which lost-race answer the mock gives; its meaning is the mock's (phpIPAM:
        ``conflict`` = 409, ``duplicate`` = 500 duplicate key, ``any`` = either).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_seconds: float = Field(default=0.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    error_statuses: tuple[int, ...] = (500, 503)
    error_message: str | None = None
    hang_rate: float = Field(default=0.0, ge=0, le=1)
    hang_seconds: float = Field(default=300.0, gt=0)
    redirect_to: str | None = None
    redirect_status: Literal[301, 302, 303, 307, 308] = 302
    redirect_keep_path: bool = True
    down: bool = False
    down_mode: Literal["close", "503"] = "close"
    race_rate: float = Field(default=0.0, ge=0, le=1)
    race_mode: Literal["after", "instead"] = "after"
    race_error: str = "any"

    @field_validator("error_statuses")
    @classmethod
    def _server_errors_only(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(not 500 <= s <= 599 for s in value):
            raise ValueError("error_statuses must be a non-empty list of 5xx statuses")
        return value


@dataclass(frozen=True)
class RaceHooks:
    """How a mock takes part in race injection.

    Attributes
    ----------
    matches:
        True for requests that allocate an address (phpIPAM: ``POST first_free``).
    respond:
        Builds the lost-race answer from the request, the handler's successful answer
        (``after`` mode) or None (``instead`` mode), and `FaultConfig.race_error`.
    """

    matches: Callable[[web.Request], bool]
    respond: Callable[[web.Request, web.StreamResponse | None, str], web.StreamResponse]


def plain_error_response(status: int, message: str) -> web.StreamResponse:
    """Return a minimal JSON error ``{"status": ..., "message": ...}`` (the default body)."""
    return web.json_response({"status": status, "message": message}, status=status)


class FaultInjector:
    """Holds a `FaultConfig` and applies it to requests through an aiohttp middleware.

    Parameters
    ----------
    config:
        The initial faults (default: none).
    error_response:
        Builds error answers in the mocked service's format.
    race:
        Enables race injection for the requests it matches.
    rng:
        Random source (tests pass a seeded ``random.Random``).
    admin_prefix:
        Requests under this path are never faulted (the admin API lives there).

    Notes
    -----
    Thread-safe: the config is an immutable object swapped under a lock, so tests may
    change it from another thread while the server runs. ``stats`` counts injected faults.
    """

    def __init__(
        self,
        config: FaultConfig | None = None,
        *,
        error_response: ErrorFactory = plain_error_response,
        race: RaceHooks | None = None,
        rng: random.Random | None = None,
        admin_prefix: str = "/_mock",
    ) -> None:
        self._config = config or FaultConfig()
        self._lock = threading.Lock()
        self.error_response = error_response
        self.race = race
        self.rng = rng or random.Random()
        self.admin_prefix = admin_prefix.rstrip("/")
        self.stats: dict[str, int] = {
            "latency": 0,
            "errors": 0,
            "hangs": 0,
            "redirects": 0,
            "down": 0,
            "races": 0,
        }
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ configuration

    @property
    def config(self) -> FaultConfig:
        """The current faults (immutable; change them with `update`, `set` or `reset`)."""
        return self._config

    def set(self, config: FaultConfig) -> FaultConfig:
        """Replace the whole configuration and return it."""
        with self._lock:
            self._config = config
        return config

    def update(self, **changes: Any) -> FaultConfig:
        """Change some fields and return the new configuration.

        Turning hangs off (``hang_rate=0``) also releases the requests hung now.

        Raises
        ------
        pydantic.ValidationError
            When a field is unknown or a value out of range.
        """
        with self._lock:
            merged = {**self._config.model_dump(), **changes}
            self._config = FaultConfig.model_validate(merged)
            config = self._config
        if config.hang_rate == 0:
            self.release_hangs()
        return config

    def reset(self) -> FaultConfig:
        """Turn every fault off and release hung requests."""
        self.set(FaultConfig())
        self.release_hangs()
        return self._config

    def release_hangs(self) -> None:
        """Let every hung request end now (its connection is dropped). Thread-safe."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._release_now)

    def _release_now(self) -> None:
        # In the server's loop: wake the requests hung now; later hangs wait on a new event
        # (a release with nothing hung must not cut the next hang short).
        event, self._release = self._release, asyncio.Event()
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ middleware

    def _chance(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        # Close the connection without answering. The returned response is never written
        # (aiohttp skips writes on a closed transport).
        transport = request.transport
        if transport is not None:
            transport.close()
        request.protocol.force_close()
        return web.Response(status=499)

    @staticmethod
    def _redirect(request: web.Request, cfg: FaultConfig) -> web.StreamResponse:
        target = cfg.redirect_to or ""
        if cfg.redirect_keep_path:
            target = target.rstrip("/") + request.rel_url.raw_path_qs
        return web.Response(
            status=cfg.redirect_status,
            headers={"Location": target, "Content-Type": "text/html; charset=iso-8859-1"},
            text=f'<html><body>Moved to <a href="{target}">{target}</a></body></html>',
        )

    def _error(self, status: int, message: str | None) -> web.StreamResponse:
        return self.error_response(status, message or HTTPStatus(status).phrase)

    async def _hang(self, request: web.Request, seconds: float) -> web.StreamResponse:
        if self._release is None or self._loop is not asyncio.get_running_loop():
            self._loop = asyncio.get_running_loop()
            self._release = asyncio.Event()
        event = self._release
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=seconds)
        return self._drop(request)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Apply the current faults to one request (register it as an aiohttp middleware)."""
        if request.path.startswith(self.admin_prefix + "/") or request.path == self.admin_prefix:
            return await handler(request)
        cfg = self._config
        if cfg.down:
            self.stats["down"] += 1
            if cfg.down_mode == "close":
                return self._drop(request)
            return self._error(503, cfg.error_message)
        if cfg.redirect_to is not None:
            self.stats["redirects"] += 1
            return self._redirect(request, cfg)
        if cfg.latency_seconds > 0:
            self.stats["latency"] += 1
            await asyncio.sleep(cfg.latency_seconds)
        if self._chance(cfg.hang_rate):
            self.stats["hangs"] += 1
            return await self._hang(request, cfg.hang_seconds)
        if self._chance(cfg.error_rate):
            self.stats["errors"] += 1
            return self._error(self.rng.choice(cfg.error_statuses), cfg.error_message)
        if self.race is not None and self.race.matches(request) and self._chance(cfg.race_rate):
            if cfg.race_mode == "instead":
                self.stats["races"] += 1
                return self.race.respond(request, None, cfg.race_error)
            response = await handler(request)
            if response.status >= 300:  # nothing was allocated: no race to simulate
                return response
            self.stats["races"] += 1
            return self.race.respond(request, response, cfg.race_error)
        return await handler(request)

    # ------------------------------------------------------------------ admin API

    def add_routes(self, app: web.Application) -> None:
        """Add ``GET``/``PUT``/``DELETE <admin_prefix>/faults`` to ``app``.

        ``GET`` answers the config and ``stats``; ``PUT`` takes a JSON object of fields to
        change (400 with the validation errors when invalid); ``DELETE`` turns faults off.
        Also releases hung requests when the app shuts down.
        """
        path = f"{self.admin_prefix}/faults"
        app.router.add_get(path, self._get)
        app.router.add_put(path, self._put)
        app.router.add_delete(path, self._delete)

        async def _on_shutdown(_: web.Application) -> None:
            if self._release is not None:
                self._release.set()

        app.on_shutdown.append(_on_shutdown)

    def _body(self) -> dict[str, Any]:
        return {"faults": self._config.model_dump(mode="json"), "stats": dict(self.stats)}

    async def _get(self, _: web.Request) -> web.Response:
        return web.json_response(self._body())

    async def _put(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        if not isinstance(changes, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        try:
            self.update(**changes)
        except ValidationError as exc:
            return web.json_response(
                {
                    "error": "invalid faults",
                    "details": exc.errors(include_url=False, include_input=False),
                },
                status=400,
            )
        return web.json_response(self._body())

    async def _delete(self, _: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self._body())
