"""The layering rule: a module imports only from its own layer or below (docs/architecture.md)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jido"

# First matching prefix wins; the longest prefixes come first.
LAYERS = [
    ("jido.metrics.stats", 0), ("jido.config", 0), ("jido.utils", 0),
    ("jido.core", 1), ("jido.planner", 1),
    ("jido.models", 2), ("jido.layers", 2), ("jido.attention", 2), ("jido.sampling", 2), ("jido.parallel", 2),
    ("jido.runner", 3), ("jido.offload", 3), ("jido.kvtransfer", 3),
    ("jido.executor", 4), ("jido.engine", 4),
    ("jido.server", 5), ("jido.bench", 5), ("jido.cli", 5), ("jido", 5),
]
# Packages that must stay free of heavy or transport dependencies whatever their layer allows.
FORBIDDEN = {
    "jido.core": ("torch", "fastapi", "uvicorn", "aiohttp", "httpx", "zmq", "redis", "requests"),
    "jido.planner": ("torch",),
    "jido.bench": ("torch", "jido.engine", "jido.core", "jido.models", "jido.runner", "jido.executor"),
}


def layer_of(module: str) -> int:
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def all_modules() -> list[tuple[str, list[str]]]:
    return [(module_name(p), imports_of(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_module_imports_only_its_layer_or_below():
    violations = [f"{module} (L{layer_of(module)}) imports {name} (L{layer_of(name)})"
                  for module, names in all_modules() for name in names
                  if name.startswith("jido") and layer_of(name) > layer_of(module)]
    assert violations == []


def test_core_planner_and_bench_avoid_forbidden_dependencies():
    violations = [f"{module} imports {name}" for module, names in all_modules() for name in names
                  for package, banned in FORBIDDEN.items() if module.startswith(package)
                  for ban in banned if name == ban or name.startswith(ban + ".")]
    assert violations == []
