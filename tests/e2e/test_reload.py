"""A configuration change reaches running containers on a real containerd."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess, iter_events, scrape, wait_until
from tests.e2e.pods import BE_NATIVE, run, run_batch, spec
from tests.factory import MI, SPEC, labels


def test_config_change_reaches_running_containers(containerd: Containerd, tmp_path: Path) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="")
    config = tmp_path / "plugin" / "config.yaml"
    try:
        plugin.wait_for("synchronized")
        port = plugin.metrics_port()
        pod = run_batch(containerd, "batch")
        assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 100000, 512 * MI)

        # Before NRI v0.12.2 (containerd 1.7.24: v0.6.1, 2.1.9: v0.8.0) the
        # runtime cannot take UpdateContainers safely: the plugin writes the
        # running container's and pod's cgroup files itself.
        config.write_text(NODE.plugin_config("rules:\n  cpuNormalizationRatio: 2.0\n"))
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id).quota == 50000), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 50000, 512 * MI)
        # A lowered pod is written after its container (order of lowering): wait for it too.
        assert wait_until(lambda: NODE.read_values(pod.parent, None).quota == 50000), (
            NODE.read_values(pod.parent, None)
        )
        assert NODE.read_values(pod.parent, None) == NODE.expect(512, 50000, 512 * MI)
        assert scrape(port, "nri_midbatch_config_reloads_total", result="applied") == 1

        # An invalid file is refused; the values and the configuration stay.
        config.write_text(NODE.plugin_config("rules:\n  cpuNormalisationRatio: 4.0\n"))
        assert wait_until(
            lambda: scrape(port, "nri_midbatch_config_reloads_total", result="invalid") == 1
        )
        _, rejected = plugin.wait_for("configuration rejected, the previous one stays in force")
        assert "rules.cpuNormalisationRatio" in rejected["error"]
        assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 50000, 512 * MI)

        # New containers follow the configuration in force.
        later = run_batch(containerd, "batch-later")
        assert NODE.read_values(later.parent, later.container_id).quota == 50000
    finally:
        assert plugin.stop() == 0


def test_restarted_plugin_loosens_values_it_set_under_a_stricter_config(
    containerd: Containerd, tmp_path: Path
) -> None:
    strict = PluginProcess(
        tmp_path / "strict", containerd.nri_socket, config="rules:\n  cpuNormalizationRatio: 2.0\n"
    )
    try:
        strict.wait_for("synchronized")
        pod = run_batch(containerd, "batch")
        assert NODE.read_values(pod.parent, pod.container_id).quota == 50000
    finally:
        assert strict.stop() == 0
    # The container carries the limits kubelet gave it (none), so the new
    # plugin does not mistake the 50000 we set for a kubelet limit to keep.
    default = PluginProcess(tmp_path / "default", containerd.nri_socket, config="")
    try:
        default.wait_for("synchronized")
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id).quota == 100000), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert wait_until(
            lambda: NODE.read_values(pod.parent, None) == NODE.expect(512, 100000, 512 * MI)
        ), NODE.read_values(pod.parent, None)
    finally:
        assert default.stop() == 0


def test_restarted_plugin_lowers_a_pod_after_its_containers(
    containerd: Containerd, tmp_path: Path
) -> None:
    """cgroup v1 refuses a pod quota below a child's (EINVAL): the pod must go last.

    containerd applies the container updates of the Synchronize reply only
    once it has the reply, so the plugin writes the pod after replying, and
    once more a second later if the kernel still refused it.
    """
    default = PluginProcess(tmp_path / "default", containerd.nri_socket, config="")
    try:
        default.wait_for("synchronized")
        pod = run_batch(containerd, "batch")
        assert NODE.read_values(pod.parent, None) == NODE.expect(512, 100000, 512 * MI)
        assert NODE.read_values(pod.parent, pod.container_id).quota == 100000
    finally:
        assert default.stop() == 0
    strict = PluginProcess(
        tmp_path / "strict", containerd.nri_socket, config="rules:\n  cpuNormalizationRatio: 2.0\n"
    )
    try:
        strict.wait_for("synchronized")
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id).quota == 50000), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert wait_until(
            lambda: NODE.read_values(pod.parent, None) == NODE.expect(512, 50000, 512 * MI)
        ), NODE.read_values(pod.parent, None)
        _, written = strict.wait_for("pod cgroup set")
        assert (written["method"], written["cpu_quota"]) == ("Synchronize", 50000)
        assert not list(iter_events(strict.records(), "pod cgroup not set"))
    finally:
        assert strict.stop() == 0


def test_a_broken_config_file_is_refused_while_pods_keep_coming(
    containerd: Containerd, tmp_path: Path
) -> None:
    """Deleted, replaced by a directory, an alias bomb: refused, logged, counted, still watched."""
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="")
    config = tmp_path / "plugin" / "config.yaml"
    bomb = "".join(
        f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9 if n else ['"lol"'] * 9) + "]\n"
        for n in range(9)
    )

    def delete() -> None:
        config.unlink()

    def directory() -> None:
        config.mkdir()  # where the deleted file was

    def alias_bomb() -> None:
        config.rmdir()
        config.write_text(bomb)

    faults = [
        (delete, "No such file or directory"),
        (directory, "a directory, not a regular file"),
        (alias_bomb, "once its aliases are expanded"),
    ]
    try:
        plugin.wait_for("synchronized")
        port = plugin.metrics_port()
        after = 0

        def refused() -> float:
            return scrape(port, "nri_midbatch_config_reloads_total", result="invalid")

        for count, (fault, reason) in enumerate(faults, start=1):
            fault()
            index, rejected = plugin.wait_for(
                "configuration rejected, the previous one stays in force", after=after
            )
            after = index + 1
            assert reason in rejected["error"], rejected
            assert refused() == count
            # Pods keep coming and get the values of the configuration in force (defaults).
            pod = run(
                containerd, f"batch-{count}", "besteffort", labels("BE", "koord-batch"),
                {SPEC: spec("batch", "500", "1k", "512Mi")}, BE_NATIVE,
            )  # fmt: skip
            assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(
                512, 100000, 512 * MI
            )
        # Repaired: the watch is alive and the new file applies to running containers.
        config.write_text(NODE.plugin_config("rules:\n  cpuNormalizationRatio: 2.0\n"))
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id).quota == 50000), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert scrape(port, "nri_midbatch_config_reloads_total", result="applied") == 1
        assert plugin.proc.poll() is None
    finally:
        assert plugin.stop() == 0
