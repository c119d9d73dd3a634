"""The import rule of docs/architecture.md, checked on the source (every import statement,
including those inside functions): each part of codeq imports only the parts listed for it, so
a new dependency between parts is a decision made here, not an accident."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOUNDATION = {"codeq.errors"}
# what running a search takes: settings, a policy, the sandbox and the tasks' scoring
SEARCHING = {
    "codeq.config",
    "codeq.policy",
    "codeq.progress",
    "codeq.sandbox",
    "codeq.schemas",
    "codeq.tasks",
}
# part -> the other parts it may import. A part is codeq's top-level module or package.
ALLOWED: dict[str, set[str]] = {
    "codeq.errors": set(),
    "codeq.progress": set(),
    "codeq.cpus": set(),
    "codeq.locations": set(),
    "codeq.config_layers": FOUNDATION,
    "codeq.config": FOUNDATION | {"codeq.config_layers"},
    "codeq.schemas": FOUNDATION,
    "codeq.logs": FOUNDATION,
    "codeq.shards": FOUNDATION,
    "codeq.sandbox": FOUNDATION | {"codeq.config", "codeq.cpus"},
    "codeq.store": FOUNDATION | {"codeq.config", "codeq.logs"},
    "codeq.policy": FOUNDATION
    | {"codeq.config", "codeq.cpus", "codeq.locations", "codeq.logs", "codeq.schemas"},
    "codeq.tasks": FOUNDATION
    | {"codeq.config", "codeq.locations", "codeq.sandbox", "codeq.schemas"},
    "codeq.report": FOUNDATION | {"codeq.schemas"},
    "codeq.pairs": FOUNDATION | {"codeq.config", "codeq.policy", "codeq.schemas"},
    "codeq.train": FOUNDATION
    | {"codeq.config", "codeq.logs", "codeq.policy", "codeq.progress", "codeq.schemas"}
    | {"codeq.store"},
    "codeq.search": FOUNDATION | SEARCHING | {"codeq.shards", "codeq.train"},
    "codeq.evaluate": FOUNDATION | SEARCHING | {"codeq.search", "codeq.shards"},
    "codeq.promotion": FOUNDATION | {"codeq.config", "codeq.evaluate", "codeq.schemas"},
    "codeq.verifier": FOUNDATION
    | {"codeq.config", "codeq.policy", "codeq.schemas", "codeq.tasks", "codeq.train"},
}
LIBRARY = set(ALLOWED)
# the round against a store, then the two entry points over it
ALLOWED["codeq.pipeline"] = LIBRARY | {"codeq.pairs"}
ALLOWED["codeq.commands"] = LIBRARY | {"codeq.pipeline"}
ALLOWED["codeq.cli"] = {
    "codeq",
    "codeq.commands",
    "codeq.config_layers",
    "codeq.errors",
    "codeq.logs",
}
ALLOWED["codeq.__main__"] = {"codeq.cli"}
ALLOWED["codeq"] = set()
ALLOWED["jobs"] = {
    "codeq.config",
    "codeq.errors",
    "codeq.logs",
    "codeq.pipeline",
    "codeq.shards",
    "codeq.store",
}
NEVER = ("jobs", "tests", "bench")  # codeq imports none of these


def part_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in NEVER:
        return parts[0]
    if parts[0] != "codeq":
        return None
    return "codeq" if len(parts) == 1 else f"codeq.{parts[1]}"


def imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_each_part_imports_only_what_the_architecture_allows():
    broken = []
    for path in sorted([*(ROOT / "codeq").rglob("*.py"), *(ROOT / "jobs").rglob("*.py")]):
        source = part_of(module_name(path))
        assert source in ALLOWED, f"{path}: a new part; add it to ALLOWED and the docs"
        for module in imported_modules(path):
            target = part_of(module)
            if target is None or target == source:
                continue
            if target not in ALLOWED[source]:
                broken.append(f"{path.relative_to(ROOT)} imports {module} ({source} -> {target})")
    assert not broken, "\n".join(broken)


def test_the_sandbox_server_is_standard_library_only():
    """The server package runs inside the jail, where codeq is not installed: its modules import
    the standard library and one another (relative imports), nothing else."""
    modules = sorted((ROOT / "codeq" / "sandbox" / "server").glob("*.py"))
    assert len(modules) > 3
    outside = []
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            sibling = isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            if (
                isinstance(node, ast.ImportFrom)
                and node.level
                and not (sibling and (path.parent / f"{node.module}.py").is_file())
            ):
                outside.append(f"{path.name}: from {'.' * node.level}{node.module}")
        for module in imported_modules(path):
            if module.split(".")[0] not in sys.stdlib_module_names:
                outside.append(f"{path.name}: {module}")
    assert not outside, outside


def test_the_server_bundle_runs_alone(tmp_path):
    """The one file the worker runs in the jail holds every server module and needs nothing but
    the standard library (a bare interpreter imports all of it, and codeq stays unimported)."""
    from codeq.sandbox.bundle import PACKAGE_IN_ZIP, write_server_bundle

    bundle = write_server_bundle(tmp_path)
    names = [path.stem for path in (ROOT / "codeq" / "sandbox" / "server").glob("*.py")]
    check = (
        f"import sys; sys.path.insert(0, {str(bundle)!r})\n"
        + "".join(f"import {PACKAGE_IN_ZIP}.{name}\n" for name in names if name != "__init__")
        + f"from {PACKAGE_IN_ZIP}.serve import main\n"
        + "assert not [m for m in sys.modules if m.split('.')[0] == 'codeq'], sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-I", "-B", "-c", check],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # and run as a program, it reaches the server's own argument handling
    started = subprocess.run(
        [sys.executable, "-S", "-I", "-B", str(bundle)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert started.returncode != 0 and "IndexError" in started.stderr, started.stderr


def pipeline_graph(folder: Path = ROOT / "codeq" / "pipeline") -> dict[str, set[str]]:
    """codeq.pipeline module -> the codeq.pipeline modules it imports, by any import statement:
    at the top, under TYPE_CHECKING or inside a function (`from codeq.pipeline import stages`
    names the module it imports)."""
    modules = {
        f"codeq.pipeline.{path.stem}": path
        for path in folder.glob("*.py")
        if path.stem != "__init__"
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set(imported_modules(path))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {module for module in found if module in modules and module != name}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in `graph` (its modules in order, the first repeated at the end),
    or None: a depth-first search for an edge back to a module on the current path."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            circle = visit(target, [*path, module])
            if circle:
                return circle
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return None


def test_the_pipeline_modules_import_one_another_without_a_circle():
    """Inside codeq/pipeline the modules are layered (docs/architecture.md): context below
    policies, the stage modules (stages, verifier) above both, local_round on top. A circle,
    even one only a type annotation or a function-level import closes, means some piece sits
    in the wrong module."""
    graph = pipeline_graph()
    assert {"codeq.pipeline.stages", "codeq.pipeline.policies"} <= set(graph)
    assert import_circle(graph) is None, " -> ".join(import_circle(graph) or [])


def test_the_circle_check_can_fail(tmp_path):
    """A type-only import back up (the shape policies <-> stages had) is a circle."""
    (tmp_path / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from codeq.pipeline.high import Context\n"
    )
    (tmp_path / "high.py").write_text("from codeq.pipeline import low\n")
    (tmp_path / "top.py").write_text("def f():\n    from codeq.pipeline.high import g\n")
    graph = pipeline_graph(tmp_path)
    assert graph["codeq.pipeline.top"] == {"codeq.pipeline.high"}
    assert import_circle(graph) == [
        "codeq.pipeline.high",
        "codeq.pipeline.low",
        "codeq.pipeline.high",
    ]
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_rule_catches_a_forbidden_import(tmp_path):
    """The check itself can fail: policy importing search is caught."""
    assert part_of("codeq.search.mcts") not in ALLOWED["codeq.policy"]
    assert part_of("jobs._runner") not in ALLOWED["codeq.pipeline"]
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from codeq.search import run_search\n")
    assert imported_modules(sample) == ["codeq.search"]
