"""deploy/monitoring/ and the chart's monitoring objects: alerts, ServiceMonitor, dashboard.

The alerts run through the real ``promtool`` (``check rules``, ``test rules`` with
tests/data/monitoring/alerts_test.yaml); the ServiceMonitor and PrometheusRule validate
against the prometheus-operator v0.93.0 CRDs vendored in tests/data/prometheus-operator-crds/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
CHART = ROOT / "deploy" / "helm" / "ipam-bridge"
CRDS = ROOT / "tests" / "data" / "prometheus-operator-crds"
ALERTS_TEST = ROOT / "tests" / "data" / "monitoring" / "alerts_test.yaml"
NAMESPACE = "ipam-bridge-system"
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}
#: Every alert the rules must define (docs/operations/monitoring.md has a runbook section for each).
ALERTS = {
    "IPAMBridgePoolLowOnAddresses",
    "IPAMBridgePoolExhausted",
    "IPAMBridgeClaimsPending",
    "IPAMBridgeEndpointCircuitOpen",
    "IPAMBridgeBackendErrors",
    "IPAMBridgeDriftUnresolved",
    "IPAMBridgeNoLeader",
    "IPAMBridgeDown",
    "IPAMBridgeWatchStalled",
}
MONITORING_VALUES = (
    "metrics.serviceMonitor.enabled",
    "metrics.prometheusRule.enabled",
    "metrics.dashboard.enabled",
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not on PATH: Debian's `prometheus` package (`make test` installs it)",
)


def _helm() -> str | None:
    return os.environ.get("HELM") or shutil.which("helm")


needs_helm = pytest.mark.skipif(_helm() is None, reason="helm not on PATH (nor $HELM)")


def _kustomize() -> list[str] | None:
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    return [kubectl, "kustomize"] if kubectl else None


def rule_object() -> dict[str, Any]:
    """deploy/monitoring/prometheusrule.yaml."""
    obj: dict[str, Any] = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return obj


def rules() -> list[dict[str, Any]]:
    """Every rule of the PrometheusRule, in order."""
    return [rule for group in rule_object()["spec"]["groups"] for rule in group["rules"]]


def _crd_schema(kind: str) -> dict[str, Any]:
    path = CRDS / f"monitoring.coreos.com_{kind.lower()}s.yaml"
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _pruned(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Return the fields of ``obj`` the API server would drop (absent from the schema)."""
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, value in obj.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue  # ObjectMeta: validated by the API server, not the CRD schema
            if props is not None and key in props:
                found += _pruned(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += _pruned(value, extra, f"{path}.{key}")
            elif props is not None or extra is not True:
                found.append(f"{path}.{key}")
        return found
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [
            f for i, item in enumerate(obj) for f in _pruned(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def validate_monitoring_object(obj: dict[str, Any]) -> None:
    """Validate a ServiceMonitor or PrometheusRule against the vendored CRD's schema.

    Raises ``jsonschema.ValidationError`` for a wrong type, a missing required field or an
    invalid value; AssertionError for a field the API server would prune.
    """
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    schema = _crd_schema(obj["kind"])
    # Not `jsonschema.validate`: it checks the schema first, and some ``pattern`` of the CRD
    # is Go (RE2) syntax Python's ``re`` does not read (``(?i)`` inside the expression).
    jsonschema.Draft4Validator(schema).validate(obj)
    assert _pruned(obj, schema) == []
    assert obj["metadata"]["namespace"] == NAMESPACE


def helm_template(*args: str) -> list[dict[str, Any]]:
    """Render the chart (release ``ipam-bridge`` in `NAMESPACE`) with extra helm arguments."""
    helm = _helm()
    assert helm is not None
    result = subprocess.run(
        [helm, "template", "ipam-bridge", str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def _strip_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels = obj["metadata"].get("labels", {})
    obj["metadata"]["labels"] = {k: v for k, v in labels.items() if k not in HELM_LABELS}
    return obj


def _kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {obj["kind"] for obj in objects}


# -- the rules --------------------------------------------------------------------------------


def test_rules_define_every_alert_with_summary_description_and_runbook() -> None:
    runbooks = (ROOT / "docs" / "operations" / "monitoring.md").read_text(encoding="utf-8")
    alerts = {rule["alert"]: rule for rule in rules() if "alert" in rule}
    assert set(alerts) == ALERTS
    for name, rule in alerts.items():
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        page, anchor = annotations["runbook_url"].rsplit("#", 1)
        assert page.endswith("/blob/main/docs/operations/monitoring.md"), name
        assert anchor == name.lower(), name
        assert f"### {name}\n" in runbooks, f"the monitoring page has no runbook section for {name}"


@needs_promtool
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_object()["spec"]))
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_every_alert_firing_and_silent(tmp_path: Path) -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == silent == ALERTS, "every alert needs a firing and a silent case"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_object()["spec"]))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yaml")
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_unit_tests_fail_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    """The unit tests can fail: a low-pool rule that fires for every pool fails them."""
    spec = rule_object()["spec"]
    for rule in spec["groups"][0]["rules"]:
        if rule.get("alert") == "IPAMBridgePoolLowOnAddresses":
            # Fires for every pool with room: the silent cases fail.
            rule["expr"] = "ipam_bridge_pool_free_addresses < ipam_bridge_pool_total_addresses"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yaml")
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "IPAMBridgePoolLowOnAddresses" in result.stdout + result.stderr


# -- the dashboard ----------------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of deploy/monitoring/dashboard.json."""
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_shows_what_the_issue_lists() -> None:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Allocations per pool",
        "Releases per pool",
        "Pending claims by reason",
        "Free addresses per pool",
        "IPAM latency per operation",
        "IPAM endpoint circuit state",
        "IPAM endpoint concurrency",
        "Leader",
        "Drift",
    } <= titles
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(expr.strip() for expr in dashboard_exprs())


