"""Fixtures for the end-to-end tests against a real containerd with NRI.

Every test that uses `containerd` runs once per release in FLAVOURS
(`containerd_flavour`, a session-scoped parameter: ids such as
`test_x[containerd-2.1.9]`, so `-k containerd-2.1.9` picks one leg).
`containerd_bin` (session) fetches that release once (cached under .cache/);
`containerd` (function) yields a started `Containerd` harness in the test's
tmp dir and tears it down afterwards. Without root the tests are skipped,
except under CI (`CI=true`), where a missing prerequisite is a failure: CI
must not silently skip end-to-end coverage.
"""

from __future__ import annotations

import os
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.containerd import (
    FLAVOURS,
    Containerd,
    ContainerdError,
    Flavour,
    fetch,
)
from tests.e2e.daemonset import PluginPod
from tests.e2e.node import NODE, Driver

E2E_DIR = Path(__file__).resolve().parent
BUILD_IMAGE = E2E_DIR.parents[1] / "scripts" / "build-image.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"e2e prerequisites missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/e2e is end-to-end, marked or not.
    for item in items:
        if E2E_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", params=list(FLAVOURS.values()), ids=lambda f: f.id)
def containerd_flavour(request: pytest.FixtureRequest) -> Flavour:
    """The containerd release this test runs against."""
    flavour: Flavour = request.param
    return flavour


@pytest.fixture(scope="session")
def containerd_bin(containerd_flavour: Flavour) -> Path:
    """Directory holding containerd, containerd-shim-runc-v2 and ctr (fetched once)."""
    if os.geteuid() != 0:
        _unavailable("e2e tests need root (containerd, runc and cgroup writes)")
    missing = NODE.missing()
    if missing:
        _unavailable(f"e2e tests need {missing}")
    try:
        return fetch(containerd_flavour)
    except ContainerdError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def containerd(
    containerd_flavour: Flavour, containerd_bin: Path, tmp_path: Path
) -> Iterator[Containerd]:
    """A started containerd with NRI on tmp_path/nri.sock; torn down after the test."""
    harness = Containerd(
        tmp_path / "ctrd",
        containerd_bin,
        version=containerd_flavour.version,
        systemd_cgroup=NODE.driver is Driver.SYSTEMD,
    )
    try:
        harness.start()
        yield harness
    finally:
        problems = harness.close()
        if problems:
            warnings.warn("containerd teardown: " + "; ".join(problems), stacklevel=1)


@pytest.fixture(scope="session")
def plugin_image() -> Path:
    """A docker archive of the image `Dockerfile` builds, tagged as the DaemonSet names it
    (scripts/build-image.sh: buildah, a Debian-made base; once per session, cached)."""
    if os.geteuid() != 0:
        _unavailable("building the image needs root (buildah, mmdebstrap)")
    started = time.monotonic()
    res = subprocess.run(
        ["bash", str(BUILD_IMAGE)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=dict(os.environ, IMAGE=PluginPod.load().image),
    )
    if res.returncode != 0:
        pytest.fail(f"{BUILD_IMAGE.name} failed:\n{res.stderr}", pytrace=False)
    archive = Path(res.stdout.strip().splitlines()[-1])
    print(
        f"\nimage: {archive.name}, {archive.stat().st_size / 1e6:.0f} MB,"
        f" ready in {time.monotonic() - started:.1f} s"
    )
    return archive
