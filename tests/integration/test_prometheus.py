"""Every PromQL expression of the alerts and the dashboard, against a real Prometheus server.

A ``prometheus`` (Debian's package; `make promtool` installs it) listens on 127.0.0.1 with a
temporary data directory and scrapes the running operator's ``/metrics`` every second, while
the operator allocates, releases and runs into an exhausted pool. Then each expression of
deploy/monitoring/prometheusrule.yaml and deploy/monitoring/dashboard.json is evaluated
through the HTTP API: it must parse, and every metric it names must be one the operator
exports (a rule left behind by a renamed metric fails here).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from integration_env import CREDENTIALS, NAMESPACE
from prometheus_client.parser import text_string_to_metric_families

from mock_kubernetes.sandbox import Sandbox, wait_for
from mock_phpipam.server import MockPhpipamServer

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
METRIC_NAME = re.compile(r"\bipam_bridge_[a-z0-9_]+\b")
#: Suffixes of the series prometheus-client writes for each metric type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not on PATH: Debian's `prometheus` package (`make promtool` installs it)",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def expressions() -> dict[str, str]:
    """Every PromQL expression shipped: ``{where: expr}`` (alerts, then dashboard targets)."""
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    found = {
        f"alert {r['alert']}": str(r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]
    }
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found[f"panel {panel['title']!r} {target['refId']}"] = str(target["expr"])
    return found


def exported_names(text: str) -> set[str]:
    """The series names a ``/metrics`` text declares (``# TYPE`` lines, with their suffixes).

    A labelled metric is declared before its first sample (prometheus-client writes its
    HELP and TYPE lines), so a metric the operator exports counts even before its event.
    """
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def unknown_names(expr: str, exported: set[str]) -> set[str]:
    """The ``ipam_bridge_*`` names ``expr`` uses that are not in ``exported``."""
    return set(METRIC_NAME.findall(expr)) - exported


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """Start Prometheus scraping ``127.0.0.1:<port>`` every second; yield a starter -> URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target_port: int) -> str:
        assert PROMETHEUS is not None
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "ipam-bridge",
                    "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def query(url: str, expr: str) -> dict[str, Any]:
    """Evaluate ``expr`` now through ``/api/v1/query``; return the JSON answer (any status)."""
    answer: dict[str, Any] = requests.get(
        f"{url}/api/v1/query", params={"query": expr}, timeout=10
    ).json()
    return answer


def series(url: str, expr: str) -> list[dict[str, Any]]:
    """The vector ``expr`` evaluates to, or [] (also while Prometheus is not up yet)."""
    try:
        answer = query(url, expr)
    except requests.RequestException:
        return []
    result: list[dict[str, Any]] = answer.get("data", {}).get("result", [])
    return result


def drive_operator(sandbox: Sandbox, phpipam: MockPhpipamServer) -> None:
    """Allocations, a release and an exhausted pool: every kind of series gets samples."""
    sandbox.phpipam_pool(
        NAMESPACE, "pool", endpoint=phpipam.url, subnet_id=7, credentials=CREDENTIALS
    )
    sandbox.phpipam_pool(
        NAMESPACE, "small", endpoint=phpipam.url, subnet_id=9, secret="pool-credentials"
    )
    for i in range(2):
        sandbox.claim(NAMESPACE, f"m{i}", "pool")
    for i in range(3):
        sandbox.claim(NAMESPACE, f"s{i}", "small")
    sandbox.wait_claims_bound(NAMESPACE, 4, timeout=120)
    sandbox.delete_claim(NAMESPACE, "m0")
    wait_for(lambda: sandbox.get_claim(NAMESPACE, "m0") is None, timeout=120, message="m0 released")


def test_the_name_check_catches_a_renamed_metric() -> None:
    text = (
        "# HELP ipam_bridge_pool_free_addresses Free addresses.\n"
        "# TYPE ipam_bridge_pool_free_addresses gauge\n"
        "# HELP ipam_bridge_allocations Allocations.\n"
        "# TYPE ipam_bridge_allocations counter\n"
    )
    exported = exported_names(text)
    assert unknown_names("rate(ipam_bridge_allocations_total[5m])", exported) == set()
    assert unknown_names("ipam_bridge_pool_free_addresses < 10", exported) == set()
    assert unknown_names("ipam_bridge_pool_free < 10", exported) == {"ipam_bridge_pool_free"}


def test_every_expression_parses_and_names_exported_metrics(
    make_sandbox: Callable[..., Sandbox],
    phpipam: MockPhpipamServer,
    prometheus: Callable[[int], str],
) -> None:
    metrics_port = free_port()
    sandbox = make_sandbox(settings={"IPAM_BRIDGE_METRICS_PORT": str(metrics_port)})
    url = prometheus(metrics_port)
    drive_operator(sandbox, phpipam)
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    exported = exported_names(text)
    sampled = {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
    assert "ipam_bridge_backend_request_duration_seconds_bucket" in sampled  # driven above

    # Prometheus has scraped the operator after the allocations (a scrape with the histogram).
    wait_for(
        lambda: (
            series(url, 'up{job="ipam-bridge"} == 1')
            and series(url, "ipam_bridge_backend_request_duration_seconds_count")
        ),
        timeout=180,
        interval=0.5,
        message="Prometheus scraping the operator's allocations",
    )
    problems: list[str] = []
    for where, expr in expressions().items():
        answer = query(url, expr)
        if answer.get("status") != "success":
            problems.append(f"{where}: {answer.get('errorType')}: {answer.get('error')}")
        unknown = unknown_names(expr, exported)
        if unknown:
            problems.append(f"{where}: the operator exports no {sorted(unknown)}")
        names = set(METRIC_NAME.findall(expr))
        if not names:
            problems.append(f"{where}: names no ipam_bridge metric")
        # Every name with samples in /metrics has series in Prometheus under that name.
        for name in sorted(names & sampled):
            if not series(url, f'count({{__name__="{name}"}})'):
                problems.append(f"{where}: Prometheus has no series {name}")
    assert problems == []
    # Expressions over driven series give values, not only "parses" (a rate needs two scrapes).
    for where in ("panel 'Allocations per pool' A", "panel 'Free addresses per pool' A"):
        wait_for(
            lambda where=where: series(url, expressions()[where]),
            timeout=120,
            interval=0.5,
            message=f"a value of {where}",
        )
