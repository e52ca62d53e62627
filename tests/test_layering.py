"""Import directions between the layers (docs/developer/architecture.md), by a static scan.

Every ``import`` and ``from ... import`` of every module counts, wherever it stands (at the
top, in a function, under ``TYPE_CHECKING``), and so does a string constant that names one
of our modules (``importlib.import_module`` tables such as ``nri_plugin.__init__``'s lazy
exports). A second check imports the pure modules in a fresh interpreter and looks at what
came in with them.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_MODULE_NAME = re.compile(r"(cdi|nri_plugin|nri_cdi_testbed)(\.[A-Za-z_]\w*)*")

# The NRI plugin runtime: what any plugin author uses, ours or not.
RUNTIME = ("nri_plugin.nri",)
# The protocol core: sans-IO, no event loop and no sockets (docs/developer/architecture.md).
PROTOCOL_CORE = ("nri_plugin.nri.wire", "nri_plugin.nri.dispatch")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def all_modules() -> dict[str, Path]:
    files = [*ROOT.glob("cdi/**/*.py"), *ROOT.glob("nri_plugin/**/*.py"),
             *ROOT.glob("nri_cdi_testbed/**/*.py")]
    return {module_name(p): p for p in files}


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def imports_of(module: str) -> frozenset[str]:
    """Every module ``module`` imports, by statement or by name in a string constant."""
    path = all_modules()[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            found.add(base)
            # ``from pkg import mod`` imports the submodule when there is one.
            found.update(f"{base}.{a.name}" for a in node.names
                         if f"{base}.{a.name}" in all_modules())
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value in all_modules() and _MODULE_NAME.fullmatch(node.value)):
            found.add(node.value)
    return frozenset(found)


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(importers: Iterable[str], forbidden: Iterable[str],
               allowed: Iterable[str] = (), *, exempt: Iterable[str] = ()) -> list[str]:
    """``module imports name`` for each module under ``importers`` (but not under
    ``exempt``) that imports something under ``forbidden`` (but not under ``allowed``)."""
    forbidden, allowed, exempt = tuple(forbidden), tuple(allowed), tuple(exempt)
    return sorted(f"{module} imports {name}"
                  for module in all_modules()
                  if within(module, importers) and not within(module, exempt)
                  for name in imports_of(module)
                  if within(name, forbidden) and not within(name, allowed))


def test_the_scan_sees_imports_of_every_kind() -> None:
    # A check that cannot fail is no check: the scan must see what the rules forbid.
    assert "nri_plugin.nri.api" in imports_of("nri_plugin.nri.wire._ttrpc")  # at the top
    assert "nri_plugin.nri.stub" in imports_of("nri_plugin.nri")  # a lazy export, by string
    assert "cdi.schema" in imports_of("cdi.cli")  # an import inside a function
    assert "nri_plugin.ops.metrics" in imports_of("nri_plugin.ops.daemon")
    assert "nri_plugin.nri.api.nri_pb2" in imports_of("nri_plugin.nri.api")  # from pkg import mod
    assert violations(["nri_plugin.ops"], ["cdi"])  # ops uses the library: found
    assert violations(["cdi"], ["cdi.nvidia"])  # found too, until the generator is exempt


def test_cdi_never_imports_nri_plugin() -> None:
    assert violations(["cdi"], ["nri_plugin"]) == []


def test_the_product_never_imports_the_test_bed() -> None:
    # The simulated node and the e2e machinery are tools: the CDI library and the plugin
    # never need them; only the doctor's --e2e runs them, importing them when asked.
    assert violations(["cdi", "nri_plugin"], ["nri_cdi_testbed"],
                      exempt=["nri_plugin.ops.doctor"]) == []
    assert violations(["nri_cdi_testbed"], ["cdi"])  # the control: the bed uses the library


def test_only_the_nvidia_generator_imports_nvidia_modules_within_cdi() -> None:
    # The library, the hooks and the Linux formats are vendor-neutral.
    assert violations(["cdi"], ["cdi.nvidia"], exempt=["cdi.nvidia"]) == []


# NVIDIA's paths, variables and kinds (nvidia.com/gpu, NVIDIA_VISIBLE_DEVICES,
# /proc/driver/nvidia, libcuda.so, CUDA_VERSION). Comments and docstrings count too: a
# neutral file that explains itself by NVIDIA's case is one that knows about it, and the
# next edit turns the comment into code. Examples use vendor.com / example.com.
NVIDIA_SPECIFIC = re.compile(r"nvidia|cuda|/proc/driver", re.IGNORECASE)


def nvidia_mentions(paths: Iterable[Path]) -> list[str]:
    """``file:line: text`` for each line that names an NVIDIA specific."""
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in paths
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if NVIDIA_SPECIFIC.search(line)]


def neutral_nri_plugin_files() -> list[Path]:
    """Every file of nri_plugin but the vendors' rules and operations (which wire them)."""
    vendor_parts = ("vendors", "ops")
    return sorted(p for p in (ROOT / "nri_plugin").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".so")
                  and p.relative_to(ROOT / "nri_plugin").parts[0] not in vendor_parts)


