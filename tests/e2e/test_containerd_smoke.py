"""A real containerd applies CRI resources to real cgroup v1 files."""

from __future__ import annotations

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.factory import MI

pytestmark = pytest.mark.e2e


def test_cri_resources_reach_cgroup_files(containerd: Containerd) -> None:
    assert containerd.nri_socket.is_socket()

    parent = NODE.new_cgroup_parent("besteffort")
    pod_id = containerd.run_pod("smoke", namespace="e2e", cgroup_parent=parent)
    assert NODE.pod_dir("cpu", parent).is_dir()

    resources = {
        "cpu_shares": 512,
        "cpu_quota": 50000,
        "cpu_period": 100000,
        "memory_limit_in_bytes": 256 * MI,
    }
    ctr_id = containerd.create_container(pod_id, name="sleeper", resources=resources)
    containerd.start_container(ctr_id)

    cpu = NODE.container_dir("cpu", parent, ctr_id)
    memory = NODE.container_dir("memory", parent, ctr_id)
    assert (cpu / "cpu.shares").read_text().strip() == "512"
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(256 * MI)

    containerd.stop_and_remove_all()
    assert containerd.list_containers() == []
    assert not cpu.exists()
