"""The DaemonSet's pod, from the image `Dockerfile` builds, on a real containerd.

The image (scripts/build-image.sh, built once per session) is imported into the
test's containerd, and the pod and container are created over CRI exactly as
examples/kubernetes/daemonset.yaml says (tests/e2e/daemonset.py reads it): its
own network namespace (a CNI bridge with no address on the host, so nothing is
reachable from outside), uid 0 with every capability dropped, no privilege
escalation, a read-only root filesystem, RuntimeDefault seccomp, and the
manifest's mounts with the hostPaths mapped to this containerd's own paths:

    /var/run/nri    -> the test containerd's NRI socket directory
    /sys/fs/cgroup  -> /sys/fs/cgroup
    /run/dbus       -> /run/dbus
    configMap       -> a directory holding examples/kubernetes/configmap.yaml's data

The plugin in that container must register with the containerd that runs it,
give tier pods their values, answer the manifest's probes from inside the
pod's network namespace (as kubelet reaches the pod IP), and come back after
containerd restarts and after its own container is killed and created again.

On the host (cgroup v1, cgroupfs driver) and in the cgroup v2 guest's systemd
leg (test_guest_cgroup_v2.py): there the pod runs in a private cgroup
namespace, the configuration says `cgroups.driver: systemd`, and the plugin
must have systemd hold its values over the system bus from inside the
container, so that they survive `systemctl daemon-reload`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.containerd import Containerd, Flavour
from tests.e2e.cri import runtime_pb2 as cri
from tests.e2e.daemonset import PluginPod, Probe, http_get_in_netns
from tests.e2e.node import NODE, SLOWDOWN, Driver, Values
from tests.e2e.plugin_process import Record, wait_until
from tests.e2e.pods import BE_NATIVE, Pod, run, spec
from tests.factory import MI, SPEC, labels

#: The pod's network: a bridge without an address on the host, the pod's eth0
#: holding a documentation address (RFC 5737) that no route leads to.
BRIDGE = "nrimb-e2e0"
POD_IP = "192.0.2.2"
CNI_PLUGINS = Path("/usr/lib/cni")
LIB = Path(__file__).resolve().parents[2] / "scripts" / "lib.sh"
#: How long the plugin may take from StartContainer to /readyz 200.
READY_TIMEOUT = 30.0


def cni_config() -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "nri-midbatch-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {"type": "static", "addresses": [{"address": f"{POD_IP}/24"}]},
            }
        ],
    }


def install_cni(containerd: Containerd) -> None:
    """The CNI plugins the pod's network needs (Debian's package), and that network."""
    if not (CNI_PLUGINS / "bridge").exists():
        # scripts/lib.sh's apt_install: waits for other apt runs, updates the lists once.
        log = containerd.workdir / "apt.log"
        script = f'SCRIPT=test_daemonset LOG={log}; source {LIB}; apt_install "$0"'
        subprocess.run(
            ["bash", "-c", script, "containernetworking-plugins"], check=True, timeout=900
        )
    for plugin in ("bridge", "loopback", "static"):
        (containerd.cni_bin / plugin).symlink_to(CNI_PLUGINS / plugin)
    (containerd.cni_conf / "10-e2e.conflist").write_text(json.dumps(cni_config()))


def for_this_node(config: str) -> str:
    """configmap.yaml's configuration as an operator sets it for this node's cgroup driver:
    `driver: systemd` where kubelet uses systemd (`auto` would not talk to systemd)."""
    if NODE.driver is not Driver.SYSTEMD:
        return config
    assert config.count("driver: auto\n") == 1, "configmap.yaml's cgroups.driver moved"
    return config.replace("driver: auto\n", "driver: systemd\n")


@dataclass
class DaemonSetPod:
    """The plugin's pod on the test node, and what it takes to (re)create its container."""

    containerd: Containerd
    pod: PluginPod
    pod_id: str
    sandbox: Any
    host_paths: dict[str, Path]
    config_root: Path
    container_id: str = ""
    attempt: int = 0
    #: the running container's pid, for its network namespace while containerd is away
    pid: int = 0

    def start_container(self) -> float:
        """Create and start the next attempt of the container; seconds until /readyz is 200."""
        config = self.pod.container_config(self.host_paths, self.config_root, self.attempt)
        self.attempt += 1
        resp = self.containerd.cri.CreateContainer(
            cri.CreateContainerRequest(
                pod_sandbox_id=self.pod_id, config=config, sandbox_config=self.sandbox
            ),
            timeout=60 * SLOWDOWN,
        )
        self.container_id = resp.container_id
        started = time.monotonic()
        self.containerd.start_container(self.container_id)
        self.pid = self.info()["pid"]
        assert wait_until(self.ready, READY_TIMEOUT), self.diagnose()
        return time.monotonic() - started

    def info(self) -> dict[str, Any]:
        """containerd's verbose container info: pid, the OCI spec runc got."""
        req = cri.ContainerStatusRequest(container_id=self.container_id, verbose=True)
        info: dict[str, Any] = json.loads(
            self.containerd.cri.ContainerStatus(req, timeout=10).info["info"]
        )
        return info

    def get(self, probe: Probe) -> int:
        return http_get_in_netns(Path(f"/proc/{self.pid}/ns/net"), POD_IP, probe)

    def ready(self) -> bool:
        return self.get(self.pod.probe("readinessProbe")) == 200

    def log(self) -> list[Record]:
        """The plugin's JSON records from every attempt's CRI log (`<time> <stream> <tag> line`)."""
        records = []
        for path in sorted(Path(self.sandbox.log_directory).glob("*/*.log")):
            for line in path.read_text().splitlines():
                payload = line.split(" ", 3)[-1]
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(payload))
        return records

    def diagnose(self) -> str:
        status = self.containerd.container_status(self.container_id)
        tail = "\n".join(json.dumps(r) for r in self.log()[-15:])
        return f"container {status.state} exit {status.exit_code} {status.reason}; log:\n{tail}"


