"""bridge.cli: argument parsing, what run_operator hands to kopf, and the log configuration."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from fakes import local_kubeconfig

from bridge import __version__, cli
from bridge.runtime import logcontext
from bridge.settings import Settings


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
def kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A valid kubeconfig in ``KUBECONFIG`` (a server at 127.0.0.1 that nobody asks)."""
    path = local_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


@pytest.fixture
def kopf_run(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path) -> Iterator[list[dict[str, Any]]]:
    """Replace kopf.run (it would block) and collect the keyword arguments it gets.

    ``run_operator`` sets ``IPAM_BRIDGE_NAMESPACE`` for its process; ``tests/conftest.py``
    restores the environment after each test. ``KUBECONFIG`` names a valid kubeconfig
    (the configuration is checked before kopf.run).
    """
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    for name in (
        "NAMESPACE",
        "NAMESPACE_SCOPE",
        "STANDALONE",
        "PEERING_NAME",
        "LOG_FORMAT",
        "LOG_LEVEL",
        "METRICS_ADDRESS",
    ):
        monkeypatch.delenv(f"IPAM_BRIDGE_{name}", raising=False)
    # The pre-flight port check binds the metrics and health ports: pick free ones.
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", str(free_port()))
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", str(free_port("0.0.0.0")))
    yield calls


# -- parsing and kopf.run arguments ------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_run_defaults_to_cluster_wide_without_kopf_peering(
    kopf_run: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run"]) == 0
    (call,) = kopf_run
    assert call["clusterwide"] is True
    assert call["namespaces"] == []
    # kopf waits for a peering object whenever a peering name is given: never give one
    assert call["standalone"] is True
    assert call["peering_name"] is None
    assert call["liveness_endpoint"] == f"http://0.0.0.0:{Settings().health_port}/healthz"
    assert "deprecated" not in capsys.readouterr().err


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


@pytest.mark.parametrize(
    ("env", "served", "warning"),
    [
        (
            {"IPAM_BRIDGE_NAMESPACE_SCOPE": "team-a"},
            ["team-a"],
            "IPAM_BRIDGE_NAMESPACE_SCOPE is deprecated: set IPAM_BRIDGE_NAMESPACE instead",
        ),
        (
            {"IPAM_BRIDGE_NAMESPACE_SCOPE": "team-a", "IPAM_BRIDGE_NAMESPACE": "team-b"},
            ["team-b"],
            "IPAM_BRIDGE_NAMESPACE_SCOPE is deprecated and ignored: IPAM_BRIDGE_NAMESPACE is "
            "set ('team-b') and used",
        ),
        # what the clusterctl components give: the former variable copied into the new one
        (
            {"IPAM_BRIDGE_NAMESPACE_SCOPE": "team-a", "IPAM_BRIDGE_NAMESPACE": "team-a"},
            ["team-a"],
            "IPAM_BRIDGE_NAMESPACE_SCOPE is deprecated: set IPAM_BRIDGE_NAMESPACE instead",
        ),
    ],
)
def test_former_namespace_name_is_read_with_a_warning_at_start_up(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    served: list[str],
    warning: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["run"]) == 0
    (call,) = kopf_run
    assert call["namespaces"] == served
    lines = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert len(lines) == 1 and warning in lines[0] and "WARNING" in lines[0], lines


