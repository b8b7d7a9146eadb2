"""Faults injected on a real containerd, and the order in which values go down.

After each fault: the plugin is alive and registered; no pod is blocked under
`failurePolicy: Ignore` (the default); every failure is logged with its pod
(and container) and counted in a metric; nothing is written outside the pod's
own cgroup. docs/troubleshooting.md#faults lists what the plugin does for each.

The order tests poll the real cgroup v1 files every millisecond and assert
that a pod's quota reaches its lowered value only after its containers'.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import CGROUP_ROOT, NODE, cgroup_controllers
from tests.e2e.plugin_process import PluginProcess, Record, iter_events, scrape, wait_until
from tests.e2e.pods import BE_NATIVE, Pod, run_batch
from tests.factory import BATCH_CPU, BATCH_MEMORY, MI, SPEC, labels

BATCH = labels("BE", "koord-batch")
EXPECTED = NODE.expect(512, 100000, 512 * MI)
HALVED = NODE.expect(512, 50000, 512 * MI)
STRICT = "rules:\n  cpuNormalizationRatio: 2.0\n"
QUOTA = "cpu.cfs_quota_us"
FULL_DISK = "recording write failed; dropping records until a write succeeds"


def batch_spec(*containers: str) -> dict[str, str]:
    """The batch tier's spec annotation: 500m request, 1 core and 512Mi limit per container."""
    resources = {
        "requests": {BATCH_CPU: "500"},
        "limits": {BATCH_CPU: "1k", BATCH_MEMORY: "512Mi"},
    }
    return {SPEC: json.dumps({"containers": dict.fromkeys(containers, resources)})}


@pytest.fixture
def plugins() -> Iterator[list[PluginProcess]]:
    """Plugins a test starts; each must exit 0 on SIGTERM at the end."""
    started: list[PluginProcess] = []
    yield started
    codes = [plugin.stop() for plugin in started]
    assert codes == [0] * len(started), codes


# -- what every fault is checked for --------------------------------------------------


def holds(pod: Pod, values: object) -> bool:
    """Whether the pod's container cgroup holds `values` now."""
    return NODE.read_values(pod.parent, pod.container_id) == values


def pod_holds(pod: Pod, values: object) -> bool:
    """Whether the pod's own cgroup holds `values` now."""
    return NODE.read_values(pod.parent, None) == values


def all_at_quota(pods: list[Pod], quota: int) -> bool:
    """Whether every pod and its container hold `quota` now."""
    return all(
        NODE.read_values(p.parent).quota == quota
        and NODE.read_values(p.parent, p.container_id).quota == quota
        for p in pods
    )


def outside_files() -> dict[str, str]:
    """The values of the cgroups above every pod: nothing may write them."""
    found = {}
    for controller, names in (
        ("cpu", ("cpu.shares", QUOTA)),
        ("memory", ("memory.limit_in_bytes",)),
    ):
        for level in ("", "kubepods", "kubepods/besteffort", "kubepods/burstable"):
            for name in names:
                path = CGROUP_ROOT / controller / level / name
                with contextlib.suppress(FileNotFoundError):
                    found[str(path)] = path.read_text().strip()
    return found


def assert_serving(containerd: Containerd, plugin: PluginProcess, port: int, name: str) -> None:
    """Alive, registered, and a new pod runs at once with its tier's values."""
    assert plugin.proc.poll() is None, "the plugin exited"
    assert wait_until(lambda: scrape(port, "nri_midbatch_registered") == 1, timeout=30)
    started = time.monotonic()
    pod = run_batch(containerd, name)
    assert time.monotonic() - started < 15, "pod creation held up"
    assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    assert NODE.read_values(pod.parent, None) == EXPECTED


def warnings_for(plugin: PluginProcess, event: str, pod: str) -> list[Record]:
    return [r for r in iter_events(plugin.records(), event) if r.get("pod") == pod]


