"""The library never depends on the benchmark harness, and holds no global random or cached state.

``gpext_bench`` (harness, dataset loaders, command line) depends on ``gpext``; the reverse import
would drag scikit-learn and the harness's module-level state into every ``import gpext``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpext

GPEXT_DIR = Path(gpext.__file__).resolve().parent
GPEXT_FILES = sorted(GPEXT_DIR.rglob("*.py"))
FORBIDDEN = ("gpext_bench", "sklearn")


def _loaded_after(statement: str) -> dict[str, list[str]]:
    """Run ``statement`` in a fresh interpreter; the forbidden top-level modules it loaded."""
    code = (
        "import json, sys\n"
        f"{statement}\n"
        f"print(json.dumps({{p: sorted(m for m in sys.modules if m == p or m.startswith(p + '.'))"
        f" for p in {FORBIDDEN!r}}}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_gpext_files_found():
    assert len(GPEXT_FILES) > 20 and (GPEXT_DIR / "__init__.py") in GPEXT_FILES


def test_import_gpext_loads_neither_harness_nor_sklearn():
    assert _loaded_after("import gpext") == {name: [] for name in FORBIDDEN}


def test_importing_every_gpext_module_loads_neither_harness_nor_sklearn():
    statement = (
        "import importlib, pkgutil, gpext\n"
        "for info in pkgutil.walk_packages(gpext.__path__, 'gpext.'):\n"
        "    if not info.name.startswith('gpext.integrations.botorch'):\n"
        "        importlib.import_module(info.name)"
    )
    assert _loaded_after(statement) == {name: [] for name in FORBIDDEN}


@pytest.mark.skipif(importlib.util.find_spec("botorch") is None, reason="botorch not installed")
def test_import_botorch_integration_loads_neither_harness_nor_sklearn():
    loaded = _loaded_after("import gpext.integrations.botorch")
    assert loaded == {name: [] for name in FORBIDDEN}


def _imported_modules(tree: ast.AST) -> list[str]:
    """Every module named by an import statement or an ``import_module("...")`` call."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = getattr(func, "attr", getattr(func, "id", None))
            arg = node.args[0]
            if fname in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                names.append(str(arg.value))
    return names


@pytest.mark.parametrize("path", GPEXT_FILES, ids=lambda p: str(p.relative_to(GPEXT_DIR)))
def test_gpext_source_never_imports_harness_or_sklearn(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [m for m in _imported_modules(tree) if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path} imports {bad}: gpext must not depend on gpext_bench or scikit-learn"


def _call_name(node: ast.Call) -> str:
    """Dotted name of a call's function, e.g. ``torch.random.fork_rng``."""
    parts = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


GLOBAL_SEEDING = {
    "torch.manual_seed",
    "torch.seed",
    "torch.random.manual_seed",
    "torch.random.seed",
    "torch.set_rng_state",
    "torch.random.set_rng_state",
    "np.random.seed",
    "numpy.random.seed",
    "random.seed",
}
CACHES = {"functools.lru_cache", "functools.cache", "lru_cache", "cache"}


def _global_state_uses(tree: ast.AST) -> list[str]:
    """Global seeding outside a ``torch.random.fork_rng()`` block, and memoising decorators."""
    found = []

    def visit(node: ast.AST, forked: bool) -> None:
        if isinstance(node, (ast.With, ast.AsyncWith)):
            forked = forked or any(
                isinstance(item.context_expr, ast.Call)
                and _call_name(item.context_expr).endswith("fork_rng")
                for item in node.items
            )
        if isinstance(node, ast.Call) and not forked and _call_name(node) in GLOBAL_SEEDING:
            found.append(f"line {node.lineno}: {_call_name(node)}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = _call_name(ast.Call(func=target, args=[], keywords=[]))
                if name in CACHES:
                    found.append(f"line {dec.lineno}: @{name}")
        if isinstance(node, ast.Global):
            found.append(f"line {node.lineno}: global {', '.join(node.names)}")
        for child in ast.iter_child_nodes(node):
            visit(child, forked)

    visit(tree, False)
    for stmt in getattr(tree, "body", []):  # module-level empty containers filled at run time
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        empty_literal = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
            getattr(value, "keys", None) or getattr(value, "elts", None)
        )
        empty_call = (
            isinstance(value, ast.Call)
            and _call_name(value) in ("dict", "list", "set", "collections.OrderedDict")
            and not value.args
        )
        if empty_literal or empty_call:
            found.append(f"line {stmt.lineno}: module-level mutable container")
    return found


@pytest.mark.parametrize("path", GPEXT_FILES, ids=lambda p: str(p.relative_to(GPEXT_DIR)))
def test_gpext_source_holds_no_global_rng_or_cache_state(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    uses = _global_state_uses(tree)
    assert not uses, (
        f"{path}: {uses}. Take a torch.Generator argument instead of seeding the global RNG "
        "(or restore it with torch.random.fork_rng()), and keep caches out of module state."
    )


def test_global_state_check_catches_what_it_should():
    src = (
        "import functools, torch\n"
        "torch.manual_seed(0)\n"
        "with torch.random.fork_rng(devices=[]):\n"
        "    torch.manual_seed(1)\n"
        "@functools.lru_cache(maxsize=2)\n"
        "def f(): pass\n"
        "_CACHE: dict = {}\n"
        "_TABLE = {'a': 1}\n"
    )
    assert _global_state_uses(ast.parse(src)) == [
        "line 2: torch.manual_seed",
        "line 5: @functools.lru_cache",
        "line 7: module-level mutable container",
    ]
    assert _imported_modules(ast.parse("from gpext_bench.data import x\nimport sklearn")) == [
        "gpext_bench.data",
        "sklearn",
    ]