def test_empty_former_name_is_not_warned_about(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The clusterctl components always pass the former variable, empty unless it is set."""
    monkeypatch.setenv("IPAM_BRIDGE_NAMESPACE_SCOPE", "")
    assert cli.main(["run"]) == 0
    assert kopf_run[0]["clusterwide"] is True
    assert "deprecated" not in capsys.readouterr().err


def test_settings_take_a_setting_by_its_field_name() -> None:
    assert Settings(namespace="team-a").namespaces == ("team-a",)


def test_namespace_and_all_namespaces_exclude_each_other(
    kopf_run: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "-n", "a", "-A"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
    assert kopf_run == []


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["run", "--standalone"], {}, "--standalone"),
        (["run"], {"IPAM_BRIDGE_STANDALONE": "false"}, "IPAM_BRIDGE_STANDALONE"),
        (["run"], {"IPAM_BRIDGE_PEERING_NAME": "ipam-bridge"}, "IPAM_BRIDGE_PEERING_NAME"),
    ],
)
def test_peering_options_are_accepted_ignored_and_warned_about_once(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    named: str,
) -> None:
    monkeypatch.setattr(cli, "_warned_deprecated", set())
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0
    for call in kopf_run:
        assert call["standalone"] is True
        assert call["peering_name"] is None
    warnings = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert len(warnings) == 1, warnings
    assert named in warnings[0] and "WARNING" in warnings[0]


def test_all_peering_options_in_one_warning(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "_warned_deprecated", set())
    monkeypatch.setenv("IPAM_BRIDGE_STANDALONE", "true")
    monkeypatch.setenv("IPAM_BRIDGE_PEERING_NAME", "x")
    cli.main(["run", "--standalone"])
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert "--standalone, IPAM_BRIDGE_STANDALONE, IPAM_BRIDGE_PEERING_NAME: deprecated" in warning


def test_liveness_endpoint(kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    health, liveness = free_port("0.0.0.0"), free_port()
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", str(health))
    cli.main(["run"])
    cli.main(["run", "--liveness", f"http://127.0.0.1:{liveness}/healthz"])
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    cli.main(["run"])
    assert [c["liveness_endpoint"] for c in kopf_run] == [
        f"http://0.0.0.0:{health}/healthz",
        f"http://127.0.0.1:{liveness}/healthz",
        None,
    ]


# -- start-up never fails silently ----------------------------------------------------------


@pytest.fixture
def occupied() -> Iterator[int]:
    """A port another process listens on (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def test_metrics_port_in_use_stops_run_before_kopf(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    occupied: int,
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_ADDRESS", "127.0.0.1")
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", str(occupied))
    assert cli.main(["run"]) == 1
    assert kopf_run == []
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ipam-bridge: cannot listen on 127.0.0.1:{occupied} for metrics "
        "(IPAM_BRIDGE_METRICS_PORT): Address already in use"
    )


def test_metrics_on_all_addresses_conflicts_with_one_address(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    occupied: int,
) -> None:
    # the default address 0.0.0.0 cannot be bound while 127.0.0.1:<port> is listened on
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", str(occupied))
    assert cli.main(["run"]) == 1
    assert kopf_run == []
    assert f"cannot listen on 0.0.0.0:{occupied} for metrics" in capsys.readouterr().err


def test_health_port_in_use_stops_run_before_kopf(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    occupied: int,
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", str(occupied))
    assert cli.main(["run"]) == 1
    assert cli.main(["run", "--liveness", f"http://127.0.0.1:{occupied}/healthz"]) == 1
    assert kopf_run == []
    from_setting, from_flag = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("ipam-bridge:")
    ]
    assert from_setting == (
        f"ipam-bridge: cannot listen on 0.0.0.0:{occupied} for health "
        "(IPAM_BRIDGE_HEALTH_PORT): Address already in use"
    )
    assert from_flag == (
        f"ipam-bridge: cannot listen on 127.0.0.1:{occupied} for health "
        "(--liveness): Address already in use"
    )


def test_an_address_this_machine_does_not_have(
    kopf_run: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_ADDRESS", "192.0.2.1")  # TEST-NET-1: bind only
    assert cli.main(["run"]) == 1
    assert kopf_run == []
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("for metrics (IPAM_BRIDGE_METRICS_PORT): Cannot assign requested address")
    )


def test_ports_zero_are_not_checked(
    kopf_run: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, occupied: int
) -> None:
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    assert cli.main(["run"]) == 0
    assert len(kopf_run) == 1


def test_a_taken_port_ends_the_real_process_within_seconds(occupied: int, tmp_path: Any) -> None:
    # no cluster and no kubeconfig needed: the check runs before kopf
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("IPAM_BRIDGE_")},
        "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
        "IPAM_BRIDGE_HEALTH_PORT": str(occupied),
        "IPAM_BRIDGE_METRICS_PORT": "0",
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - started < 20
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"ipam-bridge: cannot listen on 0.0.0.0:{occupied} for health "
        "(IPAM_BRIDGE_HEALTH_PORT): Address already in use"
    )


