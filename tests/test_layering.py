"""The layering rule: jido modules import downward or along listed seams, never in a cycle (docs/architecture.md)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jido"

# Package (or single module) -> layer. Every module must fall under an entry: its longest matching prefix.
# The dotless entry is the package root and names jido/__init__.py alone, never its submodules.
LAYERS: dict[str, int] = {
    "jido.config": 0, "jido.utils": 0, "jido.metrics": 0,
    "jido.core": 1, "jido.planner": 1,
    "jido.models": 2, "jido.layers": 2, "jido.attention": 2, "jido.sampling": 2, "jido.parallel": 2,
    "jido.runner": 3, "jido.offload": 3, "jido.kvtransfer": 3,
    "jido.executor": 4, "jido.engine": 4,
    "jido.server": 5, "jido.router": 5, "jido.bench": 5, "jido.tools": 5, "jido.cli": 5,
    "jido": 5,
}
# Imports between two different entries of the same layer that are seams of the design, as
# (importer, imported). Anything else at the same layer is a violation.
ALLOWED_SAME_LAYER: set[tuple[str, str]] = {
    ("jido.models", "jido.layers"),  # model families are built from the shared layers
    ("jido.models", "jido.attention"),  # and call the attention backend interface
    ("jido.models", "jido.parallel"),  # a family reads its pipeline stage's layers and its TP group
    ("jido.layers", "jido.parallel"),  # tensor-parallel layers run their collectives
    ("jido.engine", "jido.executor"),  # the engine core drives the executor seam
    ("jido.runner", "jido.kvtransfer"),  # the model runner calls its KV connector's worker side
    ("jido.kvtransfer", "jido.offload"),  # the offload connector keeps blocks in the offload stores
    ("jido.cli", "jido.server"),  # the `jido` command: serve,
    ("jido.cli", "jido.bench"),  # bench,
    ("jido.cli", "jido.router"),  # router
    ("jido.cli", "jido.tools"),  # roofline, ablate (delegates named by "module:function" strings)
    ("jido.tools", "jido.bench"),  # ablate drives servers through the load generator, over HTTP only
}
# Packages that must stay free of heavy or transport dependencies whatever their layer allows.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "jido.core": ("torch", "fastapi", "uvicorn", "aiohttp", "httpx", "zmq", "redis", "requests"),
    "jido.planner": ("torch",),
    "jido.bench": ("torch", "jido.engine", "jido.core", "jido.models", "jido.runner", "jido.executor"),
    # ablate starts `jido serve` processes and measures them from outside, as a user would.
    "jido.tools.ablate": ("torch", "jido.engine", "jido.core", "jido.models", "jido.runner", "jido.executor",
                          "jido.server"),
    # HTTP only: the router talks to instances, never runs an engine (KV formats: jido.kvtransfer.handoff)
    "jido.router": ("torch", "zmq", "jido.engine", "jido.core", "jido.models", "jido.runner", "jido.executor",
                    "jido.server", "jido.kvtransfer.disagg_worker", "jido.kvtransfer.endpoint"),
}


@dataclass(frozen=True)
class Edge:
    """One import found in a module's source: a statement, an import_module call or a registry string."""

    importer: str
    imported: str  # absolute dotted name: a jido module, or an outside package such as "torch.nn"
    where: str  # "jido/core/scheduler.py:12"
    eager: bool  # runs when the importer is imported (module-level statement, not a function or a string)


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file for every .py file under the package root (a package is its __init__)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


