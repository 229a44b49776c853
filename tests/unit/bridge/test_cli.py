"""bridge.cli: argument parsing, what run_operator hands to kopf, and the log configuration."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kopf._core.actions.execution import cause_var

from bridge import __version__, cli
from bridge.settings import Settings

REF = {
    "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
    "kind": "IPAddressClaim",
    "name": "m1",
    "uid": "0000-1111",
    "namespace": "capi",
}
TOUCHED_LOGGERS = ("urllib3", "client", "aiohttp.access", "kopf.activities.probe", "asyncio")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """kopf.configure replaces the root handler: put the test runner's logging back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved = {
        name: (lg.level, lg.propagate, lg.handlers[:])
        for name in TOUCHED_LOGGERS
        for lg in [logging.getLogger(name)]
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, (lvl, propagate, hs) in saved.items():
        lg = logging.getLogger(name)
        lg.setLevel(lvl)
        lg.propagate = propagate
        lg.handlers[:] = hs


@pytest.fixture
def kopf_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Replace kopf.run (it would block) and collect the keyword arguments it gets.

    ``run_operator`` sets ``IPAM_BRIDGE_NAMESPACE`` for its process; ``tests/conftest.py``
    restores the environment after each test.
    """
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    for name in ("NAMESPACE", "STANDALONE", "HEALTH_PORT", "LOG_FORMAT", "LOG_LEVEL"):
        monkeypatch.delenv(f"IPAM_BRIDGE_{name}", raising=False)
    yield calls


# -- parsing and kopf.run arguments ------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_run_defaults_to_cluster_wide_with_peering(kopf_run: list[dict[str, Any]]) -> None:
    assert cli.main(["run"]) == 0
    (call,) = kopf_run
    assert call["clusterwide"] is True
    assert call["namespaces"] == []
    assert call["standalone"] is False
    assert call["peering_name"] == Settings().peering_name
    assert call["liveness_endpoint"] == f"http://0.0.0.0:{Settings().health_port}/healthz"


def test_run_namespaces_reach_kopf_and_the_settings(
    kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.main(["run", "--namespace", "team-a", "-n", "team-b"]) == 0
    (call,) = kopf_run
    assert call["clusterwide"] is False
    assert call["namespaces"] == ["team-a", "team-b"]
    # the start-up handler reads Settings() again: the pool refresher gets the same scope
    assert Settings().namespaces == ("team-a", "team-b")


def test_all_namespaces_overrides_the_environment(
    kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_NAMESPACE", "team-a")
    cli.main(["run", "--all-namespaces"])
    cli.main(["run"])
    cluster_wide, from_env = kopf_run
    assert cluster_wide["clusterwide"] is True and cluster_wide["namespaces"] == []
    assert Settings().namespaces == ()
    assert from_env["clusterwide"] is True  # the environment was overridden for the process


def test_namespace_from_the_environment(
    kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_NAMESPACE", "team-a, team-c")
    cli.main(["run"])
    (call,) = kopf_run
    assert call["namespaces"] == ["team-a", "team-c"]
    assert call["clusterwide"] is False


def test_namespace_and_all_namespaces_exclude_each_other(
    kopf_run: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "-n", "a", "-A"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
    assert kopf_run == []


def test_standalone_passes_no_peering_name(
    kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # kopf makes peering mandatory whenever a peering name is given; standalone has no
    # peering resources, so the operator would stay paused forever
    cli.main(["run", "--standalone"])
    monkeypatch.setenv("IPAM_BRIDGE_STANDALONE", "true")
    cli.main(["run"])
    for call in kopf_run:
        assert call["standalone"] is True
        assert call["peering_name"] is None


def test_liveness_endpoint(kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "9444")
    cli.main(["run"])
    cli.main(["run", "--liveness", "http://127.0.0.1:7000/healthz"])
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    cli.main(["run"])
    assert [c["liveness_endpoint"] for c in kopf_run] == [
        "http://0.0.0.0:9444/healthz",
        "http://127.0.0.1:7000/healthz",
        None,
    ]


# -- logging ---------------------------------------------------------------------------------


def configure(**env: str) -> None:
    cli._configure_logging(Settings(**env))  # type: ignore[arg-type]


def object_logger() -> logging.LoggerAdapter[logging.Logger]:
    """A logger like kopf's per-object one (its records carry ``k8s_ref``)."""
    return logging.LoggerAdapter(logging.getLogger("kopf.objects"), {"k8s_ref": dict(REF)})


def test_json_lines_carry_the_object_and_the_logger(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format="json")
    object_logger().info("Handler 'allocate' succeeded.")
    logging.getLogger("bridge.handlers.lifecycle").info("serving CAPI IPAM v1beta2")
    lines = capsys.readouterr().err.strip().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "Handler 'allocate' succeeded."
    assert first[cli.LOG_REFKEY] == REF
    assert first["severity"] == "info"
    assert first["logger"] == "kopf.objects"
    assert "timestamp" in first
    assert cli.LOG_REFKEY not in second  # not about an object
    assert second["logger"] == "bridge.handlers.lifecycle"


def test_lines_logged_inside_a_handler_name_its_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure(log_format="json")
    cause = SimpleNamespace(logger=SimpleNamespace(extra={"k8s_ref": dict(REF)}))
    token = cause_var.set(cause)  # type: ignore[arg-type]
    try:
        logging.getLogger("backends.phpipam").info("phpIPAM: allocated 10.0.0.2 to m1.capi")
    finally:
        cause_var.reset(token)
    logging.getLogger("backends.phpipam").info("outside any handler")
    inside, outside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert inside[cli.LOG_REFKEY] == REF
    assert inside["logger"] == "backends.phpipam"
    assert cli.LOG_REFKEY not in outside


def test_text_lines_are_prefixed_with_the_object(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format="text")
    object_logger().warning("PoolExhausted")
    (line,) = capsys.readouterr().err.splitlines()
    assert "[capi/m1] PoolExhausted" in line
    assert "WARNING" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", "ERROR"])
def test_levels_and_quiet_libraries(level: str) -> None:
    configure(log_level=level)
    assert logging.getLogger().level == getattr(logging, level)
    for name in ("urllib3", "client", "aiohttp.access", "kopf.activities.probe"):
        assert logging.getLogger(name).getEffectiveLevel() >= logging.WARNING, name


def test_configuring_twice_keeps_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format="json")
    configure(log_format="json")
    logging.getLogger("bridge.claims").warning("once")
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
