"""Issue 23 on a real containerd: the values in force do not depend on the way there.

After a reload, a restart or a burst of SIGHUPs, every container and pod holds what a
fresh plugin would set from kubelet's values under the configuration in force, and
never more than kubelet's limits. Kubelet's part is played here: the pod cgroup is
created and limited before RunPodSandbox, and the sandbox config carries the pod's
resources (containerd 2.x passes them to NRI, 1.7 does not).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.containerd import Containerd
from tests.e2e.kubelet import run_burstable
from tests.e2e.node import NODE, SLOWDOWN
from tests.e2e.plugin_process import (
    PluginProcess,
    check_status_shows_no_drift,
    scrape,
    wait_until,
)
from tests.e2e.pods import Pod, normalizing, run_batch, spec
from tests.factory import MI, SPEC, labels


def quotas(pod: Pod) -> tuple[int, int]:
    """(container, pod) CFS quota."""
    return (
        NODE.read_values(pod.parent, pod.container_id).quota,
        NODE.read_values(pod.parent, None).quota,
    )


def quiet(count: Callable[[], float], *, seconds: float) -> Callable[[], bool]:
    """A condition that holds once `count` has not changed for `seconds`."""
    last = [count(), time.monotonic()]

    def unchanged() -> bool:
        now = count()
        if now != last[0]:
            last[:] = [now, time.monotonic()]
        return time.monotonic() - last[1] >= seconds * SLOWDOWN

    return unchanged


def test_ratio_back_to_one_returns_containers_and_pods_to_kubelets_quota(
    containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=normalizing("1.25"))
    config = tmp_path / "plugin" / "config.yaml"
    native = {
        "cpu_shares": 1536,
        "cpu_period": 100000,
        "cpu_quota": 200000,
        "memory_limit_in_bytes": 512 * MI,
    }
    try:
        plugin.wait_for("synchronized")
        pod = run_burstable(containerd, "prod", labels("LS", "koord-prod"), {}, native)
        assert NODE.read_values(pod.parent, pod.container_id).quota == 160000  # 200000 / 1.25
        config.write_text(NODE.plugin_config(normalizing("1.0")))
        plugin.wait_for_reload()
        assert wait_until(lambda: quotas(pod) == (200000, 200000)), quotas(pod)
        assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1536, 200000, 512 * MI)
        check_status_shows_no_drift(plugin)
    finally:
        assert plugin.stop() == 0


def test_a_burstable_mid_pod_stays_within_kubelets_limits_through_cfs_quota_off(
    containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="")
    config = tmp_path / "plugin" / "config.yaml"
    native = {
        "cpu_shares": 512,
        "cpu_period": 100000,
        "cpu_quota": 50000,
        "memory_limit_in_bytes": 512 * MI,
    }
    try:
        plugin.wait_for("synchronized")
        pod = run_burstable(
            containerd,
            "mid-ls",
            labels("LS", "koord-mid"),
            {SPEC: spec("mid", "500", "1k", "1Gi")},
            native,
        )
        assert NODE.read_values(pod.parent, None) == NODE.expect(512, 50000, 512 * MI)
        config.write_text(NODE.plugin_config("rules: {cfsQuota: false}\n"))
        plugin.wait_for_reload()
        for container_id in (pod.container_id, None):
            values = NODE.read_values(pod.parent, container_id)
            assert values == NODE.expect(512, 50000, 512 * MI), (container_id, values)
        check_status_shows_no_drift(plugin)
    finally:
        assert plugin.stop() == 0


def test_a_restart_under_a_looser_configuration_brings_pods_up_to_min_of_tier_and_kubelet(
    containerd: Containerd, tmp_path: Path
) -> None:
    """Mid+LS: the tier asks 200000, kubelet allows 150000; ratio 2 had lowered both to 100000."""
    native = {
        "cpu_shares": 1024,
        "cpu_period": 100000,
        "cpu_quota": 150000,
        "memory_limit_in_bytes": 1024 * MI,
    }
    # The two plugins keep their records in one directory, as the DaemonSet's host path does.
    state = tmp_path / "state"
    strict = PluginProcess(
        tmp_path / "strict",
        containerd.nri_socket,
        config="rules: {cpuNormalizationRatio: 2}\n",
        state_dir=state,
    )
    try:
        strict.wait_for("synchronized")
        pod = run_burstable(
            containerd,
            "mid-ls",
            labels("LS", "koord-mid"),
            {SPEC: spec("mid", "1k", "2k", "1Gi")},
            native,
        )
        assert wait_until(lambda: quotas(pod) == (100000, 100000)), quotas(pod)
    finally:
        assert strict.stop() == 0
    default = PluginProcess(tmp_path / "default", containerd.nri_socket, config="", state_dir=state)
    try:
        default.wait_for("synchronized")
        assert wait_until(lambda: quotas(pod) == (150000, 150000)), quotas(pod)
        check_status_shows_no_drift(default)
    finally:
        assert default.stop() == 0


def test_a_sighup_storm_ends_on_the_last_files_values(
    containerd: Containerd, tmp_path: Path
) -> None:
    halved, whole = "rules: {cpuNormalizationRatio: 2}\n", ""
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=whole)
    config = tmp_path / "plugin" / "config.yaml"
    sighups = 20
    try:
        plugin.wait_for("synchronized")
        port = plugin.metrics_port()
        pod = run_batch(containerd, "batch")
        for i in range(sighups):
            config.write_text(NODE.plugin_config(whole if i % 2 else halved))
            plugin.proc.send_signal(signal.SIGHUP)
        config.write_text(NODE.plugin_config(halved))
        plugin.proc.send_signal(signal.SIGHUP)

        def reloads() -> float:
            return sum(
                scrape(port, "nri_midbatch_config_reloads_total", result=result)
                for result in ("applied", "unchanged", "invalid", "failed")
            )

        # The kernel merges SIGHUPs still pending, so fewer reloads than signals run; the
        # storm is over once no reload has been counted for three of the watch's intervals.
        assert wait_until(quiet(reloads, seconds=3.0), timeout=60), reloads()
        assert wait_until(lambda: quotas(pod) == (50000, 50000)), quotas(pod)
        assert NODE.read_values(pod.parent, None) == NODE.expect(512, 50000, 512 * MI)
        check_status_shows_no_drift(plugin)
    finally:
        assert plugin.stop() == 0
