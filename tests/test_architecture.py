"""The arrows between the apps point one way: ``approvals/`` uses the journal, never
the reverse (style.md, "Layout"). The journal announces what happened with signals
(runs/signals.py) and ``approvals/`` listens."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imports_of(folder: str, app: str) -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        wrong = sorted(m for m in _imported_modules(path) if m == app or m.startswith(app + "."))
        if wrong:
            found[str(path.relative_to(ROOT))] = wrong
    return found


def test_no_module_under_runs_imports_approvals():
    assert _imports_of("runs", "approvals") == {}


def test_the_console_does_not_import_the_agent_apis_schemas():
    # Shared validation lives in runs/validation.py, which neither face owns.
    offenders = {
        path: modules
        for path, modules in _imports_of("approvals", "runs").items()
        if any(m == "runs.api" or m.startswith("runs.api.") for m in modules)
    }
    assert offenders == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from approvals.notifications import notify\n")
    assert "approvals.notifications" in _imported_modules(module)


def test_the_journals_rules_do_not_import_the_agent_api():
    # runs/api/ is the HTTP face of the journal (router, schemas, auth, idempotency,
    # rate limit, the poll); the models, rules and sweep under runs/ never need it.
    # runs/tasks.py is the exception: the beat schedule prunes the API's kept answers.
    offenders = {
        path: modules
        for path, modules in _imports_of("runs", "runs").items()
        if not path.startswith(("runs/api/", "runs/tasks.py"))
        and any(m == "runs.api" or m.startswith("runs.api.") for m in modules)
    }
    assert offenders == {}