def test_chart_carries_the_same_dashboard() -> None:
    chart_copy = (CHART / "files" / "dashboard.json").read_bytes()
    assert chart_copy == (MONITORING / "dashboard.json").read_bytes()


# -- kustomize component and chart ------------------------------------------------------------


def test_monitoring_component_renders_and_validates() -> None:
    tool = _kustomize()
    if tool is None:
        pytest.skip("kubectl not on PATH (nor $KUBECTL): `make kubectl`")
    out = subprocess.run(
        [*tool, str(MONITORING)], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(out) if doc is not None]
    assert _kinds(objects) == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert json.loads(obj["data"]["ipam-bridge.json"])["uid"] == "ipam-bridge"
        else:
            validate_monitoring_object(obj)
    # The default install does not need the prometheus-operator CRDs.
    default = (ROOT / "deploy" / "kustomization.yaml").read_text()
    assert "monitoring" not in default


@needs_helm
def test_chart_renders_no_monitoring_by_default() -> None:
    kinds = _kinds(helm_template())
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    configmaps = [o for o in helm_template() if o["kind"] == "ConfigMap"]
    assert configmaps == []


@needs_helm
@pytest.mark.parametrize("value", MONITORING_VALUES)
def test_chart_renders_each_monitoring_value_alone(value: str) -> None:
    objects = helm_template("--set", f"{value}=true")
    expected = {
        "metrics.serviceMonitor.enabled": "ServiceMonitor",
        "metrics.prometheusRule.enabled": "PrometheusRule",
        "metrics.dashboard.enabled": "ConfigMap",
    }
    new = _kinds(objects) & set(expected.values())
    assert new == {expected[value]}
    for obj in objects:
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule"):
            validate_monitoring_object(obj)


@needs_helm
def test_chart_renders_every_monitoring_value_on() -> None:
    args = [a for value in MONITORING_VALUES for a in ("--set", f"{value}=true")]
    objects = helm_template(
        *args,
        "--set",
        "metrics.serviceMonitor.labels.release=kps",
        "--set",
        "metrics.prometheusRule.labels.release=kps",
    )
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    dashboard = next(o for o in objects if o["kind"] == "ConfigMap")
    service = next(o for o in objects if o["kind"] == "Service")
    for obj in (monitor, rule):
        validate_monitoring_object(obj)
        assert obj["metadata"]["labels"]["release"] == "kps"
    # The ServiceMonitor selects the metrics Service and its named port.
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((MONITORING / "dashboard.json").read_text())
    assert json.loads(dashboard["data"]["ipam-bridge.json"]) == shipped


@needs_helm
def test_chart_rules_with_defaults_are_the_kustomize_rules() -> None:
    (rendered,) = helm_template(
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--show-only",
        "templates/prometheusrule.yaml",
    )
    assert _strip_helm_labels(rendered) == rule_object()


@needs_helm
def test_chart_rule_thresholds_are_values() -> None:
    (rendered,) = helm_template(
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.poolFreeThreshold=25",
        "--set",
        "metrics.prometheusRule.poolFreeFraction=0.2",
        "--set",
        "metrics.prometheusRule.claimPendingFor=30m",
        "--show-only",
        "templates/prometheusrule.yaml",
    )
    validate_monitoring_object(rendered)
    by_name = {r["alert"]: r for g in rendered["spec"]["groups"] for r in g["rules"]}
    low = by_name["IPAMBridgePoolLowOnAddresses"]["expr"]
    assert "ipam_bridge_pool_free_addresses < 25 and ipam_bridge_pool_total_addresses > 25" in low
    assert "ipam_bridge_pool_free_addresses < 0.2 * ipam_bridge_pool_total_addresses" in low
    assert by_name["IPAMBridgeClaimsPending"]["for"] == "30m"


def test_schema_validation_rejects_a_wrong_object() -> None:
    """The validation can fail: a misspelt field and a wrong type are both caught."""
    obj = rule_object()
    obj["spec"]["groups"][0]["rules"][0]["expresion"] = obj["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(AssertionError):
        validate_monitoring_object(obj)
    obj = rule_object()
    obj["spec"]["groups"][0]["rules"] = "not a list"
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring_object(obj)
