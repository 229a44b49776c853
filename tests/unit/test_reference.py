"""The docs site's reference is the code's: generated pages are fresh, every reason is explained.

``docs/gen_reference.py`` generates ``docs/reference/*.md`` (``make reference``); these tests
fail when a page is stale, when the code writes a condition or Event reason that
`bridge.reasons` does not enumerate, and when ``docs/troubleshooting.md`` has no ``## <Reason>``
heading for one. They also check the MkDocs configuration (navigation, hooks) without
building the site (``make docs-build`` does, in ``make test``).
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from bridge import reasons
from bridge.capi import Reason

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load("gen_reference", DOCS / "gen_reference.py")
hooks = _load("mkdocs_hooks", DOCS / "mkdocs_hooks.py")


# --- generated pages ---------------------------------------------------------------------


def test_the_generated_reference_is_fresh() -> None:
    assert gen.check() == [], "stale: run `make reference` and commit docs/reference/"


def test_check_names_a_stale_or_missing_page(tmp_path: Path) -> None:
    texts = gen.pages()
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    assert gen.check(tmp_path, texts) == []
    (tmp_path / "settings.md").write_text("# Settings\n\nhand-edited\n")
    (tmp_path / "cli.md").unlink()
    assert gen.check(tmp_path, texts) == ["settings.md", "cli.md"]


def test_pool_fields_cover_every_field_of_the_four_kinds() -> None:
    page = gen.pool_fields_page()
    for path in sorted((ROOT / "crds").glob("ipam.cluster.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        assert f"## {kind}\n" in page
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for field in _paths(schema["properties"]["spec"], "spec"):
            assert f"| `{field}` |" in page, (kind, field)
    # a default, a CEL rule's message, an enum and the required mark are all shown
    assert "| `spec.wapiVersion` | string |   | `2.12` |" in page
    assert "CEL: endpoint is immutable" in page
    assert "one of `host`, `fixedaddress`" in page
    assert "| `spec.endpoint` | string | yes |" in page


def _paths(node: dict[str, Any], path: str) -> Iterator[str]:
    yield path
    if node.get("type") == "array" and "items" in node:
        node, path = node["items"], f"{path}[]"
    for name, child in (node.get("properties") or {}).items():
        yield from _paths(child, f"{path}.{name}")


def test_settings_page_lists_every_setting_with_its_former_names() -> None:
    from bridge.settings import DEPRECATED_NAMES, Settings

    page = gen.settings_page()
    for name, field in Settings.model_fields.items():
        env = f"IPAM_BRIDGE_{name.upper()}"
        assert f"| `{env}` |" in page
        assert field.description, f"{env} has no description"
    for old in DEPRECATED_NAMES:
        assert f"`{old}`" in page
    # the code's default and what the installs set, side by side
    (log_format,) = [line for line in page.splitlines() if "`IPAM_BRIDGE_LOG_FORMAT`" in line]
    assert "| `text` | `json` |" in log_format


def test_metrics_page_lists_every_metric_with_type_and_labels() -> None:
    from bridge.metrics import Metrics

    page = gen.metrics_page()
    families = list(Metrics().registry.collect())
    assert families
    for family in families:
        assert f"`{gen._exposed(family.name, family.type).split(',')[0]}`" in page
    assert "| `ipam_bridge_allocations_total` | counter | `pool`, `kind`, `result` |" in page


def test_cli_page_has_every_subcommand_and_option() -> None:
    page = gen.cli_page()
    for command in ("run", "demo", "audit", "check-pool", "version"):
        assert f"## ipam-bridge {command}\n" in page
    assert "--password-stdin" in page and "--all-namespaces" in page


# --- reasons -----------------------------------------------------------------------------


def test_every_reason_member_has_a_description() -> None:
    for enumeration in reasons.ENUMERATIONS:
        comments = gen.member_comments(enumeration.reasons)
        for member in enumeration.reasons:
            assert comments.get(member.name), f"{member!r} has no #: comment"


#: Calls whose argument is a reason: ``events.post(obj, type, reason, message)``,
#: ``post_event(obj, type=, reason=, message=)``, ``ClaimError(reason, ...)``,
#: ``PoolError(reason, ...)``; plus any ``reason=`` keyword and ``"reason":`` dict entry.
_REASON_POSITION = {"post": 2, "ClaimError": 0, "PoolError": 0}


def _reason_expressions(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            position = _REASON_POSITION.get(name)
            if position is not None and len(node.args) > position:
                yield node.args[position]
            yield from (kw.value for kw in node.keywords if kw.arg == "reason")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "reason":
                    yield value


@functools.cache
def _sources() -> list[tuple[Path, ast.Module]]:
    """The parsed modules of the operator (bridge/, backends/)."""
    paths = sorted([*(ROOT / "bridge").rglob("*.py"), *(ROOT / "backends").rglob("*.py")])
    return [(path, ast.parse(path.read_text(), str(path))) for path in paths]


def _literal_reasons() -> dict[str, str]:
    """Return ``{reason literal: where}`` of every string literal written as a reason."""
    found = {}
    for path, tree in _sources():
        for expr in _reason_expressions(tree):
            if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
                found[expr.value] = f"{path.relative_to(ROOT)}:{expr.lineno}"
    return found


def test_the_code_writes_no_reason_outside_the_enumerations() -> None:
    known = set(reasons.all_reasons())
    unknown = {value: where for value, where in _literal_reasons().items() if value not in known}
    assert unknown == {}, "add these reasons to an enumeration of bridge/reasons.py"


def test_the_scan_finds_a_literal_reason() -> None:
    source = 'deps.events.post(obj, "Warning", "SomethingNew", "msg")\nx = {"reason": "Other"}'
    values = [e.value for e in _reason_expressions(ast.parse(source))]  # type: ignore[attr-defined]
    assert values == ["SomethingNew", "Other"]


def test_the_enumerations_hold_every_reason_enum_of_the_operator() -> None:
    """A StrEnum named ``*Reason`` anywhere in bridge/ is listed in `bridge.reasons`."""
    listed = {e.reasons.__name__ for e in reasons.ENUMERATIONS}
    declared = {
        node.name
        for _, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.endswith("Reason")
    }
    assert declared == listed
    assert all(issubclass(e.reasons, enum.StrEnum) for e in reasons.ENUMERATIONS)
    assert "ControlPlaneEndpointClaimMismatch" in reasons.all_reasons()
    assert "ControlPlaneEndpointRefused" in reasons.all_reasons()
    assert str(Reason.ORPHAN_ENTRY) in reasons.all_reasons()


def _headings(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    return {m.group(1).strip().strip("`") for m in re.finditer(r"^## +(.+)$", text, re.M)}


def test_troubleshooting_explains_every_reason() -> None:
    page = DOCS / "troubleshooting.md"
    assert page.is_file(), "docs/troubleshooting.md is missing"
    missing = [r for r in reasons.all_reasons() if r not in _headings(page)]
    assert missing == [], "docs/troubleshooting.md needs a `## <Reason>` heading for each"


def test_troubleshooting_check_fails_on_a_page_without_a_reason(tmp_path: Path) -> None:
    page = tmp_path / "troubleshooting.md"
    page.write_text("# Troubleshooting\n\n## PoolNotReady\n\n### AddressAllocated\n")
    assert _headings(page) == {"PoolNotReady"}


# --- MkDocs configuration ----------------------------------------------------------------


def _config() -> dict[str, Any]:
    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use tags (!!python/name:...) that safe_load refuses: keep them as text.
    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    loaded: dict[str, Any] = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    return loaded


def _nav_paths(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for item in node:
            yield from _nav_paths(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_paths(value)
    elif isinstance(node, str):
        yield node


#: The pages of the book (BRIEF: "The docs site").
BOOK = [
    "index.md",
    "getting-started/phpipam.md",
    "getting-started/infoblox.md",
    "getting-started/demo.md",
    "concepts/claims.md",
    "concepts/pools.md",
    "concepts/lifecycle-events.md",
    "tasks/pin-an-address.md",
    "tasks/share-an-ipam.md",
    "tasks/control-plane-vip.md",
    "tasks/rotate-credentials.md",
    "tasks/drain-a-pool.md",
    "tasks/drift-audit.md",
    "tasks/check-a-pool.md",
    "operations/install.md",
    "operations/high-availability.md",
    "operations/monitoring.md",
    "operations/podsecurity.md",
    "operations/upgrade.md",
    "troubleshooting.md",
    "architecture.md",
    "performance.md",
    "reference/pool-fields.md",
    "reference/settings.md",
    "reference/metrics.md",
    "reference/cli.md",
    "reference/reasons.md",
]


def test_the_navigation_holds_every_page_of_the_book_and_every_page_exists() -> None:
    config = _config()
    assert config["strict"] is True
    assert config["theme"]["name"] == "material"
    nav = list(_nav_paths(config["nav"]))
    assert set(BOOK) <= set(nav), "a page of the book is missing from the navigation"
    assert [p for p in nav if not (DOCS / p).is_file()] == []
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - set(nav) == set(), "a page outside the navigation"
    snippets = [e for e in config["markdown_extensions"] if isinstance(e, dict)]
    (options,) = [e["pymdownx.snippets"] for e in snippets if "pymdownx.snippets" in e]
    assert options["base_path"] == ["docs"] and options["check_paths"] is True


def test_hook_links_repository_files_outside_docs(tmp_path: Path) -> None:
    (tmp_path / "docs" / "tasks").mkdir(parents=True)
    (tmp_path / "deploy").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    repo = "https://github.com/ipam-bridge/ipam-bridge"
    page = tmp_path / "docs" / "tasks"
    docs = tmp_path / "docs"
    assert hooks.repo_link("../../README.md", page, docs, repo) == f"{repo}/blob/main/README.md"
    assert hooks.repo_link("../../deploy", page, docs, repo) == f"{repo}/tree/main/deploy"
    assert hooks.repo_link("../../missing.md", page, docs, repo) is None  # left: strict fails
    assert hooks.repo_link("../index.md", page, docs, repo) is None  # a page: MkDocs' own


def test_dockerignore_keeps_the_docs_out_of_the_image() -> None:
    """The image build context is an allow-list without docs/ and mkdocs.yml."""
    allowed = [
        line[1:].strip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    assert "docs" not in allowed and "mkdocs.yml" not in allowed
    assert "*" in (ROOT / ".dockerignore").read_text().splitlines()


def _environment_reads() -> dict[str, str]:
    """Return ``{name: where}`` of every ``os.environ.get("NAME")``/``os.environ["NAME"]``."""
    found = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "get" and ast.unparse(node.func.value) == "os.environ":
                    target = node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                target = node.slice
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                found[target.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    from bridge.settings import ENV_PREFIX, OTHER_ENVIRONMENT

    listed = {name.strip() for names in OTHER_ENVIRONMENT for name in names.split(",")}
    reads = _environment_reads()
    assert "REQUESTS_CA_BUNDLE" in reads and "POD_NAME" in reads
    undocumented = {
        name: where
        for name, where in reads.items()
        if not name.startswith(ENV_PREFIX) and name not in listed
    }
    assert undocumented == {}, "list them in bridge.settings.OTHER_ENVIRONMENT"
