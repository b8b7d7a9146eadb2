"""No test module imports another test module: what tests share lives in helper modules
(tests/factory.py, tests/fake_cgroups.py, tests/admission.py, tests/e2e/pods.py, ...), so
a test module can change without changing what other modules' tests mean.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(p for p in TESTS.rglob("*.py") if "cri" not in p.relative_to(TESTS).parts)


def dotted(path: Path) -> list[str]:
    return ["tests", *path.relative_to(TESTS).with_suffix("").parts]


def imported(source: str, module: list[str]) -> Iterator[str]:
    """Every module `source`, the text of `module`, imports: relative imports resolved,
    `from package import module` counted as that module."""
    package = module[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: ".".join(dotted(p)))
def test_no_module_imports_a_test_module(path: Path) -> None:
    names = imported(path.read_text(), dotted(path))
    assert sorted({name for name in names if is_test_module(name)}) == []


def test_the_check_sees_relative_and_absolute_imports() -> None:
    source = "from .test_a import x\nfrom tests.e2e.test_b import y\nfrom . import test_c\n"
    names = imported(source, ["tests", "unit", "test_example"])
    found = {name for name in names if is_test_module(name)}
    assert found == {"tests.unit.test_a", "tests.e2e.test_b", "tests.unit.test_c"}
