"""Debian 12's prometheus and promtool for the monitoring tests, installed on first use.

scripts/install-prometheus.sh apt-get installs the package without starting its service.
Without root the tests that need the binaries are skipped, except under CI (`CI=true`),
where a missing prerequisite is a failure, as for the end-to-end tests.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "install-prometheus.sh"
MONITORING = ROOT / "examples" / "monitoring"
RULES = MONITORING / "nri-midbatch-rules.yaml"
RULE_TESTS = MONITORING / "nri-midbatch-rules.test.yaml"
DASHBOARD = MONITORING / "nri-midbatch-dashboard.json"


@functools.cache
def _install() -> str | None:
    """None once both binaries are on the PATH, else why they are not."""
    if shutil.which("prometheus") and shutil.which("promtool"):
        return None
    if os.geteuid() != 0:
        return "prometheus and promtool are missing, and installing them needs root"
    res = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"{INSTALL.name} failed:\n{res.stderr}", pytrace=False)
    return None


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`, installing the package if needed."""
    reason = _install()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"monitoring prerequisites missing under CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{INSTALL.name} succeeded but {name} is not on the PATH", pytrace=False)
    return path