def test_the_neutral_cdi_library_names_no_nvidia_specific() -> None:
    # cdi/ outside cdi/nvidia/ (the library, the neutral hooks, the Linux formats) is
    # vendor-neutral in its text too: a vendor's specifics reach it as arguments or tables.
    assert nvidia_mentions(sorted((ROOT / "cdi/nvidia").rglob("*.py")))  # the control
    neutral = [p for p in sorted((ROOT / "cdi").rglob("*.py"))
               if p.relative_to(ROOT / "cdi").parts[0] != "nvidia"]
    assert nvidia_mentions(neutral) == []


def test_no_import_cycle_in_cdi() -> None:
    graph = {m: {i for i in imports_of(m) if i in all_modules() and i != m}
             for m in all_modules() if within(m, ["cdi"])}
    cycles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a]
                    if a < b and a in graph.get(b, set())
                    and not (b.startswith(a + ".") or a.startswith(b + ".")))
    assert cycles == []


def test_cdi_linux_imports_neither_the_generator_nor_the_hooks() -> None:
    assert violations(["cdi.linux"], ["cdi.nvidia", "cdi.hooks"]) == []


def test_wire_imports_nothing_of_ours_but_the_messages() -> None:
    assert violations(["nri_plugin.nri.wire"], ["cdi", "nri_plugin"],
                      allowed=["nri_plugin.nri.wire", "nri_plugin.nri.api"]) == []


def test_the_runtime_never_imports_plugins_vendors_operations_or_cdi() -> None:
    forbidden = ["nri_plugin.plugins", "nri_plugin.vendors", "nri_plugin.ops", "cdi"]
    # but cdi.runtimes: the one table of the CDI library each runtime links (pure data)
    assert violations(RUNTIME, forbidden, allowed=["cdi.runtimes"]) == []
    assert violations(["cdi.runtimes"], ["cdi", "nri_plugin"],
                      allowed=["cdi.runtimes"]) == []  # which imports nothing of ours


def test_the_protocol_core_imports_no_event_loop_or_socket() -> None:
    assert violations(PROTOCOL_CORE, ["asyncio", "socket", "selectors"]) == []
    # wire is sans-IO through and through: not even os.
    assert violations(["nri_plugin.nri.wire"], ["os"]) == []


def test_plugins_never_import_vendor_rules() -> None:
    # The injector is vendor-neutral: NVIDIA semantics reach it through an interface
    # (plugins/cdi_injector/vendor.py), wired by the daemon.
    assert violations(["nri_plugin.plugins"], ["nri_plugin.vendors", "cdi.nvidia"]) == []


def test_plugins_never_import_operations() -> None:
    # Metrics reach the injector as an object with a small protocol (``Wiring.metrics``).
    assert violations(["nri_plugin.plugins"], ["nri_plugin.ops"]) == []


