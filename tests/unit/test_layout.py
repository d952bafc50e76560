"""The layout is a rule, not a picture: imports point down the layers and no module imports itself back.

Layers, bottom to top (a module may import its own layer's wing or anything below):
  0 flagperf (root: errors, paths, the package)     1 results, monitoring      2 config, site (the results site)
  3 measure, hosts                                  4 families: basespec, inference, training, generate, operation
  5 entry                                           6 tasks                    7 flows
Every import counts: module level, inside functions, and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flagperf", "tasks", "flows")
FAMILIES = ("basespec", "inference", "training", "generate", "operation")
RANKS = {"flagperf": 0, "flagperf.errors": 0, "flagperf.paths": 0, "flagperf.results": 1, "flagperf.monitoring": 1,
         "flagperf.config": 2, "flagperf.site": 2,
         "flagperf.measure": 3, "flagperf.hosts": 3, "flagperf.entry": 5, "tasks": 6, "flows": 7,
         **{f"flagperf.{family}": 4 for family in FAMILIES}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def wing(module: str) -> str:
    """The longest key of RANKS that the module lies in."""
    candidates = [key for key in RANKS if module == key or module.startswith(key + ".")]
    assert candidates, f"{module} lies in no layer: add its wing to RANKS"
    return max(candidates, key=len)


def imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {name for name in found if name.split(".")[0] in PACKAGES}


def project_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {mod: {target for target in imports(path, mod) if target in files and target != mod}
            for mod, path in files.items()}


def test_every_import_points_down_or_stays_in_its_wing() -> None:
    upward = []
    for module, targets in project_graph().items():
        for target in targets:
            source_wing, target_wing = wing(module), wing(target)
            same_layer = RANKS[source_wing] == RANKS[target_wing]
            if RANKS[target_wing] > RANKS[source_wing] or (same_layer and source_wing != target_wing
                                                             and RANKS[source_wing] not in (4, 6, 7)):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that point up or across a layer:\n" + "\n".join(sorted(upward))


def test_no_import_loops() -> None:
    graph = project_graph()
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                loops.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in loops)


def test_the_rule_sees_a_loop_and_an_upward_import(tmp_path: Path) -> None:
    """The checks above can fail: a planted upward import is found by the same parser."""
    planted = tmp_path / "flagperf" / "results" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from flagperf.hosts.local import Host\nfrom . import schema\n", encoding="utf-8")
    found = imports(planted, "flagperf.results.planted")
    assert "flagperf.hosts.local" in found and "flagperf.results.schema" in found
    assert RANKS[wing("flagperf.hosts.local")] > RANKS[wing("flagperf.results.planted")]
