"""No import cycles among our modules, by a static scan.

Every ``import`` and ``from ... import`` counts, at the top of a module, inside a function
(an import moved into a function to dodge a cycle still runs, later, and hides the cycle
rather than removing it) or under ``if TYPE_CHECKING:`` (an import kept for the type
checker alone still ties the two modules together: neither can be read without the other).
A cycle is reported as the modules of one strongly connected component of the graph.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator

# The layering test's module table and relative-import rule: one scan of our modules.
from tests.test_layering import _absolute
from tests.test_layering import all_modules as modules


def _import_nodes(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _import_nodes(ast.iter_child_nodes(node))


@functools.cache
def edges(module: str) -> frozenset[str]:
    """The modules of ours that ``module`` imports when it runs."""
    path = modules()[module]
    found: set[str] = set()
    for node in _import_nodes([ast.parse(path.read_text(), str(path))]):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:
            base = _absolute(module, path, node)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return frozenset(name for name in found if name in modules() and name != module)


def cycles(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_scan_finds_a_cycle_and_sees_imports_of_every_kind() -> None:
    # A check that cannot fail is no check.
    assert cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
                   "d": frozenset({"a"})}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []
    assert "cdi.schema" in edges("cdi.cli")  # an import inside a function
    assert "nri_plugin.nri.api.nri_pb2" in edges("nri_plugin.nri.api")  # from pkg import mod
    assert "nri_plugin.nri.stub" in edges("nri_plugin.nri")  # TYPE_CHECKING counts too


def test_no_import_cycle_among_our_modules() -> None:
    graph = {module: edges(module) for module in modules()}
    found = sorted(sorted(c) for c in cycles(graph))
    assert found == []


def reachable(module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in edges(todo.pop()) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_the_plugin_daemon_never_imports_the_doctor() -> None:
    # The daemon reads containerd's config.toml at start-up through ops/containerd_config,
    # not through the doctor (which pulls in urllib, subprocess, the e2e checks).
    assert "nri_plugin.ops.runtime_cdi" in reachable("nri_plugin.ops.daemon")
    assert "nri_plugin.ops.doctor" not in reachable("nri_plugin.ops.daemon")