def _no_kubernetes_configuration(home: Path) -> dict[str, str]:
    """Return an environment with no kubeconfig (``HOME`` empty), outside any pod."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("IPAM_BRIDGE_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    return {
        **env,
        "HOME": str(home),
        "IPAM_BRIDGE_METRICS_PORT": "0",
        "IPAM_BRIDGE_HEALTH_PORT": "0",
    }


def _ipam_bridge() -> list[str]:
    """Return the command of the ``ipam-bridge`` console script of this interpreter."""
    script = Path(sys.executable).with_name("ipam-bridge")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridge.cli"]


def test_run_without_any_kubernetes_configuration_exits_1_naming_what_was_tried(
    tmp_path: Path,
) -> None:
    # kopf's start-up would fail and be retried every 60 s, with a traceback each time.
    home = tmp_path / "home"
    home.mkdir()
    started = time.monotonic()
    result = subprocess.run(
        [*_ipam_bridge(), "run"],
        env=_no_kubernetes_configuration(home),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert time.monotonic() - started < 20
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        "ipam-bridge: no Kubernetes configuration: tried KUBECONFIG (not set), the in-cluster "
        "service account (/var/run/secrets/kubernetes.io/serviceaccount/token: not found) and "
        f"~/.kube/config ({home}/.kube/config: not found)"
    ]


def test_a_broken_kubeconfig_ends_run_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    monkeypatch.setattr(kopf, "run", lambda **_: pytest.fail("kopf.run was called"))
    assert cli.main(["run"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"ipam-bridge: cannot load the Kubernetes configuration from KUBECONFIG ({path}): "
    )


def test_a_failed_start_up_ends_run_with_the_handlers_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kubeconfig: Path
) -> None:
    from kopf._core.actions.execution import Outcome
    from kopf._core.engines.activities import ActivityError

    def failing_run(**_: Any) -> None:
        outcome = Outcome(final=True, exception=kopf.PermanentError("forbidden: User x"))
        raise ActivityError("One or more handlers failed.", outcomes={"startup": outcome})

    monkeypatch.setattr(kopf, "run", failing_run)
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    assert cli.main(["run"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ipam-bridge: start-up failed: forbidden: User x"
    )


def test_a_refused_kopf_request_ends_run_with_the_api_servers_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kubeconfig: Path
) -> None:
    from kopf._cogs.clients.errors import APIForbiddenError

    message = 'ipaddressclaims.ipam.cluster.x-k8s.io is forbidden: User "u" cannot list'

    def refused_run(**_: Any) -> None:
        status = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": message}
        raise APIForbiddenError(status, status=403, headers={})  # type: ignore[arg-type]

    monkeypatch.setattr(kopf, "run", refused_run)
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    assert cli.main(["run"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ipam-bridge: the API server refused: {message}"
    )


def test_other_errors_of_kopf_propagate(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path) -> None:
    def broken_run(**_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(kopf, "run", broken_run)
    monkeypatch.setenv("IPAM_BRIDGE_METRICS_PORT", "0")
    monkeypatch.setenv("IPAM_BRIDGE_HEALTH_PORT", "0")
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["run"])


# -- logging ---------------------------------------------------------------------------------


def configure(**env: str) -> None:
    cli._configure_logging(Settings(**env))  # type: ignore[arg-type]


def object_logger() -> logging.LoggerAdapter[logging.Logger]:
    """A logger like kopf's per-object one (its records carry ``k8s_ref``)."""
    return logging.LoggerAdapter(logging.getLogger("kopf.objects"), {"k8s_ref": dict(REF)})


def test_json_lines_carry_the_object_and_the_logger(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format="json", log_level="DEBUG")  # kopf's INFO object lines need DEBUG
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


def test_lines_logged_inside_a_reconcile_name_its_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure(log_format="json")
    with logcontext.about(REF["apiVersion"], REF["kind"], REF["namespace"], REF["name"]):
        logging.getLogger("backends.phpipam").info("phpIPAM: logged in to app 'capi'")
    logging.getLogger("backends.phpipam").info("outside any reconcile")
    inside, outside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert inside[cli.LOG_REFKEY] == {k: v for k, v in REF.items() if k != "uid"}
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
    logging.getLogger("bridge.reconcilers.claims").warning("once")
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_kopfs_per_event_lines_only_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    configure(log_format="text")
    object_logger().info("Handler 'claim_event' succeeded.")
    object_logger().warning("Handler 'claim_event' failed temporarily")
    logging.getLogger("bridge.reconcilers.claims").info("claim capi/m1: 10.0.0.2 registered")
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit("] ", 1)[-1] for line in lines] == [
        "Handler 'claim_event' failed temporarily",
        "claim capi/m1: 10.0.0.2 registered",
    ]
    configure(log_format="text", log_level="DEBUG")
    object_logger().info("Handler 'claim_event' succeeded.")
    assert "succeeded" in capsys.readouterr().err
