"""What the book (docs/) and the README show is what the project runs.

- Every manifest of the book is a file of ``docs/examples/`` that a page includes (pymdownx
  snippets, ``--8<-- "examples/<file>"``), never YAML written into a page; the README's
  manifests are documents of those files.
- Every example is applied to the in-memory API server with the schemas of our CRDs and of
  CAPI v1.14's (IPAddressClaim, IPAddress, Cluster, ClusterClass), strict field validation on,
  as ``kubectl apply`` sends it: a field the CRD does not know, a missing required field or a
  broken CEL rule fails. (``tests/integration/test_docs_check_pool.py`` runs the pool examples
  through ``ipam-bridge check-pool`` against the IPAM mocks.)
- Every shell command of the pages and the README is one a test runs or covers: `COVERED`
  maps each to that test, which must exist.
- The manager Pod meets the ``restricted`` Pod Security Standard, as the PodSecurity page says.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.reconcilers.audit.cli import format_table
from bridge.reconcilers.audit.compare import Finding, FindingKind
from mock_kubernetes import EmulatedKubernetes
from mock_kubernetes.sandbox import crd_documents

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
README = ROOT / "README.md"
CAPI_1_14 = ROOT / "tests" / "data" / "capi-crds" / "v1.14.0"

#: The pages written by hand: every page but the generated reference.
PAGES = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
SNIPPET = re.compile(r'^[ ]*--8<-- "examples/([^"]+)"[ ]*$', re.MULTILINE)
FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<lang>[A-Za-z]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.MULTILINE | re.DOTALL,
)
SHELLS = ("sh", "bash", "shell", "console")

#: Examples that are not Kubernetes objects for the API server, and the test that checks each.
CHECKED_ELSEWHERE = {
    # A kustomization: rendered over deploy/ by kustomize itself.
    "infracluster-rbac-kustomization.yaml": (
        "tests/unit/test_deploy.py::test_book_kustomize_overlay_adds_an_infrastructure_cluster_kind"
    ),
    # clusterctl's configuration file.
    "clusterctl.yaml": (
        "tests/unit/test_docs_examples.py::test_clusterctl_example_is_the_provider_entry_of_deploy"
    ),
}

#: Every shell command of the pages and the README -> the test that runs it, or that covers
#: what it does (``path::function``). A command not listed here fails
#: `test_every_shell_command_is_covered_by_a_test`; an entry no page uses fails too.
DEMO_PACKAGED = (
    "tests/integration/test_packaging.py::test_installed_wheel_runs_the_demo_outside_the_checkout"
)
APPLIED = "tests/unit/test_docs_examples.py::test_example_applies_to_the_api_server"
CHECK_POOL = "tests/integration/test_docs_check_pool.py::test_pool_examples_pass_check_pool"
BOUND_RELEASED = (
    "tests/integration/test_phpipam_operator.py::test_fifty_claims_bound_then_twenty_released"
)
PRINTER_COLUMNS = "tests/unit/test_crds.py::test_printer_columns_read_schema_fields"
LEASE = (
    "tests/integration/test_leader_election.py::"
    "test_only_the_leader_works_and_sigterm_hands_the_lease_over_at_once"
)
CAPV_VIP = (
    "tests/integration/test_cp_endpoint_targets.py::"
    "test_capv_template_without_vip_gets_it_in_all_three_places_once"
)
POOL_DELETION = (
    "tests/integration/test_lifecycle.py::"
    "test_pool_deletion_waits_for_a_claim_that_holds_an_entry_without_an_ipaddress"
)
AUDIT = (
    "tests/integration/test_drift_audit.py::"
    "test_phpipam_drift_is_repaired_or_reported_and_the_cli_shows_it"
)
EVENTS = "tests/integration/test_observability.py::test_events_on_allocation_release_and_failures"
MAKE_TEST = "tests/unit/test_docs_examples.py::test_make_test_is_what_ci_runs_and_builds_the_book"
COVERED: dict[str, str] = {
    "make demo": DEMO_PACKAGED,
    "make test": MAKE_TEST,
    "make install": MAKE_TEST,
    ".venv/bin/ipam-bridge demo --backend infoblox": (
        "tests/integration/test_docs_check_pool.py::test_the_infoblox_demo_runs"
    ),
    "ipam-bridge check-pool -f phpipam-pool.yaml --secret phpipam-secret.yaml": CHECK_POOL,
    "ipam-bridge check-pool -f infoblox-pool.yaml --secret infoblox-secret.yaml": CHECK_POOL,
    'echo "$PASSWORD" | ipam-bridge check-pool -f phpipam-pool.yaml --username capi-operator '
    "--password-stdin": CHECK_POOL,
    "kubectl apply -f phpipam-secret.yaml -f phpipam-pool.yaml": APPLIED,
    "kubectl apply -f infoblox-secret.yaml -f infoblox-pool.yaml": APPLIED,
    "kubectl apply -f phpipam-claim.yaml": APPLIED,
    "kubectl apply -f infoblox-claim.yaml": APPLIED,
    "kubectl apply -f claim-requested-address.yaml": APPLIED,
    "kubectl apply -f phpipam-secret.yaml": (
        "tests/integration/test_faults.py::test_wrong_credentials_fixed_in_the_secret"
    ),
    "kubectl get phpipamippools -n workload-1": PRINTER_COLUMNS,
    "kubectl get infobloxippools -n workload-1": PRINTER_COLUMNS,
    "kubectl get ipaddressclaims,ipaddresses -n workload-1": BOUND_RELEASED,
    "kubectl get ipaddressclaims -n workload-1": BOUND_RELEASED,
    "kubectl delete -f phpipam-claim.yaml": BOUND_RELEASED,
    "kubectl describe ipaddressclaim db-1-eth0 -n workload-1": (
        "tests/integration/test_requested_address.py::test_requested_addresses_granted_held_and_outside"
    ),
    "kubectl get lease ipam-bridge -n ipam-bridge-system": LEASE,
    "make image IMG=registry.example.com/ipam-bridge:v0.1.0": (
        "tests/unit/test_deploy.py::test_makefile_has_the_release_targets"
    ),
    "make release-manifests": "tests/unit/test_deploy.py::test_release_renders_with_kustomize_only",
    "kubectl apply -k deploy/": (
        "tests/unit/test_deploy.py::test_install_objects_are_valid_kubernetes_objects"
    ),
    "clusterctl init --ipam bridge": (
        "tests/unit/test_deploy.py::test_components_follow_the_clusterctl_rules"
    ),
    "helm install ipam-bridge deploy/helm/ipam-bridge -n ipam-bridge-system --create-namespace": (
        "tests/unit/test_deploy.py::test_helm_template_equals_the_install"
    ),
    ".venv/bin/ipam-bridge run": (
        "tests/integration/test_observability.py::test_json_logs_and_probe_of_the_cli"
    ),
    ".venv/bin/ipam-bridge run --namespace workload-1": (
        "tests/integration/test_observability.py::test_namespace_scope_and_sigterm"
    ),
    "helm upgrade ipam-bridge deploy/helm/ipam-bridge -n ipam-bridge-system --reuse-values "
    "--set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true "
    "--set metrics.dashboard.enabled=true "
    "--set metrics.serviceMonitor.labels.release=kube-prometheus-stack "
    "--set metrics.prometheusRule.labels.release=kube-prometheus-stack": (
        "tests/unit/test_monitoring.py::test_chart_renders_every_monitoring_value_on"
    ),
    "kubectl apply -k deploy/monitoring": (
        "tests/unit/test_monitoring.py::test_monitoring_component_renders_and_validates"
    ),
    "kubectl label namespace ipam-bridge-system pod-security.kubernetes.io/enforce=restricted": (
        "tests/unit/test_docs_examples.py::test_the_manager_pod_meets_the_restricted_standard"
    ),
    'export CONTROL_PLANE_ENDPOINT_IP=""': CAPV_VIP,
    "clusterctl generate cluster workload-1 --infrastructure vsphere --target-namespace "
    "workload-1 --kubernetes-version v1.33.0 --control-plane-machine-count 3 "
    "> workload-1.yaml": CAPV_VIP,
    "kubectl apply -f workload-1.yaml": CAPV_VIP,
    "kubectl get cluster workload-1 -n workload-1 -o jsonpath="
    "'{.spec.controlPlaneEndpoint.host} {.spec.paused}{\"\\n\"}'": CAPV_VIP,
    "kubectl get vspherecluster workload-1 -n workload-1 -o jsonpath="
    "'{.spec.controlPlaneEndpoint.host}{\"\\n\"}'": CAPV_VIP,
    "kubectl get events -n workload-1 --field-selector "
    "involvedObject.kind=Cluster,involvedObject.name=workload-1": CAPV_VIP,
    "helm upgrade ipam-bridge deploy/helm/ipam-bridge --reuse-values --set-json "
    '\'infrastructureClusters=[{"apiGroup":"infrastructure.cluster.x-k8s.io",'
    '"resources":["dockerclusters"]}]\'': (
        "tests/unit/test_deploy.py::test_helm_value_adds_an_infrastructure_cluster_kind"
    ),
    "kubectl delete phpipamippool nodes-v4 -n workload-1": POOL_DELETION,
    "kubectl describe phpipamippool nodes-v4 -n workload-1": POOL_DELETION,
    "kubectl get phpipamippool nodes-v4 -n workload-1 -o jsonpath="
    "'{.status.conditions[?(@.type==\"InSync\")].message}'": AUDIT,
    "ipam-bridge audit": AUDIT,
    "ipam-bridge audit --namespace workload-1 --output json": AUDIT,
    "kubectl describe ipaddressclaim <claim> -n <namespace>": EVENTS,
    "kubectl get events -n <namespace> --field-selector involvedObject.name=<claim>": EVENTS,
    "kubectl describe phpipamippool <pool> -n <namespace>": (
        "tests/integration/test_phpipam_operator.py::test_bad_pool_is_reported_contained_and_recovers"
    ),
    'kubectl -n ipam-bridge-system logs "$(kubectl -n ipam-bridge-system get lease ipam-bridge '
    "-o jsonpath='{.spec.holderIdentity}' | sed 's/_[^_]*$//')\"": (
        "tests/unit/test_deploy.py::test_chart_notes_show_the_leader"
    ),
}


def _fences(text: str) -> Iterator[tuple[str, list[str]]]:
    """Yield ``(language, lines)`` of each fenced block, its indentation removed."""
    for match in FENCE.finditer(text):
        indent = len(match["indent"])
        yield match["lang"], [line[indent:] for line in match["body"].splitlines()]


def shell_commands(text: str) -> list[str]:
    """Return the commands of the shell blocks of a Markdown text, one string each.

    ``console`` blocks: the lines after ``$ `` (the rest is output). A line ending in a
    backslash continues on the next one; whitespace runs are one space; comment lines go.
    """
    commands: list[str] = []
    for lang, lines in _fences(text):
        if lang not in SHELLS:
            continue
        pending = ""
        for line in lines:
            if not pending and lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            line = re.split(r"\s{2,}# ", line, maxsplit=1)[0]  # a comment after the command
            pending += " " + line.removesuffix("\\")
            if not line.endswith("\\"):
                commands.append(" ".join(pending.split()))
                pending = ""
    return commands


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


# -- one place for each thing --------------------------------------------------------------

#: Words in a row two pages may share: more is a copied passage (link to it instead).
SHARED_WORDS = 14


def _prose_words(page: Path) -> list[str]:
    text = re.sub(r"^[ ]*```.*?^[ ]*```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return re.findall(r"[\w`'./<>-]+", text.lower())


def test_no_page_repeats_another_pages_text() -> None:
    owner: dict[tuple[str, ...], Path] = {}
    copied: set[tuple[str, str, str]] = set()
    for page in PAGES:
        words = _prose_words(page)
        for i in range(len(words) - SHARED_WORDS + 1):
            run = tuple(words[i : i + SHARED_WORDS])
            first = owner.setdefault(run, page)
            if first != page:
                copied.add((first.name, page.name, " ".join(run)))
    assert not copied, sorted(copied)[:5]


# -- where manifests live ---------------------------------------------------------------------


def test_every_example_is_included_by_a_page_and_every_inclusion_exists() -> None:
    included = {name for page in PAGES for name in SNIPPET.findall(page.read_text())}
    assert included, "no page includes an example"
    assert included == {p.name for p in EXAMPLE_FILES}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_pages_write_no_manifest_inline(page: Path) -> None:
    """A YAML block of a page is one snippet line: the manifest lives in docs/examples/."""
    for lang, lines in _fences(page.read_text(encoding="utf-8")):
        if lang in ("yaml", "yml"):
            body = [line for line in lines if line.strip()]
            assert len(body) == 1 and SNIPPET.match(body[0]), (page.name, body[:3])


def test_readme_manifests_are_documents_of_the_examples() -> None:
    known = [doc for path in EXAMPLE_FILES for doc in _documents(path)]
    shown = [
        doc
        for lang, lines in _fences(README.read_text(encoding="utf-8"))
        if lang in ("yaml", "yml")
        for doc in yaml.safe_load_all("\n".join(lines))
        if doc is not None
    ]
    assert shown, "the README shows no manifest"
    for doc in shown:
        assert doc in known, f"README manifest not in docs/examples/: {doc.get('kind')}"


# -- the examples apply --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube() -> Iterator[EmulatedKubernetes]:
    """The in-memory API server with our CRDs and CAPI v1.14's (Cluster, ClusterClass too)."""
    crds = crd_documents(capi_crds=[ROOT / "crds" / "capi" / "cluster.x-k8s.io_clusters.yaml"])
    crds += _documents(CAPI_1_14 / "cluster.x-k8s.io_clusterclasses.yaml")
    with EmulatedKubernetes(crds=crds) as emulator:
        yield emulator


