"""Issue 23 on a real containerd: the values in force do not depend on the way there.

After a reload, a restart or a burst of SIGHUPs, every container and pod holds what a
fresh plugin would set from kubelet's values under the configuration in force, and
never more than kubelet's limits. Kubelet's part is played here: the pod cgroup is
created and limited before RunPodSandbox, and the sandbox config carries the pod's
resources (containerd 2.x passes them to NRI, 1.7 does not).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from nri_midbatch.cgroups.files import CgroupVersion
from nri_midbatch.cgroups.values import cpu_shares_to_weight
from tests.e2e.containerd import Containerd
from tests.e2e.cri import runtime_pb2 as cri
from tests.e2e.node import CGROUP_ROOT, NODE, SLOWDOWN, Driver
from tests.e2e.plugin_process import EXECUTABLE, PluginProcess, scrape, wait_until
from tests.e2e.pods import NORMALIZATION_CONFIG, Pod, run_batch, spec
from tests.factory import MI, SPEC, labels


def normalizing(ratio: str) -> str:
    """The normalization tests' tiers (batch, mid, prod normalized) under another ratio."""
    ratio_line = f"cpuNormalizationRatio: {ratio}"
    return NORMALIZATION_CONFIG.replace("cpuNormalizationRatio: 1.25", ratio_line)


def kubelet_limits_pod_cgroup(parent: str, shares: int, quota: int, memory: int) -> None:
    """What kubelet does before RunPodSandbox for a burstable pod with limits."""
    NODE.prepare_parent(parent)
    if NODE.driver is Driver.SYSTEMD:
        # As kubelet's systemd driver does: the slice's unit properties, which systemd
        # writes into files it enables the controllers for.
        subprocess.run(
            [
                "systemctl",
                "set-property",
                "--runtime",
                parent,
                f"CPUWeight={cpu_shares_to_weight(shares)}",
                f"CPUQuota={quota / 1000:g}%",
                f"MemoryMax={memory}",
            ],
            check=True,
            timeout=30 * SLOWDOWN,
        )
        return
    if NODE.version is CgroupVersion.V1:
        texts = {
            ("cpu", "cpu.shares"): str(shares),
            ("cpu", "cpu.cfs_quota_us"): str(quota),
            ("memory", "memory.limit_in_bytes"): str(memory),
        }
    else:
        _enable_controllers_down_to(parent)
        texts = {
            ("cpu", "cpu.weight"): str(cpu_shares_to_weight(shares)),
            ("cpu", "cpu.max"): f"{quota} 100000",
            ("memory", "memory.max"): str(memory),
        }
    for (controller, name), text in texts.items():
        directory = NODE.pod_dir(controller, parent)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)


def _enable_controllers_down_to(parent: str) -> None:
    """cgroup v2, cgroupfs: each level hands cpu and memory to the next, as kubelet's do."""
    path = CGROUP_ROOT
    for part in Path(parent.strip("/")).parts:
        (path / "cgroup.subtree_control").write_text("+cpu +memory")
        path = path / part
        path.mkdir(exist_ok=True)


def run_burstable(
    containerd: Containerd,
    name: str,
    pod_labels: Mapping[str, str],
    annotations: Mapping[str, str],
    native: Mapping[str, int],
) -> Pod:
    """A one-container burstable pod whose pod limits are its container's (no overhead)."""
    uid = str(uuid.uuid4())
    parent = NODE.new_cgroup_parent("burstable", uid)
    kubelet_limits_pod_cgroup(
        parent, native["cpu_shares"], native["cpu_quota"], native["memory_limit_in_bytes"]
    )
    config = containerd.pod_config(
        name, uid=uid, labels=pod_labels, annotations=annotations, cgroup_parent=parent
    )
    config.linux.resources.CopyFrom(cri.LinuxContainerResources(**native))
    pod_id = containerd.run_pod_config(config)
    container_id = containerd.create_container(pod_id, name="main", resources=native)
    containerd.start_container(container_id)
    return Pod(parent, pod_id, container_id)


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


def check_status_shows_no_drift(plugin: PluginProcess) -> None:
    """`nri-midbatch status` of the running plugin: every workload it set holds its target."""
    answer = subprocess.run(
        [str(EXECUTABLE), "status", "--socket", str(plugin.status_socket), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60 * SLOWDOWN,
        check=False,
    )
    document = json.loads(answer.stdout)
    drifting = [w for w in document["workloads"] if w["drift"]]
    assert answer.returncode == 0 and not drifting, drifting
    # It answers of the pods it remembers, given back or not.
    assert document["workloads"], document


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