# -- a runtime that goes away ------------------------------------------------------------


def test_containerd_killed_during_a_synchronize_then_restarted(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    """SIGKILL while containerd applies a Synchronize's updates: the next one repairs all."""
    names = ("c0", "c1", "c2")
    pods = []
    for i in range(4):  # created while no plugin runs: kubelet's values only
        parent = NODE.new_cgroup_parent("besteffort")
        pod_id = containerd.run_pod(
            f"early-{i}", labels=BATCH, annotations=batch_spec(*names), cgroup_parent=parent
        )
        for name in names:
            ctr = containerd.create_container(pod_id, name=name, resources=BE_NATIVE)
            containerd.start_container(ctr)
            pods.append(Pod(parent, pod_id, ctr))
    outside = outside_files()
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    plugins.append(plugin)
    port = plugin.metrics_port(timeout=30)
    first, _ = plugin.wait_for("synchronized", timeout=30)
    # containerd applies the reply's 12 updates one runc update at a time.
    assert containerd.proc is not None
    containerd.proc.send_signal(signal.SIGKILL)
    containerd.proc.wait(10)
    containerd.stop()
    applied = sum(NODE.read_values(p.parent, p.container_id) == EXPECTED for p in pods)
    print(f"\ncontainers updated when containerd was killed: {applied} of {len(pods)}")

    containerd.start()
    plugin.wait_for("synchronized", after=first + 1, timeout=30)
    # The pod's values add up its three containers'.
    whole = NODE.expect(3 * 512, 3 * 100000, 3 * 512 * MI)
    for p in pods:
        assert wait_until(functools.partial(holds, p, EXPECTED)), NODE.read_values(
            p.parent, p.container_id
        )
        assert wait_until(functools.partial(pod_holds, p, whole))
    assert scrape(port, "nri_midbatch_reconnects_total") >= 1
    repaired = scrape(port, "nri_midbatch_container_repairs_total", result="ok")
    print(f"containers reported right by the restarted containerd but repaired: {repaired:g}")
    lost = list(iter_events(plugin.records(), "connection to runtime lost"))
    assert lost, "the lost connection is logged"
    assert outside_files() == outside
    assert_serving(containerd, plugin, port, "after-restart")


def test_plugin_stopped_past_the_request_timeout_registers_again_and_repairs(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    """SIGSTOP: the runtime drops the plugin at its next event; SIGCONT: it comes back."""
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    plugins.append(plugin)
    port = plugin.metrics_port(timeout=30)
    first, _ = plugin.wait_for("synchronized", timeout=30)
    outside = outside_files()
    os.kill(plugin.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        # RunPodSandbox waits out the 2 s request timeout, then goes on without us.
        late = run_batch(containerd, "while-stopped")
        held = time.monotonic() - started
        meanwhile = run_batch(containerd, "while-dropped")
        containerd.wait_for_log("closing plugin")
    finally:
        os.kill(plugin.proc.pid, signal.SIGCONT)
    assert held < 15, f"pod creation held {held:.1f}s"
    assert NODE.read_values(meanwhile.parent, meanwhile.container_id) == NODE.expect(2, -1, -1)

    plugin.wait_for("connection to runtime lost", after=first, timeout=30)
    plugin.wait_for("synchronized", after=first + 1, timeout=30)
    for p in (late, meanwhile):
        assert wait_until(functools.partial(holds, p, EXPECTED)), NODE.read_values(
            p.parent, p.container_id
        )
        assert wait_until(functools.partial(pod_holds, p, EXPECTED))
    assert scrape(port, "nri_midbatch_reconnects_total") >= 1
    assert outside_files() == outside
    assert_serving(containerd, plugin, port, "after-resume")


# -- cgroup writes that fail ---------------------------------------------------------------


def run_pod_while_paused(
    containerd: Containerd,
    plugin: PluginProcess,
    name: str,
    between: Callable[[str, Path], None],
) -> tuple[str, str]:
    """RunPodSandbox with the plugin stopped; `between(parent, sandbox cgroup)` runs
    after runc made the pod's cgroups and before the plugin sees the event
    (containerd sends it between creating the sandbox's task and starting it).

    Returns (cgroup parent, pod id). The plugin is resumed well within the
    runtime's 2 s request timeout.
    """
    parent = NODE.new_cgroup_parent("besteffort")
    pod_dir = CGROUP_ROOT / "cpu" / parent.strip("/")
    os.kill(plugin.proc.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(
                containerd.run_pod,
                name,
                uid=str(uuid.uuid4()),
                labels=BATCH,
                annotations=batch_spec("main"),
                cgroup_parent=parent,
            )

            def sandbox() -> Path | None:
                # containerd sends the event once runc has created the sandbox's
                # task (cgroups set up, process not started): runc says so.
                for child in pod_dir.glob("*/cgroup.procs"):
                    if child.read_text().strip() and _runc_status(containerd, child.parent.name):
                        return child.parent
                return None

            assert wait_until(lambda: sandbox() is not None, timeout=20)
            sandbox_dir = sandbox()
            assert sandbox_dir is not None
            between(parent, sandbox_dir)
            os.kill(plugin.proc.pid, signal.SIGCONT)
            pod_id = future.result(timeout=30)
    finally:
        os.kill(plugin.proc.pid, signal.SIGCONT)
    return parent, pod_id


def _runc_status(containerd: Containerd, container_id: str) -> bool:
    """Whether runc has finished creating the container (state `created` or later)."""
    root = containerd.runc_root / "k8s.io"
    state = subprocess.run(
        ["runc", "--root", str(root), "state", container_id], capture_output=True, text=True
    )
    return state.returncode == 0 and json.loads(state.stdout).get("status") != "creating"


def test_pod_cgroup_removed_before_the_write(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    plugins.append(plugin)
    port = plugin.metrics_port(timeout=30)
    plugin.wait_for("synchronized", timeout=30)
    run_batch(containerd, "first")  # kubepods/besteffort exists from here on
    outside = outside_files()

    def remove(parent: str, sandbox_dir: Path) -> None:
        # The sandbox's processes move up, so that the pod's cgroups can go.
        pids = (sandbox_dir / "cgroup.procs").read_text().split()
        for controller in cgroup_controllers():
            procs = CGROUP_ROOT / controller / "kubepods" / "besteffort" / "cgroup.procs"
            if (CGROUP_ROOT / controller / parent.strip("/")).is_dir() and procs.exists():
                for pid in pids:
                    procs.write_text(pid)
        for controller in cgroup_controllers():
            top = CGROUP_ROOT / controller / parent.strip("/")
            for directory in sorted(top.glob("*"), reverse=True):
                if directory.is_dir():
                    directory.rmdir()
            if top.is_dir():
                top.rmdir()

    parent, pod_id = run_pod_while_paused(containerd, plugin, "gone", remove)
    _, warning = plugin.wait_for("pod cgroup not set", timeout=10)
    assert (warning["method"], warning["pod"], warning["namespace"]) == (
        "RunPodSandbox",
        "gone",
        "default",
    )
    assert "No such file or directory" in warning["reason"], warning
    # The plugin made nothing: runc recreates the pod's cgroup with its first container.
    assert not (CGROUP_ROOT / "cpu" / parent.strip("/")).exists()
    assert scrape(port, "nri_midbatch_pod_cgroup_writes_total", result="failed") == 1
    container_id = containerd.create_container(pod_id, name="main", resources=BE_NATIVE)
    containerd.start_container(container_id)
    assert NODE.read_values(parent, container_id) == EXPECTED
    assert outside_files() == outside
    assert_serving(containerd, plugin, port, "after-gone")


def test_pod_quota_the_kernel_refuses(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    """EINVAL: cgroup v1 refuses a pod quota below a child's (here the sandbox's)."""
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    plugins.append(plugin)
    port = plugin.metrics_port(timeout=30)
    plugin.wait_for("synchronized", timeout=30)
    run_batch(containerd, "first")
    outside = outside_files()

    def raise_sandbox_quota(_parent: str, sandbox_dir: Path) -> None:
        (sandbox_dir / QUOTA).write_text("400000")

    parent, pod_id = run_pod_while_paused(containerd, plugin, "refused", raise_sandbox_quota)
    _, warning = plugin.wait_for("pod cgroup not set", timeout=10)
    assert (warning["method"], warning["pod"]) == ("RunPodSandbox", "refused")
    assert "Invalid argument" in warning["reason"], warning
    assert scrape(port, "nri_midbatch_pod_cgroup_writes_total", result="failed") == 1
    container_id = containerd.create_container(pod_id, name="main", resources=BE_NATIVE)
    containerd.start_container(container_id)
    assert NODE.read_values(parent, container_id) == EXPECTED
    assert NODE.read_values(parent, None).quota == -1
    assert outside_files() == outside
    assert_serving(containerd, plugin, port, "after-refused")


def test_read_only_cgroup_mount(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    """EROFS: the plugin runs in a mount namespace of its own where kubepods is read-only."""
    run_batch(containerd, "first")  # kubepods/besteffort exists from here on
    targets = [str(CGROUP_ROOT / c / "kubepods" / "besteffort") for c in ("cpu", "memory")]
    script = 'for d in "$1" "$2"; do mount --bind -o ro "$d" "$d" || exit 1; done; shift 2; '
    script += 'exec "$@"'
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    plugin = PluginProcess(
        tmp_path / "plugin",
        containerd.nri_socket,
        config="",
        wrapper=[*wrapper, *targets],
    )
    plugins.append(plugin)
    config = tmp_path / "plugin" / "config.yaml"
    port = plugin.metrics_port(timeout=30)
    plugin.wait_for("synchronized", timeout=30)
    outside = outside_files()

    pod = run_batch(containerd, "read-only")
    (warning,) = warnings_for(plugin, "pod cgroup not set", "read-only")
    assert warning["method"] == "RunPodSandbox"
    assert "Read-only file system" in warning["reason"], warning
    # The runtime sets the container: NRI adjustments do not need the plugin's mounts.
    assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    # Also the first pod's, at the Synchronize once the runtime had lowered its container.
    (first,) = warnings_for(plugin, "pod cgroup not set", "first")
    assert first["method"] == "Synchronize"
    assert scrape(port, "nri_midbatch_pod_cgroup_writes_total", result="failed") == 2

    # A reload writes cgroup files itself on containerd 1.7: every one fails, named.
    config.write_text(STRICT)
    assert wait_until(
        lambda: scrape(port, "nri_midbatch_reload_writes_total", result="failed") >= 2,
        timeout=15,
    )
    failed = warnings_for(plugin, "cgroup not set for new configuration", "read-only")
    assert {r.get("container") for r in failed} == {"main", None}, failed
    assert all("Read-only file system" in r["reason"] for r in failed)
    assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    assert outside_files() == outside
    assert plugin.proc.poll() is None
    assert scrape(port, "nri_midbatch_registered") == 1
    later = run_batch(containerd, "later")
    assert NODE.read_values(later.parent, later.container_id) == HALVED


# -- the plugin's own resources --------------------------------------------------------------


def test_metrics_address_taken_at_start(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    """NRI comes first: the plugin registers without its metrics and binds them later."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        plugin = PluginProcess(
            tmp_path / "plugin", containerd.nri_socket, metrics_address=f"127.0.0.1:{port}"
        )
        plugins.append(plugin)
        plugin.wait_for("synchronized", timeout=30)
        _, error = plugin.wait_for("cannot serve metrics, retrying", timeout=10)
        assert error["address"] == f"127.0.0.1:{port}"
        pod = run_batch(containerd, "without-metrics")
        assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    finally:
        holder.close()
    assert plugin.metrics_port(timeout=30) == port
    assert scrape(port, "nri_midbatch_metrics_bind_failures_total") >= 1
    assert_serving(containerd, plugin, port, "with-metrics")


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted at the end."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    with contextlib.suppress(OSError), open(directory / "filler", "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


def test_recording_filesystem_full(
    containerd: Containerd, tmp_path: Path, small_tmpfs: Path, plugins: list[PluginProcess]
) -> None:
    """Events are served as before; said once, counted, and SIGTERM still exits 0."""
    plugin = PluginProcess(
        tmp_path / "plugin",
        containerd.nri_socket,
        extra_args=["--record", str(small_tmpfs / "calls.jsonl")],
    )
    plugins.append(plugin)
    port = plugin.metrics_port(timeout=30)
    plugin.wait_for("synchronized", timeout=30)
    fill(small_tmpfs)
    outside = outside_files()
    for i in range(3):
        pod = run_batch(containerd, f"unrecorded-{i}")
        assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    assert wait_until(lambda: scrape(port, "nri_midbatch_records_dropped_total") > 0)
    # One line per failing write would be one per event: a full disk is said once.
    assert len(list(iter_events(plugin.records(), FULL_DISK))) == 1
    assert outside_files() == outside
    assert_serving(containerd, plugin, port, "still-unrecorded")


# -- the configuration file -------------------------------------------------------------------


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
    + ["rules: *i"]
)


@pytest.mark.parametrize(
    "break_it",
    ["deleted", "directory", "alias-bomb"],
)
def test_configuration_file_broken_while_events_flow(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess], break_it: str
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="")
    plugins.append(plugin)
    config = tmp_path / "plugin" / "config.yaml"
    port = plugin.metrics_port(timeout=30)
    plugin.wait_for("synchronized", timeout=30)
    outside = outside_files()
    if break_it == "deleted":
        config.unlink()
    elif break_it == "directory":
        config.unlink()
        config.mkdir()
    else:
        config.write_text(ALIAS_BOMB)
    pods = [run_batch(containerd, f"during-{i}") for i in range(3)]
    for pod in pods:
        assert NODE.read_values(pod.parent, pod.container_id) == EXPECTED
    if break_it != "deleted":
        assert wait_until(
            lambda: scrape(port, "nri_midbatch_config_reloads_total", result="invalid") == 1
        )
        _, rejected = plugin.wait_for("configuration rejected, the previous one stays in force")
        assert str(config) in rejected["error"], rejected
        config.rename(tmp_path / "broken")
    # A good file again: reloading still works.
    config.write_text(STRICT)
    assert wait_until(
        lambda: NODE.read_values(pods[0].parent, pods[0].container_id) == HALVED,
        timeout=15,
    ), NODE.read_values(pods[0].parent, pods[0].container_id)
    assert scrape(port, "nri_midbatch_config_reloads_total", result="applied") == 1
    assert outside_files() == outside
    assert plugin.proc.poll() is None
    assert scrape(port, "nri_midbatch_registered") == 1


# -- order of lowering -------------------------------------------------------------------------


class FilePoller:
    """Reads files every millisecond in a thread; remembers when each took its last value."""

    def __init__(self, paths: list[Path], interval: float = 0.001) -> None:
        self._paths = paths
        self._interval = interval
        #: path -> [(time, content)], one entry per change
        self.changes: dict[Path, list[tuple[float, str]]] = {p: [] for p in paths}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.polls = 0

    def __enter__(self) -> FilePoller:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _read(self) -> None:
        now = time.monotonic()
        for path in self._paths:
            try:
                # The quota token: all of cpu.cfs_quota_us, the first of v2's cpu.max.
                text = path.read_text().split()[0]
            except OSError:
                text = "<gone>"
            seen = self.changes[path]
            if not seen or seen[-1][1] != text:
                seen.append((now, text))
        self.polls += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self._interval)

    def final(self, path: Path) -> tuple[float, str]:
        """When the file took its last value, and the value."""
        return self.changes[path][-1]


def quota_files(pods: list[Pod]) -> list[tuple[Path, Path]]:
    """(pod, container) quota files of each pod, on this node's cgroup version and driver."""
    quota = NODE.value_files()[1].name
    return [
        (
            NODE.pod_dir("cpu", p.parent) / quota,
            NODE.container_dir("cpu", p.parent, p.container_id) / quota,
        )
        for p in pods
    ]


def order_gaps(poller: FilePoller, files: list[tuple[Path, Path]], value: str) -> list[float]:
    """Seconds from each container's quota reaching `value` to its pod's (negative: pod first)."""
    gaps = []
    for pod_file, container_file in files:
        pod_at, pod_value = poller.final(pod_file)
        container_at, container_value = poller.final(container_file)
        assert (pod_value, container_value) == (value, value), poller.changes
        gaps.append(pod_at - container_at)
    return gaps


def test_restart_under_a_stricter_config_lowers_pods_after_their_containers(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    default = PluginProcess(tmp_path / "default", containerd.nri_socket, config="")
    default.wait_for("synchronized", timeout=30)
    pods = [run_batch(containerd, f"batch-{i}") for i in range(4)]
    assert default.stop() == 0
    files = quota_files(pods)
    with FilePoller([f for pair in files for f in pair]) as poller:
        strict = PluginProcess(tmp_path / "strict", containerd.nri_socket, config=STRICT)
        plugins.append(strict)
        strict.wait_for("synchronized", timeout=30)
        assert wait_until(
            lambda: all(NODE.read_values(p.parent, None) == HALVED for p in pods),
            timeout=15,
        )
    gaps = order_gaps(poller, files, "50000")
    print(f"\nrestart, lowering: pod after its container by {[round(g, 4) for g in gaps]} s")
    # The plugin writes a pod as soon as it reads its container lowered, well
    # under a poll apart, so one poll may see both (gap 0). A poll reads the pod
    # before the container, so a pod written first shows as a negative gap.
    # On cgroup v1 the kernel is the sharper witness: a pod quota below its
    # container's is EINVAL, which would be "pod cgroup not set" below.
    assert all(gap >= 0 for gap in gaps), gaps
    assert not list(iter_events(strict.records(), "pod cgroup not set"))
    assert not list(iter_events(strict.records(), "runtime did not lower containers in time"))


def test_reload_lowers_pods_after_their_containers_and_raises_them_before(
    containerd: Containerd, tmp_path: Path, plugins: list[PluginProcess]
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="")
    plugins.append(plugin)
    config = tmp_path / "plugin" / "config.yaml"
    plugin.wait_for("synchronized", timeout=30)
    pods = [run_batch(containerd, f"batch-{i}") for i in range(4)]
    files = quota_files(pods)
    for text, value, label in ((STRICT, "50000", "lowering"), ("", "100000", "raising")):
        with FilePoller([f for pair in files for f in pair]) as poller:
            config.write_text(NODE.plugin_config(text))
            # Both levels: under emulation the second write comes well after the first.
            assert wait_until(functools.partial(all_at_quota, pods, int(value)), timeout=15)
            time.sleep(0.05)  # no later write may follow
        gaps = order_gaps(poller, files, value)
        print(f"\nreload, {label}: pod after its container by {[round(g, 4) for g in gaps]} s")
        # The plugin writes both here, microseconds apart: one poll may see both.
        if label == "lowering":
            assert all(gap >= 0 for gap in gaps), gaps
        else:
            assert all(gap <= 0 for gap in gaps), gaps
    assert not list(iter_events(plugin.records(), "cgroup not set for new configuration"))
