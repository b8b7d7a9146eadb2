"""A node whose kubelet runs with `--cgroup-root=/kubelet` (KinD's): pods live below
/kubelet/kubepods, and with `cgroups.kubeletCgroupRoot: /kubelet` they get their values
there, on a real containerd and runc; a pod outside that root's kubepods gets none."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd, remove_cgroup_tree
from tests.e2e.node import NODE, Driver
from tests.e2e.plugin_process import PluginProcess
from tests.e2e.pods import BE_NATIVE, spec
from tests.factory import MI, SPEC, labels

ROOT = "/kubelet"
CONFIG = f"cgroups:\n  kubeletCgroupRoot: {ROOT}\n"

pytestmark = pytest.mark.skipif(
    NODE.driver is not Driver.CGROUPFS,
    reason="the cgroupfs layout below /kubelet; the systemd one is in the unit tests",
)


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    """The /kubelet tree, removed after containerd (set up before it, so torn down after)."""
    yield ROOT
    remove_cgroup_tree(ROOT)


def run_batch_pod(containerd: Containerd, name: str, parent: str) -> str:
    """A BE koord-batch pod asking 500m, 1 CPU and 512Mi in `parent`; its container's id."""
    pod_id = containerd.run_pod(
        name,
        uid=str(uuid.uuid4()),
        labels=labels("BE", "koord-batch"),
        annotations={SPEC: spec("batch", "500", "1k", "512Mi")},
        cgroup_parent=parent,
    )
    container_id = containerd.create_container(pod_id, name="main", resources=BE_NATIVE)
    containerd.start_container(container_id)
    return container_id


def test_pods_below_kubelets_cgroup_root_get_their_values(
    kubelet_root: str, containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=CONFIG)
    plugin.wait_for("synchronized")
    parent = f"{kubelet_root}/kubepods/besteffort/pod{uuid.uuid4()}"

    container_id = run_batch_pod(containerd, "batch-kind", parent)

    # Koordinator: request 500 -> shares 512; limit 1000 -> quota 100000.
    assert NODE.read_values(parent, None) == NODE.expect(512, 100000, 512 * MI)
    assert NODE.read_values(parent, container_id) == NODE.expect(512, 100000, 512 * MI)
    assert plugin.stop() == 0


def test_a_pod_outside_the_roots_kubepods_is_refused(
    kubelet_root: str, containerd: Containerd, tmp_path: Path
) -> None:
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=CONFIG)
    plugin.wait_for("synchronized")
    # The default root's place, which this node's kubelet never uses.
    parent = NODE.new_cgroup_parent("besteffort")

    run_batch_pod(containerd, "batch-outside", parent)

    _, warning = plugin.wait_for("pod cgroup not set")
    assert warning["pod"] == "batch-outside"
    assert "not a pod cgroup of kubelet's (kubelet/kubepods" in str(warning["reason"])
    # runc made the pod's cgroup with no limits; the plugin wrote nothing into it.
    assert NODE.read_values(parent, None).quota == -1
    assert plugin.stop() == 0
