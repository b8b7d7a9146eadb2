"""The lowest versions pyproject.toml's dependency ranges allow: installed into a throwaway
virtualenv, they must import the package and run it, so a range cannot promise a release
the code does not work with (a protobuf older than the generated modules' gencode, a
structlog without `is_enabled_for`).

pip has no "lowest" resolution: each direct dependency's lower bound becomes a `==`
constraint, and pip resolves the rest. The virtualenv is kept under .cache/ for its set of
constraints and Python version (the last one only), so the install (about 30 s) is paid
once; the checkout's code runs from the source tree (PYTHONPATH), not from a copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "lowest-versions"
DEMO = ROOT / "examples" / "recordings" / "demo.jsonl"
MID_LS = ROOT / "examples" / "pods" / "mid-ls.yaml"
DEFAULT_CONFIG = ROOT / "examples" / "config" / "default.yaml"


def lower_bounds() -> dict[str, str]:
    """Each of [project.dependencies] -> the version its `>=` names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds: dict[str, str] = {}
    for text in project["dependencies"]:
        requirement = Requirement(text)
        lowest = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lowest) == 1, f"{text!r}: a dependency needs one lower bound (>=)"
        bounds[requirement.name] = lowest[0]
    return bounds


@pytest.fixture(scope="module")
def lowest_python() -> Path:
    """The interpreter of a virtualenv holding exactly the lower bounds (made once)."""
    bounds = lower_bounds()
    constraints = "".join(f"{name}=={version}\n" for name, version in bounds.items())
    key = hashlib.sha256(f"{sys.version}\n{constraints}".encode()).hexdigest()[:16]
    venv = CACHE / key
    python = venv / "bin" / "python"
    if (venv / "ready").is_file():
        return python
    # Older bounds' virtualenvs, and an install that was cut short.
    shutil.rmtree(CACHE, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (venv / "constraints.txt").write_text(constraints)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", str(venv / "constraints.txt"), *bounds],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"the lower bounds do not install together:\n{done.stderr}"
    (venv / "ready").write_text(constraints)
    return python


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line tool from the checkout, on the lowest versions."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys; from nri_midbatch.tools.cli import main; sys.exit(main())"
    return subprocess.run(
        [str(python), "-c", code, *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_lowest_versions_are_what_is_installed(lowest_python: Path) -> None:
    listed = subprocess.run(
        [str(lowest_python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    installed = {
        canonicalize_name(name): Version(version)
        for name, version in (line.split("==", 1) for line in listed.split())
    }
    for name, version in lower_bounds().items():
        assert installed.get(canonicalize_name(name)) == Version(version), name


def test_the_demo_replays_on_the_lowest_versions(lowest_python: Path) -> None:
    # Through the socket: the generated modules, the wire, the policy, the decision lines.
    done = run(lowest_python, "replay", str(DEMO), "--via-socket")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 replies differ from the recording" in done.stdout
    # Work after a reply (decision lines) fails into the log, not the exit status.
    assert "Error" not in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_configuration_and_explain_run_on_the_lowest_versions(lowest_python: Path) -> None:
    checked = run(lowest_python, "check-config", str(DEFAULT_CONFIG))
    assert checked.returncode == 0, checked.stderr
    assert "kubeletCgroupRoot: /" in checked.stdout
    explained = run(lowest_python, "explain", "--pod", str(MID_LS))
    assert explained.returncode == 0, explained.stderr
    assert "tier mid" in explained.stdout, explained.stdout
