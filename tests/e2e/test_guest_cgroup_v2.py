"""The tier tests on a real cgroup v2 node, in a QEMU guest, with both cgroup drivers.

This machine's own cgroups are v1 and must not be touched, so each leg boots
a guest (tests/e2e/qemu.py, docs/testing.md) whose kernel mounts only cgroup
v2, and runs a selection of the ordinary e2e tests there, unchanged: they read
the node's files through tests/e2e/node.py, which knows v2 and the drivers.

- cgroupfs: a bare node, cgroup2 mounted with +cpu +memory +pids.
- systemd: systemd as PID 1, containerd in a delegated scope with
  `SystemdCgroup = true`, the kubepods slices made as kubelet makes them, and
  the plugin with `cgroups.driver: systemd`.
- daemonset: the systemd node again, with the plugin as the DaemonSet's pod
  from the built image (test_daemonset.py) instead of a process of the checkout.

Each leg holds one boot; a test the guest could not finish (a hang, a boot
failure) fails with the tails of its output and of the guest's console.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.e2e.containerd import FLAVOURS, ContainerdError, fetch
from tests.e2e.node import DRIVER_ENV, Driver
from tests.e2e.qemu import GUEST_SHARE, ROOT, GuestError, boot, fetch_guest

#: What both legs run in the guest: pod and container values of a batch and a
#: mid pod, the Synchronize correction, a restart under a stricter
#: configuration, a reload, history independence and convergence.
GUEST_TESTS = (
    "tests/e2e/test_tiers.py::test_batch_be_pod_gets_batch_values",
    "tests/e2e/test_tiers.py::test_mid_be_pod_gets_mid_values",
    "tests/e2e/test_tiers.py::test_containers_created_while_plugin_was_away_are_corrected",
    "tests/e2e/test_reload.py::test_restarted_plugin_loosens_values_it_set_under_a_stricter_config",
    "tests/e2e/test_reload.py::test_config_change_reaches_running_containers",
    # Issue 23: history independence, each named so that every one is counted.
    "tests/e2e/test_history.py::test_ratio_back_to_one_returns_containers_and_pods_to_kubelets_quota",
    "tests/e2e/test_history.py::test_a_burstable_mid_pod_stays_within_kubelets_limits_through_cfs_quota_off",
    "tests/e2e/test_history.py::test_a_restart_under_a_looser_configuration_brings_pods_up_to_min_of_tier_and_kubelet",
    "tests/e2e/test_history.py::test_a_sighup_storm_ends_on_the_last_files_values",
    # Issue 34: back to exact after kubelet's writes, anyone's writes, a recreated sandbox.
    "tests/e2e/test_convergence.py::test_resizes_down_and_up_played_as_kubelet_plays_them_end_exact",
    "tests/e2e/test_convergence.py::test_foreign_writes_to_a_containers_and_a_pods_files_are_repaired",
    "tests/e2e/test_convergence.py::test_a_sandbox_recreated_under_the_same_uid_keeps_kubelets_pod_values",
)
#: The release the guest runs them on (the issue's modern node: containerd 2.x).
GUEST_CONTAINERD = FLAVOURS["2.1.9"]
#: What the systemd leg runs on top of GUEST_TESTS.
SYSTEMD_TESTS: tuple[str, ...] = (
    "tests/e2e/test_systemd_reload.py::test_values_survive_systemctl_daemon_reload",
)
#: A leg takes many minutes under software emulation on a loaded 2-core machine: with the
#: convergence tests, 827 s for cgroupfs and about 1,220 s for systemd (its 13 tests) while
#: another guest and other tests ran.
LEG_TIMEOUT = 1800.0
#: The DaemonSet's pod from the image (built on the host, before the boot) on the
#: systemd node: a leg of its own, as its pods need the image and a CNI network.
DAEMONSET_TESTS = (
    "tests/e2e/test_daemonset.py::test_runs_as_the_manifest_says_and_sets_tier_values",
    "tests/e2e/test_daemonset.py::test_survives_a_containerd_restart",
    "tests/e2e/test_daemonset.py::test_survives_its_container_killed_and_created_again",
    "tests/e2e/test_daemonset.py::test_systemd_holds_the_values_across_a_daemon_reload",
)
#: The DaemonSet leg imports the 210 MB image first (about 4 min of it on a loaded machine).
DAEMONSET_LEG_TIMEOUT = 1500.0
#: The tests' own waits, stretched for software emulation (node.SLOWDOWN).
SLOWDOWN = 10


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"guest prerequisites missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def guest_cache() -> Path:
    """qemu, the guest kernel and initramfs, with containerd fetched for the guest to use."""
    if os.geteuid() != 0:
        _unavailable("the guest legs need root")
    try:
        fetch(GUEST_CONTAINERD)
        return fetch_guest()
    except (ContainerdError, GuestError) as e:
        pytest.fail(str(e), pytrace=False)


def guest_command(driver: Driver, tests: tuple[str, ...]) -> str:
    """The shell script the guest runs: pytest on `tests`, junit into the share."""
    ids = " ".join(tests)
    return (
        f"cd {ROOT}\n"
        f"export CI=true {DRIVER_ENV}={driver} NRI_E2E_SLOWDOWN={SLOWDOWN}"
        " PYTHONDONTWRITEBYTECODE=1 TMPDIR=/guest-tmp\n"
        f"exec {sys.executable} -m pytest -p no:cacheprovider -q"
        f" --junitxml={GUEST_SHARE}/junit.xml -k {GUEST_CONTAINERD.id} {ids}\n"
    )


def outcomes(junit: Path) -> dict[str, str]:
    """test name -> passed / failed / error / skipped, from a junit report."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        result[case.get("name", "")] = outcome
    return result


def run_leg(
    cache: Path,
    driver: Driver,
    tests: tuple[str, ...],
    tmp_path: Path,
    timeout: float = LEG_TIMEOUT,
) -> None:
    """Boot the guest for `driver`, run `tests` there, and assert that every one passed."""
    share = tmp_path / "share"
    run = boot(cache, driver, guest_command(driver, tests), share, timeout=timeout)
    print(f"guest leg {driver}: {run.seconds:.0f} s")
    if run.rc is None:
        why = f"timed out after {timeout:.0f} s" if run.timed_out else "ended early"
        pytest.fail(f"guest leg {driver} {why}, no result\n{run.tails()}", pytrace=False)
    junit = share / "junit.xml"
    assert junit.exists(), f"pytest in the guest wrote no report (rc {run.rc})\n{run.tails()}"
    found = outcomes(junit)
    # Every selected test ran (each of a parametrized one's cases counted under its name) and
    # passed: a skip would hide a missing prerequisite.
    ran = {name.split("[")[0] for name in found}
    selected = {test.split("::")[-1] for test in tests}
    assert ran == selected and set(found.values()) == {"passed"}, f"{found}\n{run.tails()}"
    assert run.rc == 0, run.tails()


@pytest.mark.parametrize("driver", list(Driver))
def test_tier_tests_pass_on_cgroup_v2(driver: Driver, guest_cache: Path, tmp_path: Path) -> None:
    tests = GUEST_TESTS + (SYSTEMD_TESTS if driver is Driver.SYSTEMD else ())
    run_leg(guest_cache, driver, tests, tmp_path)


def test_daemonset_pod_runs_on_cgroup_v2(
    guest_cache: Path, plugin_image: Path, tmp_path: Path
) -> None:
    # plugin_image: built here, so that the guest finds the archive in .cache/image/.
    run_leg(guest_cache, Driver.SYSTEMD, DAEMONSET_TESTS, tmp_path, DAEMONSET_LEG_TIMEOUT)
