"""CgroupWriter: a read finds the cgroup its write would, and fails one way."""

from pathlib import Path

import pytest

from nri_midbatch.cgroups.paths import CgroupDriver, CgroupLocation
from nri_midbatch.cgroups.values import UNLIMITED, CgroupReading
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable, CgroupWriter
from nri_midbatch.plugin.context import writer_for
from nri_midbatch.policy import CgroupValues, ContainerView, PodView

PARENT = "/kubepods/besteffort/pod1"
POD = PodView("1", "jobs", "batch", {}, {}, PARENT)
APP = ContainerView("abc123", "app")


def cgroup_v2(root: Path, relpath: str) -> None:
    (root / "cgroup.controllers").write_text("cpu memory\n")
    directory = root / relpath.lstrip("/")
    directory.mkdir(parents=True)
    files = {"cpu.weight": "100\n", "cpu.max": "max 100000\n", "memory.max": "max\n"}
    for name, text in files.items():
        (directory / name).write_text(text)


def test_a_read_finds_the_container_its_write_does_by_the_runtimes_naming(
    tmp_path: Path,
) -> None:
    # CRI-O names a cgroupfs container crio-<id>; no cgroups path is sent.
    cgroup_v2(tmp_path, f"{PARENT}/crio-{APP.id}")
    writer = CgroupWriter(tmp_path, CgroupDriver.CGROUPFS, runtime="cri-o")

    assert writer.write(POD, APP, CgroupValues(None, 50_000, None)).failure is None
    assert writer.read(POD, APP) == CgroupReading(None, 100, 50_000, UNLIMITED)


@pytest.mark.parametrize(
    ("parent", "why"),
    [
        ("/system.slice/pod1", "not a pod cgroup"),  # refused path
        ("/kubepods/besteffort/pod2", "No such file"),  # gone
    ],
)
def test_a_read_that_fails_raises_cgroup_unreadable(tmp_path: Path, parent: str, why: str) -> None:
    cgroup_v2(tmp_path, PARENT)
    pod = PodView("2", "jobs", "other", {}, {}, parent)

    with pytest.raises(CgroupUnreadable, match=why):
        CgroupWriter(tmp_path, CgroupDriver.CGROUPFS).read(pod)


def test_a_read_of_a_file_that_holds_no_value_raises_cgroup_unreadable(tmp_path: Path) -> None:
    cgroup_v2(tmp_path, PARENT)
    (tmp_path / PARENT.lstrip("/") / "memory.max").write_text("lots\n")

    with pytest.raises(CgroupUnreadable):
        CgroupWriter(tmp_path, CgroupDriver.CGROUPFS).read(POD)


KIND_POD_CGROUPFS = "/kubelet/kubepods/besteffort/pod1"
KIND_POD_SYSTEMD = "kubelet-kubepods-besteffort-pod1.slice"
KIND_POD_SYSTEMD_DIR = (
    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" + KIND_POD_SYSTEMD
)


@pytest.mark.parametrize(
    ("driver", "parent", "directory"),
    [
        ("cgroupfs", KIND_POD_CGROUPFS, KIND_POD_CGROUPFS),
        ("systemd", KIND_POD_SYSTEMD, KIND_POD_SYSTEMD_DIR),
    ],
)
def test_kubelets_cgroup_root_from_the_configuration_is_where_pods_are_written(
    tmp_path: Path, driver: str, parent: str, directory: str
) -> None:
    text = f"cgroups:\n  root: {tmp_path}\n  driver: {driver}\n  kubeletCgroupRoot: /kubelet\n"
    writer = writer_for(settings_of(load_config_text(text, "test")), "containerd", None)
    cgroup_v2(tmp_path, directory)
    pod = PodView("1", "jobs", "batch", {}, {}, parent)

    assert writer.write(pod, None, CgroupValues(None, 50_000, None)).failure is None
    assert (tmp_path / directory.lstrip("/") / "cpu.max").read_text() == "50000"
    assert writer.read(pod) == CgroupReading(None, 100, 50_000, UNLIMITED)


@pytest.mark.parametrize(
    ("driver", "outside"),
    [
        ("cgroupfs", "/kubepods/besteffort/pod1"),
        ("systemd", "kubepods-besteffort-pod1.slice"),
    ],
)
def test_kubelets_cgroup_root_writes_nothing_outside_its_kubepods(
    tmp_path: Path, driver: str, outside: str
) -> None:
    text = f"cgroups:\n  root: {tmp_path}\n  driver: {driver}\n  kubeletCgroupRoot: /kubelet\n"
    writer = writer_for(settings_of(load_config_text(text, "test")), "containerd", None)
    # A pod cgroup of the default root's: there, and refused.
    relpath = CgroupLocation(CgroupDriver(driver), outside).relpath()
    cgroup_v2(tmp_path, str(relpath))
    pod = PodView("1", "jobs", "batch", {}, {}, outside)

    written = writer.write(pod, None, CgroupValues(None, 50_000, None))

    assert written.failure is not None and "not a pod cgroup" in written.failure
    assert (tmp_path / relpath / "cpu.max").read_text() == "max 100000\n"