@pytest.fixture(scope="session")
def image_root(containerd_flavour: Flavour, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """containerd's root for every DaemonSet test of this release: the image is imported
    once (minutes under the cgroup v2 guest's emulation), each test has its own containerd."""
    return tmp_path_factory.mktemp(f"ctrd-root-{containerd_flavour.version}")


@pytest.fixture
def daemonset(
    containerd_flavour: Flavour,
    containerd_bin: Path,
    plugin_image: Path,
    image_root: Path,
    tmp_path: Path,
) -> Iterator[DaemonSetPod]:
    """A containerd with the image imported and the DaemonSet's pod running and ready."""
    workdir = tmp_path / "ctrd"
    harness = Containerd(
        workdir, containerd_bin, version=containerd_flavour.version,
        systemd_cgroup=NODE.driver is Driver.SYSTEMD, nri_socket=workdir / "nri" / "nri.sock",
        root=image_root,
    )  # fmt: skip
    try:
        install_cni(harness)
        harness.start()
        pod = PluginPod.load()
        started = time.monotonic()
        if pod.image not in harness.ctr("images", "ls", "--quiet").split():
            harness.ctr("images", "import", str(plugin_image), timeout=300 * SLOWDOWN)
        imported = time.monotonic() - started
        pod.config_data["config.yaml"] = for_this_node(pod.config_data["config.yaml"])
        sandbox = pod.sandbox_config(harness.pod_logs / "nri-midbatch")
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        node = DaemonSetPod(
            harness,
            pod,
            harness.run_pod_config(sandbox, timeout=60 * SLOWDOWN),
            sandbox,
            host_paths={
                "/var/run/nri": harness.nri_socket.parent,
                "/sys/fs/cgroup": Path("/sys/fs/cgroup"),
                "/run/dbus": Path("/run/dbus"),
                # The test's own: pod records and the status socket of this plugin only.
                "/var/lib/nri-midbatch": state_dir,
            },
            config_root=tmp_path / "configmaps",
        )
        ready = node.start_container()
        print(
            f"\n{containerd_flavour.id}: image imported in {imported:.1f} s, ready in {ready:.2f} s"
        )
        yield node
    finally:
        problems = harness.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["ip", "link", "del", BRIDGE], check=True, capture_output=True)
        if problems:
            warnings.warn("containerd teardown: " + "; ".join(problems), stacklevel=1)


def assert_batch_pod_gets_its_values(
    node: DaemonSetPod, cpu_limit: str = "1k", quota: int = 100000
) -> Pod:
    """A batch pod created now gets the tier's values, pod and container (test_tiers.py)."""
    pod = run(
        node.containerd,
        f"batch-{uuid.uuid4().hex[:6]}",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: spec("batch", "500", cpu_limit, "512Mi")},
        BE_NATIVE,
    )
    expected = NODE.expect(512, quota, 512 * MI)
    assert NODE.read_values(pod.parent, pod.container_id) == expected, node.diagnose()
    assert NODE.read_values(pod.parent, None) == expected, node.diagnose()
    return pod


