"""The policy core is pure: importing it loads no I/O, protocol or validation library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

POLICY = Path(__file__).resolve().parents[2] / "nri_midbatch" / "policy"


def test_policy_imports_only_stdlib_and_itself() -> None:
    """Absolute imports name the stdlib; relative ones stay inside the package.

    Imports under `if TYPE_CHECKING:` count too: a type taken from the configuration
    model is the core knowing that model (it once made a circle config -> policy -> config).
    """
    for source in POLICY.glob("*.py"):
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                # `from . import x` and `from .x import y` stay in policy/; `..` leaves it.
                assert node.level == 1, (source.name, "." * node.level + (node.module or ""))
                continue
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (source.name, name)


def test_importing_policy_loads_no_heavy_modules() -> None:
    probe = (
        "import sys, nri_midbatch.policy; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'pydantic', 'yaml', 'asyncio', 'google', 'structlog'} "
        "or m.startswith(('nri_midbatch.nri', 'nri_midbatch.rpc', 'nri_midbatch.config.model'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
