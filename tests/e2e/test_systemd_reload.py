"""Under the systemd cgroup driver, pod and container values survive `systemctl daemon-reload`.

A daemon-reload makes systemd write back into each unit's cgroup files the
values it holds: kubelet's for a pod slice, the runtime's for a container
scope, and a CPU quota truncated to whole percent (runc rounds a container's
up). The plugin has systemd hold its values and puts back what a reload
changed (nri_midbatch/cgroups/systemd.py). Runs in the systemd leg of the
cgroup v2 guest (test_guest_cgroup_v2.py); skipped on any other node.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE, Driver, Values
from tests.e2e.plugin_process import PluginProcess, scrape, wait_until
from tests.e2e.pods import BE_NATIVE, Pod, run, spec
from tests.factory import MI, SPEC, labels

REPAIRED = "nri_midbatch_cgroup_drift_repaired_total"
SETS = "nri_midbatch_systemd_property_sets_total"

pytestmark = pytest.mark.skipif(
    NODE.driver is not Driver.SYSTEMD, reason="the systemd cgroup driver (guest systemd leg)"
)


def daemon_reload() -> None:
    subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)


Expected = list[tuple[Pod, Values]]

#: The periodic convergence pass would put back the same files, racing the repair this test
#: counts (systemd's Reloading signal): off here, so that the repair is systemd.py's alone.
SYSTEMD_REPAIRS_ONLY = "convergence:\n  intervalSeconds: 0\n"


def current(pods: Expected) -> dict[tuple[str, str | None], Values]:
    """Every pod's and container's values, as the files hold them now."""
    return {
        (pod.parent, unit): NODE.read_values(pod.parent, unit)
        for pod, _ in pods
        for unit in (None, pod.container_id)
    }


def expected(pods: Expected) -> dict[tuple[str, str | None], Values]:
    """The same pod and container values the test expects (both levels get the pod's)."""
    return {(pod.parent, unit): want for pod, want in pods for unit in (None, pod.container_id)}


def test_values_survive_systemctl_daemon_reload(containerd: Containerd, tmp_path: Path) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=SYSTEMD_REPAIRS_ONLY)
    config = tmp_path / "plugin" / "config.yaml"
    try:
        plugin.wait_for("synchronized")
        port = plugin.metrics_port()
        # 375 milli-CPU: a quota (37.5 ms per 100 ms) that systemd keeps as 37 %.
        odd = run(
            containerd, "batch-odd", "besteffort", labels("BE", "koord-batch"),
            {SPEC: spec("batch", "500", "375", "256Mi")}, BE_NATIVE,
        )  # fmt: skip
        mid = run(
            containerd, "mid-be", "besteffort", labels("BE", "koord-mid"),
            {SPEC: spec("mid", "2k", "4k", "1Gi")}, BE_NATIVE,
        )  # fmt: skip
        pods = [
            (odd, NODE.expect(512, 37500, 256 * MI)),
            (mid, NODE.expect(2048, 400000, 1024 * MI)),
        ]
        assert current(pods) == expected(pods)

        # Pod values written at RunPodSandbox, container values set through NRI.
        daemon_reload()
        assert wait_until(lambda: current(pods) == expected(pods)), current(pods)
        assert wait_until(lambda: scrape(port, REPAIRED, level="pod") >= 1)
        assert scrape(port, REPAIRED, level="container") >= 1  # runc's 38 % for 37.5 %

        # A configuration reload: on containerd 2.1.9 (NRI v0.8.0) the plugin
        # writes the running containers' files itself, and has systemd hold them.
        config.write_text(
            NODE.plugin_config("rules:\n  cpuNormalizationRatio: 2.0\n" + SYSTEMD_REPAIRS_ONLY)
        )
        pods = [
            (odd, NODE.expect(512, 18750, 256 * MI)),
            (mid, NODE.expect(2048, 200000, 1024 * MI)),
        ]
        assert wait_until(lambda: current(pods) == expected(pods)), current(pods)
        daemon_reload()
        assert wait_until(lambda: current(pods) == expected(pods)), current(pods)
        # And they stay so past the plugin's second look, a second later.
        assert not wait_until(lambda: current(pods) != expected(pods), timeout=0.3), current(pods)
        for level in ("pod", "container"):
            assert scrape(port, SETS, level=level, result="failed") == 0
            assert scrape(port, SETS, level=level, result="ok") >= 1
    finally:
        assert plugin.stop() == 0