def _apply(kube: EmulatedKubernetes, doc: dict[str, Any]) -> dict[str, Any]:
    """Create ``doc`` as ``kubectl apply`` would (strict field validation), its namespace first."""
    store = kube.store
    defn = store.find_kind(doc["apiVersion"], doc["kind"])
    namespace = (doc.get("metadata") or {}).get("namespace")
    if defn.namespaced:
        assert namespace, f"{doc['kind']} {doc['metadata']['name']}: no metadata.namespace"
        if kube.get("v1", "namespaces", namespace) is None:
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    else:
        assert namespace is None, f"{doc['kind']} is cluster-scoped: no namespace"
    version = doc["apiVersion"].rpartition("/")[2]
    created: dict[str, Any] = kube.call(
        store.create, defn, namespace, doc, version=version, field_validation="Strict"
    )
    return created


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_applies_to_the_api_server(kube: EmulatedKubernetes, path: Path) -> None:
    if path.name in CHECKED_ELSEWHERE:
        pytest.skip(f"not an API object: {CHECKED_ELSEWHERE[path.name]}")
    for doc in _documents(path):
        created = _apply(kube, doc)
        try:
            assert created["metadata"].get("namespace") == doc["metadata"].get("namespace")
        finally:
            defn = kube.store.find_kind(doc["apiVersion"], doc["kind"])
            namespace = created["metadata"].get("namespace")
            kube.call(kube.store.delete, defn, namespace, doc["metadata"]["name"])