class _ImportFinder(ast.NodeVisitor):
    """Collects the imports of one module, relative ones resolved against its package."""

    def __init__(self, module: str, path: Path, root: Path, modules: dict[str, Path]) -> None:
        self.module, self.modules, self.root_name = module, modules, root.name
        self.file = path.relative_to(root.parent).as_posix()
        self.package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.function_depth = 0
        self.edges: list[Edge] = []

    def _add(self, name: str, node: ast.AST, eager: bool) -> None:
        self.edges.append(Edge(self.module, name, f"{self.file}:{node.lineno}", eager))

    def _in_function(self, node: ast.AST) -> None:
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node, self.function_depth == 0)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.package.split(".")
            anchor = ".".join(package[:len(package) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            # `from jido import config` imports the module jido.config, not the package root.
            name = f"{base}.{alias.name}"
            self._add(name if name in self.modules else base, node, self.function_depth == 0)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            name = node.args[0].value
            if isinstance(name, str) and not name.startswith("."):
                self._add(name, node, self.function_depth == 0)
                for child in (node.func, *node.args[1:], *node.keywords):
                    self.visit(child)  # not the name itself: it would count again as a registry string
                return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        # Lazy registries name modules in strings, "jido.models.llama" or "jido.planner.cli:plan_main".
        # A bare "jido" is a logger, metric or program name far more often than the package root.
        if isinstance(node.value, str):
            name = node.value.split(":")[0] if node.value.count(":") == 1 else node.value
            if name in self.modules and name != self.root_name:
                self._add(name, node, False)


def imports_of(root: Path) -> list[Edge]:
    """Every import of every module under the package root, each (importer, imported, line) once."""
    modules = module_files(root)
    edges: dict[Edge, None] = {}
    for module, path in modules.items():
        finder = _ImportFinder(module, path, root, modules)
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges.update(dict.fromkeys(finder.edges))
    return list(edges)


def entry_of(module: str, layers: dict[str, int] = LAYERS) -> str | None:
    """The LAYERS entry a module belongs to: the longest prefix; the root entry matches the root only."""
    matches = [e for e in layers if module == e or ("." in e and _matches(module, e))]
    return max(matches, key=len, default=None)


def unlisted_packages(root: Path, layers: dict[str, int] = LAYERS) -> list[str]:
    """Top-level packages and modules under the root that no LAYERS entry covers."""
    names = {".".join(m.split(".")[:2]) for m in module_files(root) if entry_of(m, layers) is None}
    return sorted(names)


def layering_violations(root: Path, layers: dict[str, int] = LAYERS,
                        allowed: set[tuple[str, str]] = ALLOWED_SAME_LAYER) -> list[str]:
    """Imports of the package root, of unlisted modules, upward, or sideways outside `allowed`."""
    violations = []
    for edge in imports_of(root):
        source, target = entry_of(edge.importer, layers), entry_of(edge.imported, layers)
        if not _matches(edge.imported, root.name) or source is None:
            continue  # outside packages are FORBIDDEN's business; unlisted importers are reported alone
        head = f"{edge.where}: {edge.importer} (L{layers[source]}) imports {edge.imported}"
        if edge.imported == root.name:
            violations.append(f"{head}: the package root; import the submodule that defines the name")
        elif target is None:
            violations.append(f"{head}: in no layer")
        elif layers[target] > layers[source]:
            violations.append(f"{head} (L{layers[target]}): upward")
        elif layers[target] == layers[source] and source != target and (source, target) not in allowed:
            violations.append(f"{head} (L{layers[target]}): sideways, ({source!r}, {target!r}) "
                              "is not in ALLOWED_SAME_LAYER")
    return violations


def forbidden_imports(root: Path, forbidden: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[str]:
    return [f"{edge.where}: {edge.importer} imports {edge.imported}, forbidden in {package}"
            for edge in imports_of(root) for package, banned in forbidden.items()
            if _matches(edge.importer, package) and any(_matches(edge.imported, ban) for ban in banned)]


def import_cycles(root: Path) -> list[str]:
    """Cycles of module-level imports between modules, each given once as its shortest loop through its
    smallest member. Imports inside functions and registry strings run later, so they close no cycle."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for edge in imports_of(root):
        if edge.eager and edge.imported in modules and edge.imported != edge.importer:
            graph.setdefault(edge.importer, set()).add(edge.imported)
    cycles = []
    for start in sorted(graph):
        loop = _shortest_loop(graph, start)
        if loop and min(loop) == start:
            cycles.append(" -> ".join([*loop, start]))
    return cycles


def _shortest_loop(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The modules on the shortest path from `start` back to itself, breadth first; None if there is none."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    return None


# --- the real package ---

def test_every_module_is_in_a_layer():
    assert unlisted_packages(PACKAGE) == [], "add these to LAYERS and docs/architecture.md"


def test_every_import_points_down_or_along_an_allowed_seam():
    assert layering_violations(PACKAGE) == []


def test_core_planner_and_bench_avoid_forbidden_dependencies():
    assert forbidden_imports(PACKAGE) == []


def test_no_import_cycles():
    assert import_cycles(PACKAGE) == []


def test_every_allowed_seam_joins_two_entries_of_one_layer_and_is_used():
    for source, target in ALLOWED_SAME_LAYER:
        assert source != target and LAYERS[source] == LAYERS[target], (source, target)
    used = {(entry_of(e.importer), entry_of(e.imported)) for e in imports_of(PACKAGE)}
    assert ALLOWED_SAME_LAYER - used == set(), "drop seams the code no longer uses"


# --- the checker, on small fake trees ---

def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A fake `jido` package: the given files (paths under jido/), every folder with an __init__.py."""
    root = tmp_path / "jido"
    for relative, text in {"__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        for folder in path.relative_to(root).parents:
            init = root / folder / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
    return root


def test_upward_import_is_reported(tmp_path):
    root = make_tree(tmp_path, {"core/probe.py": "from jido.engine.llm import LLM\n", "engine/llm.py": ""})
    assert layering_violations(root) == [
        "jido/core/probe.py:1: jido.core.probe (L1) imports jido.engine.llm (L4): upward"]


@pytest.mark.parametrize("path, statement, imported", [
    ("core/probe.py", "from ..engine.llm import LLM", "jido.engine.llm"),
    ("core/probe.py", "from ..engine import llm", "jido.engine.llm"),
    ("core/probe.py", "from .. import engine", "jido.engine"),
    ("core/probe/__init__.py", "from ...engine import llm", "jido.engine.llm"),
])
def test_upward_relative_import_is_resolved_and_reported(tmp_path, path, statement, imported):
    root = make_tree(tmp_path, {path: statement + "\n", "engine/llm.py": ""})
    importer = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert layering_violations(root) == [
        f"jido/{path}:1: jido.{importer} (L1) imports {imported} (L4): upward"]


@pytest.mark.parametrize("source", [
    'import importlib\n\nimportlib.import_module("jido.runner.model_runner")\n',
    'from importlib import import_module\n\ndef load():\n    return import_module("jido.runner.model_runner")\n',
    '_BACKENDS = {\n    "fast": ("jido.runner.model_runner", "FastBackend"),\n}\n',
])
def test_module_named_in_a_string_is_an_import(tmp_path, source):
    root = make_tree(tmp_path, {"attention/registry.py": source, "runner/model_runner.py": ""})
    line = source[:source.index('"jido.')].count("\n") + 1
    assert layering_violations(root) == [f"jido/attention/registry.py:{line}: jido.attention.registry (L2) "
                                         "imports jido.runner.model_runner (L3): upward"]


def test_unlisted_package_is_reported(tmp_path):
    root = make_tree(tmp_path, {"core/request.py": "", "gadgets/widget.py": "", "misc.py": ""})
    assert unlisted_packages(root) == ["jido.gadgets", "jido.misc"]


def test_disallowed_same_layer_edge_is_reported(tmp_path):
    root = make_tree(tmp_path, {"executor/uniproc.py": "from jido.engine import engine_core\n",
                                "engine/engine_core.py": "from jido.executor.uniproc import Executor\n",
                                "attention/backend.py": "import jido.models.config\n", "models/config.py": ""})
    assert layering_violations(root) == [
        "jido/attention/backend.py:1: jido.attention.backend (L2) imports jido.models.config (L2): sideways, "
        "('jido.attention', 'jido.models') is not in ALLOWED_SAME_LAYER",
        "jido/executor/uniproc.py:1: jido.executor.uniproc (L4) imports jido.engine.engine_core (L4): sideways, "
        "('jido.executor', 'jido.engine') is not in ALLOWED_SAME_LAYER"]


def test_imports_within_one_package_and_downward_pass(tmp_path):
    root = make_tree(tmp_path, {"core/scheduler.py": "from jido.core.request import Request\nfrom . import outputs\n",
                                "core/request.py": "from jido import config\n", "core/outputs.py": "",
                                "config.py": ""})
    edges = {(e.importer, e.imported) for e in imports_of(root)}
    assert edges == {("jido.core.scheduler", "jido.core.request"), ("jido.core.scheduler", "jido.core.outputs"),
                     ("jido.core.request", "jido.config")}
    assert layering_violations(root) == [] and import_cycles(root) == []


def test_importing_the_package_root_is_reported(tmp_path):
    root = make_tree(tmp_path, {"server/app.py": "from jido import LLM\n", "tools/probe.py": "import jido\n"})
    assert layering_violations(root) == [
        "jido/server/app.py:1: jido.server.app (L5) imports jido: the package root; import the submodule "
        "that defines the name",
        "jido/tools/probe.py:1: jido.tools.probe (L5) imports jido: the package root; import the submodule "
        "that defines the name"]


def test_module_level_cycle_is_reported_and_a_lazy_import_back_is_not(tmp_path):
    root = make_tree(tmp_path, {
        "core/a.py": "from jido.core import b\n", "core/b.py": "import jido.core.c\n",
        "core/c.py": "from .a import thing\n",
        "engine/x.py": "from jido.engine.y import f\n", "engine/y.py": "def f():\n    from jido.engine import x\n"})
    assert import_cycles(root) == ["jido.core.a -> jido.core.b -> jido.core.c -> jido.core.a"]


def test_core_importing_torch_is_forbidden(tmp_path):
    root = make_tree(tmp_path, {"core/request.py": "import torch.nn\n", "planner/roofline.py": "from torch import nn\n",
                                "bench/client.py": "from jido.engine.llm import LLM\n", "engine/llm.py": ""})
    assert forbidden_imports(root) == [
        "jido/bench/client.py:1: jido.bench.client imports jido.engine.llm, forbidden in jido.bench",
        "jido/core/request.py:1: jido.core.request imports torch.nn, forbidden in jido.core",
        "jido/planner/roofline.py:1: jido.planner.roofline imports torch, forbidden in jido.planner"]
