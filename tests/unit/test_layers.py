"""The rooms of the package and the arrows between them: every import points down the table.

The table is the one in README.md ("Architecture"): a room may import itself, the rooms it
lists, and the package's face (`nri_midbatch`, for `__version__`). Imports inside functions
and under TYPE_CHECKING count too: a layer that needs a higher one at all is in the wrong place.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nri_midbatch"

#: What the process may import: every room below it.
_PROCESS = frozenset(
    {
        "recording",
        "deferred",
        "counts",
        "plugin",
        "state",
        "obs",
        "config",
        "nri",
        "rpc",
        "wire",
        "api",
        "policy",
        "cgroups",
    }
)

#: room -> the rooms it may import, lowest rooms first.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "api": frozenset(),
    "policy": frozenset(),
    "obs": frozenset(),
    "counts": frozenset(),
    "wire": frozenset({"api"}),
    "rpc": frozenset({"wire", "api"}),
    "nri": frozenset({"counts", "rpc", "wire", "api"}),
    "cgroups": frozenset({"counts", "policy"}),
    "config": frozenset({"policy", "cgroups"}),
    "state": frozenset({"counts", "policy"}),
    "deferred": frozenset(),
    "plugin": frozenset(
        {"deferred", "counts", "nri", "rpc", "wire", "api", "policy", "cgroups", "config", "state"}
    ),
    "recording": frozenset({"plugin", "counts", "nri", "rpc", "wire", "api", "policy"}),
    "process": _PROCESS,
    # Everything below it, and the process.
    "tools": _PROCESS | {"process"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str | None:
    """The room of a module of the package; None for the package's face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(path: Path) -> Iterator[str]:
    """Every module of the package that `path` imports, relative imports resolved."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = node.module or ""
            # `from pkg import module` imports the module (its package is loaded as its
            # parent, not as a dependency); `from module import name`, the module.
            modules = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
            names = modules or [target]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "nri_midbatch" and _exists(name):
                yield name


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "api" not in p.relative_to(PACKAGE).parts)


def test_every_module_is_in_a_room_of_the_table() -> None:
    outside = [module_name(p) for p in SOURCES if room(module_name(p)) not in (*MAY_IMPORT, None)]
    assert outside == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down_the_table(path: Path) -> None:
    mine = room(module_name(path))
    allowed = MAY_IMPORT.get(mine, frozenset()) if mine else frozenset()
    wrong = sorted(
        name
        for name in imports(path)
        if (theirs := room(name)) is not None and theirs != mine and theirs not in allowed
    )
    assert wrong == [], f"{module_name(path)} ({mine}) may import only {sorted(allowed)}"


def test_the_module_graph_has_no_circle() -> None:
    graph = {module_name(p): set(imports(p)) for p in SOURCES}
    # A package's __init__ importing its own modules is its face, not a circle.
    for module, targets in graph.items():
        targets.discard(module)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def _writes_into_known(path: Path) -> Iterator[str]:
    """Where `path` assigns into a Known's maps (`known.pods[pod_id] = view`, say)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Subscript)
                    and isinstance(part.value, ast.Attribute)
                    and part.value.attr in KNOWN_MAPS
                ):
                    yield f"{module_name(path)}:{node.lineno}"


#: Known's maps: moved only through its named methods (state/known.py).
KNOWN_MAPS = frozenset({"pods", "containers", "applied"})


def test_kubelet_s_baseline_moves_only_in_state() -> None:
    """Known owns what the plugin knows: no room above state/ writes into its maps."""
    outside = [p for p in SOURCES if room(module_name(p)) != "state"]
    assert [where for path in outside for where in _writes_into_known(path)] == []