def test_an_example_breaking_its_schema_is_refused(kube: EmulatedKubernetes) -> None:
    """The check above can fail: an unknown field and a namespaced pool without a namespace."""
    from mock_kubernetes import ApiError

    pool = _documents(EXAMPLES / "phpipam-pool.yaml")[0]
    typo = {**pool, "spec": {**pool["spec"], "subnetID": 7}}
    with pytest.raises(ApiError) as caught:
        _apply(kube, typo)
    assert caught.value.status == 400 and "subnetID" in str(caught.value)
    orphan = {**pool, "metadata": {"name": "nodes-v4"}}
    with pytest.raises(AssertionError, match=r"no metadata\.namespace"):
        _apply(kube, orphan)


def test_clusterctl_example_is_the_provider_entry_of_deploy() -> None:
    example = _documents(EXAMPLES / "clusterctl.yaml")[0]
    shipped = yaml.safe_load((ROOT / "deploy" / "clusterctl.yaml.example").read_text())
    assert example == {"providers": shipped["providers"]}


# -- commands ------------------------------------------------------------------------------


def test_shell_commands_are_read_as_a_shell_reads_them() -> None:
    text = "```console\n$ a \\\n  --b\nout\n$ c\n```\n\n  ```sh\n  # note\n  d  e   # why\n  ```\n"
    assert shell_commands(text) == ["a --b", "c", "d e"]