def test_plugins_run_no_event_loop_of_their_own() -> None:
    # A plugin is handlers the runtime layer calls; event loops, timers and connections are
    # the runtime's (a second connection: nri_plugin/nri/second_connection.py).
    assert violations(["nri_plugin.plugins"], ["asyncio"]) == []
    assert violations(["nri_plugin.nri.second_connection"], ["asyncio"])  # the control


def test_the_nvidia_scan_sees_what_it_forbids() -> None:
    assert nvidia_mentions([ROOT / "nri_plugin/vendors/nvidia/sources.py"])
    assert ROOT / "nri_plugin/plugins/cdi_injector/injector.py" in neutral_nri_plugin_files()


def test_nri_plugin_names_no_nvidia_specific_outside_vendors_and_ops() -> None:
    # NVIDIA reaches the injector only through the VendorRules interface (its request
    # sources, default denials and verdict come from nri_plugin/vendors/nvidia).
    assert nvidia_mentions(neutral_nri_plugin_files()) == []


@pytest.mark.parametrize(
    "module",
    ["nri_plugin.nri.wire", "nri_plugin.nri.dispatch", "nri_plugin.nri.api", "nri_plugin.nri",
     "nri_plugin"],
)
def test_pure_modules_import_no_io_machinery(module: str) -> None:
    # Also what they pull in indirectly (the standard library, protobuf).
    code = (
        f"import sys, json, {module}; "
        f"print(json.dumps([m for m in ('asyncio', 'socket') if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


# --- private names stay in their module (or, for a private module, in its package) ----------


def _private_part(dotted: str) -> int | None:
    """Index of the first private component of a dotted name (``_x``, not ``__x__``)."""
    for i, part in enumerate(dotted.split(".")):
        if part.startswith("_") and not part.startswith("__"):
            return i
    return None


def private_uses(module: str, source: str, path: Path | None = None) -> list[str]:
    """``module uses name`` for each private name ``module`` takes from another of our
    modules: ``from a.b import _x``, ``a.b._x`` through an imported module, and a private
    module (``a._b``) imported from outside the package that holds it."""
    is_package = path is not None and path.name == "__init__.py"
    found: set[str] = set()
    bound: dict[str, str] = {}  # local name -> our module it is bound to

    def check(name: str) -> None:
        index = _private_part(name)
        if index is None:
            return
        parts = name.split(".")
        if not within(module, [".".join(parts[:index])] if index else []):
            found.add(f"{module} uses {'.'.join(parts[: index + 1])}")

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _MODULE_NAME.fullmatch(alias.name):
                    check(alias.name)
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, node.module] if node.module else package)
            if _MODULE_NAME.fullmatch(base):
                for alias in node.names:
                    check(f"{base}.{alias.name}")
                    if f"{base}.{alias.name}" in all_modules():
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private_part(node.attr) == 0:
            chain = []
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                check(".".join([bound[value.id], *reversed(chain), node.attr]))
    return sorted(found)


# dispatch.py is being rewritten by the lead; it still takes bound_message from the wire
# package's private module (nri_plugin.nri.wire exports it now).
PENDING_PRIVATE_USES: set[str] = set()


def test_the_private_name_scan_sees_what_it_forbids() -> None:
    planted = ("from nri_plugin.ops.refresh import _run\n"
               "import nri_plugin.ops.refresh as refresh\n"
               "from nri_plugin.nri.wire._mux import frame_message\n"
               "refresh._later()\n")
    assert private_uses("nri_plugin.ops.doctor", planted) == [
        "nri_plugin.ops.doctor uses nri_plugin.nri.wire._mux",
        "nri_plugin.ops.doctor uses nri_plugin.ops.refresh._later",
        "nri_plugin.ops.doctor uses nri_plugin.ops.refresh._run"]
    inside = "from nri_plugin.nri.wire._mux import frame_message\nself._x = 1\n"
    assert private_uses("nri_plugin.nri.wire._connection", inside) == []


def test_no_private_name_is_used_across_modules() -> None:
    found = {use for module, path in all_modules().items()
             for use in private_uses(module, path.read_text(), path)}
    assert sorted(found - PENDING_PRIVATE_USES) == []