def test_runs_as_the_manifest_says_and_sets_tier_values(daemonset: DaemonSetPod) -> None:
    spec_ = daemonset.info()["runtimeSpec"]
    process = spec_["process"]
    assert process["user"]["uid"] == 0 and process["user"]["gid"] == 0
    assert not any(process.get("capabilities", {}).values()), process.get("capabilities")
    assert process["noNewPrivileges"] is True
    assert spec_["root"]["readonly"] is True
    assert spec_["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    namespaces = {n["type"] for n in spec_["linux"]["namespaces"]}
    assert {"network", "pid", "ipc"} <= namespaces
    # The hostPath replaces the container's own (read-only) cgroup mount.
    cgroup_mounts = [m for m in spec_["mounts"] if m["destination"] == "/sys/fs/cgroup"]
    assert [(m["source"], "ro" in m["options"]) for m in cgroup_mounts] == [
        ("/sys/fs/cgroup", False)
    ]
    nri = [m for m in spec_["mounts"] if m["destination"] == "/var/run/nri"]
    assert [(m["source"], "ro" in m["options"]) for m in nri] == [
        (str(daemonset.containerd.nri_socket.parent), True)
    ]

    assert daemonset.get(daemonset.pod.probe("livenessProbe")) == 200
    assert_batch_pod_gets_its_values(daemonset)
    assert not [r for r in daemonset.log() if r.get("level") in ("error", "critical")]


def test_survives_a_containerd_restart(daemonset: DaemonSetPod) -> None:
    liveness = daemonset.pod.probe("livenessProbe")
    readiness = daemonset.pod.probe("readinessProbe")
    daemonset.containerd.stop()
    # Unready while the runtime is away, but alive: the kubelet must not restart it.
    assert wait_until(lambda: daemonset.get(readiness) != 200), daemonset.diagnose()
    assert daemonset.get(liveness) == 200
    daemonset.containerd.start()
    assert wait_until(daemonset.ready, READY_TIMEOUT), daemonset.diagnose()
    assert_batch_pod_gets_its_values(daemonset)


def test_survives_its_container_killed_and_created_again(daemonset: DaemonSetPod) -> None:
    first = daemonset.container_id
    os.kill(daemonset.pid, signal.SIGKILL)
    assert wait_until(
        lambda: daemonset.containerd.container_status(first).state == cri.CONTAINER_EXITED
    )
    assert daemonset.containerd.container_status(first).exit_code == 128 + signal.SIGKILL
    # As kubelet restarts it: the next attempt in the same pod sandbox.
    daemonset.start_container()
    assert daemonset.container_id != first
    assert_batch_pod_gets_its_values(daemonset)


def busctl(*args: str) -> str:
    res = subprocess.run(
        ["busctl", "--timeout=30", *args], check=True, capture_output=True, text=True, timeout=60
    )
    return res.stdout


def held_by_systemd(unit: str) -> dict[str, int]:
    """What systemd holds for a slice or scope: CPUWeight, CPUQuotaPerSecUSec, MemoryMax."""
    names = ("CPUWeight", "CPUQuotaPerSecUSec", "MemoryMax")
    systemd = "org.freedesktop.systemd1"
    # `o "/org/freedesktop/systemd1/unit/..."`
    path = (
        busctl(
            "call", systemd, "/org/freedesktop/systemd1", f"{systemd}.Manager", "GetUnit", "s", unit
        )
        .split()[1]
        .strip('"')
    )
    kind = "Slice" if unit.endswith(".slice") else "Scope"
    lines = busctl("get-property", systemd, path, f"{systemd}.{kind}", *names).splitlines()
    # each line `t 1000000`
    return {name: int(line.split()[1]) for name, line in zip(names, lines, strict=True)}


@pytest.mark.skipif(NODE.driver is not Driver.SYSTEMD, reason="the systemd cgroup driver")
def test_systemd_holds_the_values_across_a_daemon_reload(daemonset: DaemonSetPod) -> None:
    # 375 milli-CPU: systemd keeps the quota as 37 % and runc passed it as 38 %, so a
    # reload changes both files; the plugin must see systemd's Reloading signal and put
    # back 37500 from inside its container.
    # The plugin's container has a cgroup namespace of its own (containerd's default on
    # v2); the node's whole hierarchy is still there through the hostPath.
    spec_ = daemonset.info()["runtimeSpec"]
    assert "cgroup" in {n["type"] for n in spec_["linux"]["namespaces"]}

    pod = assert_batch_pod_gets_its_values(daemonset, cpu_limit="375", quota=37500)
    expected = NODE.expect(512, 37500, 512 * MI)
    held = {"CPUWeight": expected.cpu, "CPUQuotaPerSecUSec": 375_000, "MemoryMax": 512 * MI}
    units = [pod.parent, f"cri-containerd-{pod.container_id}.scope"]

    def state() -> tuple[list[Values], list[dict[str, int]]]:
        files = [NODE.read_values(pod.parent, c) for c in (None, pod.container_id)]
        return files, [held_by_systemd(unit) for unit in units]

    # The pod slice had kubelet's weight 1 and no limits: the plugin set them over the bus.
    assert wait_until(lambda: held_by_systemd(pod.parent) == held), (state(), daemonset.diagnose())

    subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60 * SLOWDOWN)
    # Files put back, and systemd holding the values again, at both levels.
    want = ([expected, expected], [held, held])
    assert wait_until(lambda: state() == want), (state(), daemonset.diagnose())
    records = daemonset.log()
    assert any(r.get("event") == "setting cgroup values through systemd" for r in records)
    # Put back on systemd's Reloading signal, or by the periodic convergence pass if that
    # came first on a slow node: either is the plugin keeping its values.
    assert any(
        r.get("event")
        in (
            "cgroup values changed by systemd, put back",
            "cgroup values changed by another writer, put back",
        )
        for r in records
    )
    assert not [r for r in records if r.get("level") in ("error", "critical")]
    assert not [r for r in records if "not set through systemd" in str(r.get("event"))]