def test_every_shell_command_is_covered_by_a_test() -> None:
    used: dict[str, str] = {}
    for path in [*PAGES, README]:
        for command in shell_commands(path.read_text(encoding="utf-8")):
            used.setdefault(command, str(path.relative_to(ROOT)))
    uncovered = {c: where for c, where in used.items() if c not in COVERED}
    assert not uncovered, f"commands no test covers (add to COVERED): {uncovered}"
    assert not set(COVERED) - set(used), "COVERED lists commands no page shows any more"
    for command, test in COVERED.items():
        file, _, name = test.partition("::")
        source = (ROOT / file).read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), (command, test)


def test_make_test_is_what_ci_runs_and_builds_the_book() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test: (.*)$", makefile, re.MULTILINE)
    assert target and "$(STAMP)" in target[1]  # `make install`'s stamp
    recipe = makefile[target.end() : makefile.index("\n\n", target.end())]
    assert "docs-build" in recipe
    assert re.search(r"^docs-build:.*\n\t.*mkdocs build --strict", makefile, re.MULTILINE)
    demo = re.search(r"^demo: .*\n\t(.*)$", makefile, re.MULTILINE)
    assert demo and demo[1].strip() == "$(BIN)/ipam-bridge demo"


# -- what the pages say of the code ----------------------------------------------------------------


