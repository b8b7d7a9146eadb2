"""Fixtures for the end-to-end tests against a real containerd with NRI.

`containerd_bin` (session) runs scripts/fetch-containerd.sh once; `containerd`
(function) yields a started `Containerd` harness in the test's tmp dir and
tears it down afterwards. Without root the tests are skipped, except under CI
(`CI=true`), where a missing prerequisite is a failure: CI must not silently
skip end-to-end coverage.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.containerd import CGROUP_ROOT, Containerd

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "scripts" / "fetch-containerd.sh"
E2E_DIR = Path(__file__).resolve().parent


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e prerequisites missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/e2e is end-to-end, marked or not.
    for item in items:
        if E2E_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def containerd_bin() -> Path:
    """Directory holding containerd, containerd-shim-runc-v2 and ctr (fetched once)."""
    if os.geteuid() != 0:
        _unavailable("e2e tests need root (containerd, runc and cgroup writes)")
    if not (CGROUP_ROOT / "cpu" / "cpu.shares").exists():
        _unavailable(f"e2e tests need cgroup v1 with the cpu controller at {CGROUP_ROOT}/cpu")
    res = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"{FETCH.name} failed:\n{res.stderr}", pytrace=False)
    bin_dir = Path(res.stdout.strip().splitlines()[-1])
    if not (bin_dir / "containerd").is_file():
        pytest.fail(f"{FETCH.name} printed {bin_dir}, which has no containerd", pytrace=False)
    return bin_dir


@pytest.fixture
def containerd(containerd_bin: Path, tmp_path: Path) -> Iterator[Containerd]:
    """A started containerd with NRI on tmp_path/nri.sock; torn down after the test."""
    harness = Containerd(tmp_path / "ctrd", containerd_bin)
    try:
        harness.start()
        yield harness
    finally:
        problems = harness.close()
        if problems:
            warnings.warn("containerd teardown: " + "; ".join(problems), stacklevel=1)
