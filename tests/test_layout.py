"""The code's shape, checked as a maintainer would: modules small enough to read in
one sitting, classes and functions with few enough parts to hold in mind, one owner
of every transaction, and a command line that does not carry the benchmark.
(The import layers are `lint-imports`' contracts in pyproject.toml.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from app.platform.settings import ROOT

APP = ROOT / "app"
MODELBUILD = ROOT / "modelbuild"  # the bundled models' builders, held to the same shape
GENERATED = APP / "grpc" / "generated"
DOORS = ("web", "grpc", "streams", "cli")  # app/<door>/: protocols, not operations
MAX_LINES = 450
MAX_PUBLIC_METHODS = 20
MAX_PARAMETERS = 8
# The unit of work (app.platform.database) is the one place that ends a transaction.
TRANSACTION_OWNER = APP / "platform" / "database.py"


def _modules() -> Iterator[Path]:
    for root in (APP, MODELBUILD):
        for path in sorted(root.rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def _below_the_doors(path: Path) -> bool:
    if APP not in path.parents:
        return True
    parts = path.relative_to(APP).parts
    return not (len(parts) > 1 and parts[0] in DOORS)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_no_module_is_over_450_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): count
        for path in _modules()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules (lines): {long}"


def test_no_class_has_more_than_20_public_methods() -> None:
    crowded = {}
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                public = [
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not item.name.startswith("_")
                ]
                if len(public) > MAX_PUBLIC_METHODS:
                    crowded[f"{path.relative_to(ROOT)}:{node.name}"] = len(public)
    assert not crowded, f"split these classes (public methods): {crowded}"


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    names = [a.arg for a in named if a.arg not in ("self", "cls")]
    names += [f"*{a.arg}" for a in (args.vararg, args.kwarg) if a is not None]
    return names


def test_no_function_below_the_doors_takes_more_than_8_parameters() -> None:
    wide = {}
    for path in filter(_below_the_doors, _modules()):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if len(params := _parameters(node)) > MAX_PARAMETERS:
                wide[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = len(params)
    assert not wide, f"give these fewer parameters (a request or settings object): {wide}"


def _calls(path: Path, name: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
    ]


def test_only_the_unit_of_work_commits_or_rolls_back() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}": name
        for path in _modules()
        if path != TRANSACTION_OWNER
        for name in ("commit", "rollback")
        for line in _calls(path, name)
    }
    assert not found, f"a transaction ends only in Database.unit_of_work: {found}"
    # The check reads calls, so it sees them where they are.
    assert _calls(TRANSACTION_OWNER, "commit") and _calls(TRANSACTION_OWNER, "rollback")


def test_importing_the_command_line_loads_no_benchmark() -> None:
    probe = (
        "import sys, manage; "
        "loaded = [m for m in sys.modules if m == 'bench' or m.startswith('bench.')]; "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"manage imports the benchmark: {run.stdout}{run.stderr}"