def test_the_audit_table_of_the_book_is_what_the_cli_prints() -> None:
    page = (DOCS / "tasks" / "drift-audit.md").read_text(encoding="utf-8")
    table = next(lines for lang, lines in _fences(page) if lang == "text")
    findings = [
        Finding(
            pool="workload-1/nodes-v4",
            kind="PHPIPAMIPPool",
            claim=claim,
            address=address,
            hostname=hostname,
            finding=kind,
            message="",
            ip_address="",
            expected="",
        )
        for claim, address, hostname, kind in (
            ("workload-1/md-0-x7k2p", "10.20.0.3", "printer-7", FindingKind.CONFLICT),
            ("workload-1/md-0-gone1", "10.20.0.200", "md-0-gone1.workload-1", FindingKind.ORPHAN),
        )
    ]
    assert "\n".join(table) == format_table(findings)


#: Helm values documented as a whole (a map or list handed to the manifest as it is).
WHOLE_VALUES = {
    "settings",
    "resources",
    "podAnnotations",
    "nodeSelector",
    "tolerations",
    "affinity",
}


def _value_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in WHOLE_VALUES:
            yield from _value_paths(value, f"{path}.")
        else:
            yield path


def test_the_install_page_documents_every_helm_value() -> None:
    page = (DOCS / "operations" / "install.md").read_text(encoding="utf-8")
    helm = page[page.index("## Helm") : page.index("\n## ", page.index("## Helm") + 1)]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "ipam-bridge" / "values.yaml").read_text())
    shown = set(re.findall(r"`([\w.]+)`", helm))
    for path in _value_paths(values):
        # A row names the path, or a sibling's path and then its last key: `a.b.x`, `.y`.
        parent, _, last = path.rpartition(".")
        grouped = f".{last}" in shown and any(p.startswith(f"{parent}.") for p in shown)
        assert path in shown or grouped, f"Helm value {path} not on the install page"
    # ... and every value a row names is one of the chart's.
    paths = set(_value_paths(values))
    for row in re.findall(r"^\| (`[^|]+)\|", helm, re.MULTILINE):
        names = re.findall(r"`([\w.]+)`", row)
        full = [n for n in names if not n.startswith(".")]
        base = full[0].rpartition(".")[0]
        for name in full + [base + n for n in names if n.startswith(".")]:
            assert name in paths or any(p.startswith(f"{name}.") for p in paths), name


def test_the_manager_pod_meets_the_restricted_standard() -> None:
    """Each control of the ``restricted`` Pod Security Standard, on deploy/'s Deployment.

    https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted (and the
    baseline controls it includes). The chart renders the same Deployment
    (tests/unit/test_deploy.py::test_helm_template_equals_the_install).
    """
    deployment = _documents(ROOT / "deploy" / "manager" / "deployment.yaml")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("emptyDir" in v or "configMap" in v for v in pod.get("volumes", []))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"].get("runAsUser", 1) != 0
    assert pod["securityContext"]["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    for container in pod["containers"] + pod.get("initContainers", []):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert not security.get("privileged")
        assert security["capabilities"]["drop"] == ["ALL"]
        assert set(security["capabilities"].get("add", [])) <= {"NET_BIND_SERVICE"}
        assert not any(port.get("hostPort") for port in container.get("ports", []))
        assert security.get("runAsUser", 1) != 0
