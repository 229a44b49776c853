"""The tree keeps its rooms: what each package may import, and how long a function may be.

`docs/architecture.md` describes the rooms: ``bridge/runtime/`` is the controller machinery
and knows nothing of the decisions (``bridge/reconcilers/``), of CAPI (``bridge/capi.py``,
``bridge/models.py``, ``bridge/objects/``) or of the IPAM clients (``backends/``); the
decisions (``bridge/reconcilers/``) and the objects (``bridge/objects/``) know nothing of
the composition root (``bridge/operator.py``), of the kopf adapters (``bridge/handlers/``)
or of kopf: each gets what it uses as arguments; the operator (``bridge/``, ``backends/``)
imports nothing of the sandbox (the in-memory Kubernetes API and the IPAM mocks).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What ``bridge/runtime/`` must not import (a module or any of its submodules).
NOT_IN_RUNTIME = (
    "backends",
    "bridge.capi",
    "bridge.handlers",
    "bridge.models",
    "bridge.objects",
    "bridge.operator",
    "bridge.reconcilers",
)
#: What ``bridge/reconcilers/`` and ``bridge/objects/`` must not import: the layers above
#: them (the composition root, the kopf adapters) and kopf.
NOT_IN_DECISIONS = ("bridge.handlers", "bridge.operator", "kopf")
#: The sandbox: never imported by the operator.
SANDBOX = ("mock_kubernetes", "mock_phpipam", "mock_infoblox")
#: Lines a function may have, its docstring excluded.
MAX_LINES = 60
#: Runtime modules still importing something they should not, and why (they are in work).
PENDING_PURITY: dict[str, str] = {}


#: Modules still importing the sandbox when imported, and why (they are in work).
PENDING_SANDBOX: dict[str, str] = {}


def _modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _imports(path: Path, *, top_level: bool = False) -> Iterator[str]:
    """Yield every module ``path`` imports (absolute names; relative ones resolved).

    ``top_level``: only the imports run when the module is imported (not in functions).
    """
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body if top_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in roots)


@pytest.mark.parametrize("path", _modules("bridge/runtime"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runtime_imports_no_decision_no_capi_and_no_backend(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    if relative in PENDING_PURITY:
        pytest.xfail(PENDING_PURITY[relative])
    found = sorted({name for name in _imports(path) if _within(name, NOT_IN_RUNTIME)})
    assert found == [], f"{relative} imports {', '.join(found)}"


@pytest.mark.parametrize(
    "path", _modules("bridge/reconcilers", "bridge/objects"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_decisions_import_neither_the_composition_root_nor_kopf(path: Path) -> None:
    """Reconcilers and objects take their dependencies as arguments, never the `Operator`."""
    relative = str(path.relative_to(ROOT))
    found = sorted({name for name in _imports(path) if _within(name, NOT_IN_DECISIONS)})
    assert found == [], f"{relative} imports {', '.join(found)}"


#: The IPAM client classes: the operator holds `backends.base.IPAMBackend` values, made by
#: one factory, and never asks which implementation it got.
BACKEND_CLASSES = ("backends.infoblox.InfobloxBackend", "backends.phpipam.PHPIPAMBackend")
#: The factory of the IPAM clients (pool spec -> client).
BACKEND_FACTORY = "bridge/reconcilers/pool_backends.py"


def test_only_the_factory_names_the_ipam_client_classes() -> None:
    found = {
        str(path.relative_to(ROOT)): name
        for path in _modules("bridge")
        for name in _imports(path)
        if name in BACKEND_CLASSES
    }
    assert set(found) <= {BACKEND_FACTORY}, found


@pytest.mark.parametrize(
    "path", _modules("bridge", "backends"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_operator_imports_nothing_of_the_sandbox(path: Path) -> None:
    """No module imports the sandbox when imported (the demo may, in its functions)."""
    relative = str(path.relative_to(ROOT))
    if relative in PENDING_SANDBOX:
        pytest.xfail(PENDING_SANDBOX[relative])
    found = sorted({n for n in _imports(path, top_level=True) if _within(n, SANDBOX)})
    assert found == [], f"{relative} imports {', '.join(found)}"


def _long_functions() -> list[str]:
    """Return ``path:line name (lines)`` of every function over `MAX_LINES` lines."""
    found = []
    for path in _modules("bridge", "backends"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:] or body
            first = body[0].lineno if body else node.lineno
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    return found


def test_no_function_is_longer_than_sixty_lines() -> None:
    assert _long_functions() == []
