"""The plugin registers with a real containerd, external and pre-launched."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.e2e.containerd import Containerd
from tests.e2e.plugin_process import PluginProcess, prelaunched_wrapper, wait_for_record
from tests.e2e.pods import run_batch


def test_external_plugin_registers_configures_and_synchronizes(
    containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    try:
        _, configured = plugin.wait_for("configured")
        # Both releases vendor NRI before v0.10 (v0.6.1, v0.8.0), which say so
        # only through their own version: bits above 0x7FF would get us dropped.
        assert configured["runtime"].startswith(f"containerd {containerd.flavour.version}")
        assert configured["nri"] == containerd.flavour.nri
        assert int(configured["events"], 16) & ~0x7FF == 0
        # The harness configures 5 s and 2 s; only NRI v0.7+ passes them on.
        _, registered = plugin.wait_for("registered")
        timeouts = (
            "registration_timeout=5.0, request_timeout=2.0"
            if containerd.flavour.configure_carries_timeouts
            else "registration_timeout=None, request_timeout=None"
        )
        assert timeouts in registered["runtime"], registered
        plugin.wait_for("synchronized")
        containerd.wait_for_log('plugin \\"10-midbatch\\"', timeout=5)
    finally:
        assert plugin.stop() == 0


def test_containerd_restart_leads_to_a_fresh_registration(
    containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    try:
        first, _ = plugin.wait_for("synchronized")

        def identity() -> tuple[int, int]:
            st = containerd.nri_socket.stat()
            return st.st_ino, st.st_ctime_ns

        old_socket = identity()
        containerd.stop()
        # containerd may leave its socket file behind on stop; it comes back as
        # a new socket (new inode or ctime: tmpfs reuses inode numbers).
        socket_back: list[float] = []

        def watch_socket() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if identity() != old_socket:
                        socket_back.append(time.monotonic())
                        return
                except FileNotFoundError:
                    pass
                time.sleep(0.002)

        watcher = threading.Thread(target=watch_socket)
        watcher.start()
        # The plugin has noticed and waits out the stale socket before containerd is back.
        plugin.wait_for("connection to runtime lost", after=first)
        containerd.start()
        watcher.join(timeout=20)
        plugin.wait_for("registered", after=first + 1, timeout=10)
        registered_at = time.monotonic()
        plugin.wait_for("synchronized", after=first + 1)
        assert socket_back, "the NRI socket never came back"
        assert registered_at - socket_back[0] < 2.0, registered_at - socket_back[0]
        # Exactly one registration per containerd lifetime: never two live ones.
        registrations = [r for r in plugin.records() if r.get("event") == "registered"]
        assert len(registrations) == 2
    finally:
        assert plugin.stop() == 0


def test_prelaunched_plugin_from_plugin_path(containerd: Containerd, tmp_path: Path) -> None:
    log_path = tmp_path / "prelaunched.log"
    prelaunched_wrapper(containerd.plugin_path, "10-midbatch", log_path)
    (containerd.plugin_config_path / "10-midbatch.conf").write_text("failurePolicy: Fail\n")
    containerd.stop()
    containerd.start()
    index, configured = wait_for_record(log_path, lambda r: r.get("event") == "configured")
    assert configured["nri"] == containerd.flavour.nri
    starting = [r for r in _records(log_path) if r.get("event") == "starting"]
    assert starting[0]["mode"] == "pre-launched"
    # A pod event: the runtime is past the point where a Synchronize comes.
    run_batch(containerd, "batch")
    pod_set, _ = wait_for_record(
        log_path,
        lambda r: r.get("event") == "pod cgroup set" and r.get("method") == "RunPodSandbox",
        after=index,
    )
    synchronized = [i for i, r in enumerate(_records(log_path)) if r.get("event") == "synchronized"]
    if containerd.flavour.synchronizes_prelaunched:
        # NRI v0.7+ (containerd 2.x) synchronizes pre-launched plugins too.
        assert len(synchronized) == 1
        assert index < synchronized[0] < pod_set
    else:
        # NRI v0.6.1 never does: the plugin works without one.
        assert synchronized == []
    # The drop-in config arrives through Configure and is applied.
    assert not [r for r in _records(log_path) if "rejected" in str(r.get("event", ""))]
    assert any(
        r.get("failure_policy") == "Fail"
        for r in _records(log_path)
        if r.get("event") == "configuration applied"
    )


def _records(path: Path) -> list[dict[str, object]]:
    from tests.e2e.plugin_process import read_log

    return read_log(path)
