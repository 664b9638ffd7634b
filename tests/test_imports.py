"""The layering rules, read from the source with `ast`: nothing under jaxplan/ outside jaxplan/cli
imports the CLI, and the CLI's modules import each other without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxplan"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports too); `from a import b`
    counts as a.b as well as a, since b may be a submodule."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_parser_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from jaxplan.cli.common import out\n    import jaxplan.cli\n")
    assert {"jaxplan.cli.common", "jaxplan.cli.common.out", "jaxplan.cli"} <= imported(source)


def test_nothing_below_the_cli_imports_it():
    offenders = [
        f"{module_name(path)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py")) if "cli" not in path.relative_to(PACKAGE).parts[:1]
        for name in sorted(imported(path)) if name == "jaxplan.cli" or name.startswith("jaxplan.cli.")
    ]
    assert not offenders, offenders


def cli_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in (PACKAGE / "cli").glob("*.py")}
    return {name: {m for m in imported(path) if m in modules and m != name and m != "jaxplan.cli"} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a path [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_cli_modules_import_each_other_without_a_cycle():
    graph = cli_graph()
    assert "jaxplan.cli.common" in graph and graph["jaxplan.cli.report"]  # the graph is read, not empty
    assert find_cycle(graph) is None, find_cycle(graph)
