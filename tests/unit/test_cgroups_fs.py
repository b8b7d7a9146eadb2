"""The cgroup writer against fake cgroup trees built in tmp_path."""

import contextlib
import ctypes
import errno
import gc
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_midbatch.cgroups import (
    UNLIMITED,
    CgroupDriver,
    CgroupLocation,
    CgroupPathError,
    CgroupReading,
    CgroupValues,
    CgroupVersion,
    FileFailure,
    FileUnchanged,
    FileWrite,
    WriteReport,
    apply_values,
    detect_version,
    read_values,
)
from nri_midbatch.cgroups import fs as cgroup_fs
from nri_midbatch.cgroups.fs import CgroupFiles, FileTarget
from tests.factory import GI as GIB

T = TypeVar("T")

V1_UNLIMITED_MEMORY = "9223372036854771712"

AUTO = CgroupDriver.AUTO
CGROUPFS = CgroupDriver.CGROUPFS
SYSTEMD = CgroupDriver.SYSTEMD

BE_CGROUPFS = "/kubepods/besteffort/pod1234-5678"
BE_SYSTEMD = "kubepods-besteffort-pod1234_5678.slice"
BE_SYSTEMD_DIR = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_5678.slice"

# What a fresh pod cgroup holds before the plugin touches it.
V1_CPU_FILES = {"cpu.shares": "1024\n", "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}
V1_MEMORY_FILES = {"memory.limit_in_bytes": V1_UNLIMITED_MEMORY + "\n"}
V2_FILES = {"cpu.weight": "100\n", "cpu.max": "max 100000\n", "memory.max": "max\n"}

BATCH = CgroupValues(cpu_shares=512, cpu_quota=50000, memory_limit=GIB)
UNLIMITED_VALUES = CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def _fill(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content)


def make_v1(root: Path, pod: str, *, cpu_hierarchy: str = "cpu") -> None:
    """A v1 tree; with cpu_hierarchy="cpu,cpuacct", `cpu` is a symlink to it as on most distros."""
    _fill(root / cpu_hierarchy / pod, V1_CPU_FILES)
    _fill(root / "memory" / pod, V1_MEMORY_FILES)
    if cpu_hierarchy != "cpu":
        (root / "cpu").symlink_to(cpu_hierarchy)


def make_v2(root: Path, pod: str) -> None:
    _fill(root, {"cgroup.controllers": "cpuset cpu io memory pids\n"})
    _fill(root / pod, V2_FILES)


def make_tree(root: Path, version: CgroupVersion, pod: str) -> None:
    if version is CgroupVersion.V1:
        make_v1(root, pod)
    else:
        make_v2(root, pod)


def snapshot(base: Path) -> dict[str, str]:
    """Every regular file under base and its content, symlinks not followed."""
    found = {}
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            path = Path(dirpath, name)
            if not path.is_symlink():
                found[str(path.relative_to(base))] = path.read_text()
    return found


def report_paths(report: WriteReport) -> list[Path]:
    return [
        *(w.path for w in report.written),
        *(u.path for u in report.unchanged),
        *(f.path for f in report.failed),
    ]


# --- version detection -------------------------------------------------------


def test_detect_version(tmp_path: Path) -> None:
    assert detect_version(tmp_path) is CgroupVersion.V1
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert detect_version(tmp_path) is CgroupVersion.V2


# --- v1 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "parent",
    [BE_CGROUPFS, "/kubepods/burstable/podabc", "/kubepods/podabc", "kubepods/podabc"],
)
def test_v1_cgroupfs_writes_exact_contents(tmp_path: Path, parent: str) -> None:
    pod = parent.lstrip("/")
    make_v1(tmp_path, pod)

    report = apply_values(tmp_path, CgroupLocation(AUTO, parent), BATCH)

    cpu, memory = tmp_path / "cpu" / pod, tmp_path / "memory" / pod
    assert (cpu / "cpu.shares").read_text() == "512"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (memory / "memory.limit_in_bytes").read_text() == "1073741824"
    # The period is never touched.
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000\n"
    assert report == WriteReport(
        version=CgroupVersion.V1,
        written=(
            FileWrite(cpu / "cpu.shares", old="1024", new="512"),
            FileWrite(cpu / "cpu.cfs_quota_us", old="-1", new="50000"),
            FileWrite(memory / "memory.limit_in_bytes", old=V1_UNLIMITED_MEMORY, new="1073741824"),
        ),
        unchanged=(),
        failed=(),
    )
    assert report.ok


def test_v1_systemd_parent(tmp_path: Path) -> None:
    make_v1(tmp_path, BE_SYSTEMD_DIR)

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH)

    assert report.ok
    assert (tmp_path / "cpu" / BE_SYSTEMD_DIR / "cpu.shares").read_text() == "512"
    assert (tmp_path / "memory" / BE_SYSTEMD_DIR / "memory.limit_in_bytes").read_text() == str(GIB)


def test_v1_unlimited_is_written_as_minus_one(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(tmp_path, pod)
    _fill(tmp_path / "cpu" / pod, {"cpu.cfs_quota_us": "200000\n"})
    _fill(tmp_path / "memory" / pod, {"memory.limit_in_bytes": "1073741824\n"})

    report = apply_values(tmp_path, CgroupLocation(CGROUPFS, BE_CGROUPFS), UNLIMITED_VALUES)

    assert (tmp_path / "cpu" / pod / "cpu.cfs_quota_us").read_text() == "-1"
    assert (tmp_path / "memory" / pod / "memory.limit_in_bytes").read_text() == "-1"
    assert [(w.path.name, w.old, w.new) for w in report.written] == [
        ("cpu.shares", "1024", "2"),
        ("cpu.cfs_quota_us", "200000", "-1"),
        ("memory.limit_in_bytes", "1073741824", "-1"),
    ]


def test_v1_unchanged_values_are_not_rewritten(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(tmp_path, pod)
    memory_file = tmp_path / "memory" / pod / "memory.limit_in_bytes"
    values = CgroupValues(cpu_shares=1024, cpu_quota=50000, memory_limit=UNLIMITED)

    report = apply_values(tmp_path, CgroupLocation(CGROUPFS, BE_CGROUPFS), values)

    cpu = tmp_path / "cpu" / pod
    assert report.written == (FileWrite(cpu / "cpu.cfs_quota_us", old="-1", new="50000"),)
    # The kernel's read-back of "unlimited" counts as equal to -1.
    assert report.unchanged == (
        FileUnchanged(cpu / "cpu.shares", "1024"),
        FileUnchanged(memory_file, V1_UNLIMITED_MEMORY),
    )
    assert (cpu / "cpu.shares").read_text() == "1024\n"
    assert memory_file.read_text() == V1_UNLIMITED_MEMORY + "\n"


def test_second_apply_changes_nothing(tmp_path: Path) -> None:
    make_v1(tmp_path, BE_CGROUPFS.lstrip("/"))
    apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)
    before = snapshot(tmp_path)

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert report.written == () and report.failed == ()
    assert [u.value for u in report.unchanged] == ["512", "50000", "1073741824"]
    assert snapshot(tmp_path) == before


def test_v1_cpu_symlinked_to_cpu_cpuacct(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(tmp_path, pod, cpu_hierarchy="cpu,cpuacct")

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    real_cpu = tmp_path / "cpu,cpuacct" / pod
    assert report.ok
    assert (real_cpu / "cpu.shares").read_text() == "512"
    assert (real_cpu / "cpu.cfs_quota_us").read_text() == "50000"
    # Reported under the resolved path.
    assert report.written[0].path == real_cpu / "cpu.shares"


def test_root_given_through_a_symlink(tmp_path: Path) -> None:
    real_root = tmp_path / "real"
    make_v1(real_root, BE_CGROUPFS.lstrip("/"))
    (tmp_path / "link").symlink_to(real_root)

    report = apply_values(tmp_path / "link", CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert report.ok
    assert all(p.is_relative_to(real_root) for p in report_paths(report))


# --- v2 ----------------------------------------------------------------------


def test_v2_systemd_writes_exact_contents(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    values = CgroupValues(cpu_shares=1024, cpu_quota=50000, memory_limit=GIB)

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), values)

    pod = tmp_path / BE_SYSTEMD_DIR
    assert (pod / "cpu.weight").read_text() == "39"
    assert (pod / "cpu.max").read_text() == "50000"
    assert (pod / "memory.max").read_text() == "1073741824"
    assert report == WriteReport(
        version=CgroupVersion.V2,
        written=(
            FileWrite(pod / "cpu.weight", old="100", new="39"),
            FileWrite(pod / "cpu.max", old="max 100000", new="50000"),
            FileWrite(pod / "memory.max", old="max", new="1073741824"),
        ),
        unchanged=(),
        failed=(),
    )


def test_v2_cgroupfs_parent(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_CGROUPFS.lstrip("/"))

    report = apply_values(tmp_path, CgroupLocation(CGROUPFS, BE_CGROUPFS), BATCH)

    assert report.ok
    assert (tmp_path / BE_CGROUPFS.lstrip("/") / "cpu.weight").read_text() == "20"


def test_v2_unlimited_is_written_as_max(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    pod = tmp_path / BE_SYSTEMD_DIR
    _fill(pod, {"cpu.max": "50000 100000\n", "memory.max": "1073741824\n"})

    report = apply_values(tmp_path, CgroupLocation(SYSTEMD, BE_SYSTEMD), UNLIMITED_VALUES)

    assert (pod / "cpu.max").read_text() == "max"
    assert (pod / "memory.max").read_text() == "max"
    assert [(w.path.name, w.old, w.new) for w in report.written] == [
        ("cpu.weight", "100", "1"),
        ("cpu.max", "50000 100000", "max"),
        ("memory.max", "1073741824", "max"),
    ]


def test_v2_unlimited_already_in_place_is_skipped(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)

    report = apply_values(tmp_path, CgroupLocation(SYSTEMD, BE_SYSTEMD), UNLIMITED_VALUES)

    assert [w.path.name for w in report.written] == ["cpu.weight"]
    assert [(u.path.name, u.value) for u in report.unchanged] == [
        ("cpu.max", "max 100000"),
        ("memory.max", "max"),
    ]


@pytest.mark.parametrize(("shares", "weight"), [(2, "1"), (1024, "39"), (262144, "10000")])
def test_v2_shares_become_weight(tmp_path: Path, shares: int, weight: str) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    values = CgroupValues(cpu_shares=shares, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)

    apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), values)

    assert (tmp_path / BE_SYSTEMD_DIR / "cpu.weight").read_text() == weight


# --- reading back --------------------------------------------------------------


def test_read_pod_values_v1(tmp_path: Path) -> None:
    make_v1(tmp_path, BE_CGROUPFS.lstrip("/"))
    assert read_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS)) == CgroupReading(
        cpu_shares=1024, cpu_weight=None, cpu_quota=UNLIMITED, memory_limit=UNLIMITED
    )
    apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)
    assert read_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS)) == CgroupReading(
        cpu_shares=512, cpu_weight=None, cpu_quota=50000, memory_limit=GIB
    )


def test_read_pod_values_v2(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    assert read_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD)) == CgroupReading(
        cpu_shares=None, cpu_weight=100, cpu_quota=UNLIMITED, memory_limit=UNLIMITED
    )
    apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH)
    assert read_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD)) == CgroupReading(
        cpu_shares=None, cpu_weight=20, cpu_quota=50000, memory_limit=GIB
    )


def test_read_pod_values_of_missing_pod_raises(tmp_path: Path) -> None:
    make_v1(tmp_path, "kubepods")
    with pytest.raises(FileNotFoundError):
        read_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS))


def test_a_missing_cgroup_leaves_no_garbage_for_the_collector(tmp_path: Path) -> None:
    """A container gone before its read (every poll of a node's removed pods): freed at once.

    An error kept with its traceback would hold the frames that hold it, a
    cycle left for the garbage collector each time, and its pauses grow with them.
    """
    make_v1(tmp_path, "kubepods")
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            with pytest.raises(FileNotFoundError) as raised:
                read_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS))
            del raised
        gc.collect()
        left = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


def test_read_pod_values_of_garbage_raises(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    _fill(tmp_path / BE_SYSTEMD_DIR, {"memory.max": "lots\n"})
    with pytest.raises(ValueError, match=r"memory\.max"):
        read_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD))


# --- failures are reported, not raised ------------------------------------------


def test_missing_pod_dir_is_reported_and_not_created(tmp_path: Path) -> None:
    _fill(tmp_path / "cpu" / "kubepods" / "besteffort", {})
    _fill(tmp_path / "memory" / "kubepods" / "besteffort", {})
    before = snapshot(tmp_path)

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert not report.ok
    assert report.written == () and report.unchanged == ()
    assert [(f.path.name, f.operation, f.errno) for f in report.failed] == [
        ("cpu.shares", "read", errno.ENOENT),
        ("cpu.cfs_quota_us", "read", errno.ENOENT),
        ("memory.limit_in_bytes", "read", errno.ENOENT),
    ]
    assert report.failed[0].error == "ENOENT: No such file or directory"
    assert not (tmp_path / "cpu" / BE_CGROUPFS.lstrip("/")).exists()
    assert not (tmp_path / "memory" / BE_CGROUPFS.lstrip("/")).exists()
    assert snapshot(tmp_path) == before


def test_missing_memory_hierarchy_does_not_stop_cpu_writes(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    _fill(tmp_path / "cpu" / pod, V1_CPU_FILES)

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert [w.path.name for w in report.written] == ["cpu.shares", "cpu.cfs_quota_us"]
    assert report.failed == (
        FileFailure(
            tmp_path / "memory" / pod / "memory.limit_in_bytes",
            "read",
            errno.ENOENT,
            "ENOENT: No such file or directory",
        ),
    )
    assert not (tmp_path / "memory").exists()


class KernelRefusesQuota(CgroupFiles):
    """What v1 answers when a child's quota is above the new pod quota."""

    def write_file(self, target: FileTarget, text: str) -> None:
        if target.path.name == "cpu.cfs_quota_us":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        super().write_file(target, text)


def test_write_failure_is_reported_and_later_files_still_written(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(tmp_path, pod)

    files = KernelRefusesQuota()
    report = files.apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert [w.path.name for w in report.written] == ["cpu.shares", "memory.limit_in_bytes"]
    assert report.failed == (
        FileFailure(
            tmp_path / "cpu" / pod / "cpu.cfs_quota_us",
            "write",
            errno.EINVAL,
            "EINVAL: Invalid argument",
        ),
    )
    assert (tmp_path / "cpu" / pod / "cpu.cfs_quota_us").read_text() == "-1\n"


def test_unparseable_old_value_is_overwritten(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    _fill(tmp_path / BE_SYSTEMD_DIR, {"cpu.weight": "\n"})

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH)

    assert report.written[0] == FileWrite(tmp_path / BE_SYSTEMD_DIR / "cpu.weight", "", "20")


# --- refusals -----------------------------------------------------------------


@pytest.mark.parametrize(
    "parent", ["../../etc", "/kubepods/../../x", "/kubepods/..", "/", "-.slice", "a\x00b"]
)
@pytest.mark.parametrize("version", list(CgroupVersion))
def test_refuses_escaping_parents_without_touching_anything(
    tmp_path: Path, parent: str, version: CgroupVersion
) -> None:
    root = tmp_path / "root"
    make_tree(root, version, BE_CGROUPFS.lstrip("/"))
    _fill(tmp_path / "etc", V1_CPU_FILES | V1_MEMORY_FILES | V2_FILES)
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError) as info:
        apply_values(root, CgroupLocation(AUTO, parent), BATCH)

    assert repr(parent) in str(info.value)
    assert snapshot(tmp_path) == before


def _outside_with_cgroup_files(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    _fill(outside, V1_CPU_FILES | V1_MEMORY_FILES | V2_FILES)
    return outside


def test_refuses_pod_dir_symlinked_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_v1(root, "kubepods/besteffort")
    outside = _outside_with_cgroup_files(tmp_path)
    (root / "cpu" / BE_CGROUPFS.lstrip("/")).symlink_to(outside)
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError, match="pod1234-5678"):
        apply_values(root, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)
    with pytest.raises(CgroupPathError):
        read_values(root, CgroupLocation(AUTO, BE_CGROUPFS))

    assert snapshot(tmp_path) == before


def test_refuses_intermediate_dir_symlinked_outside_root_on_v2(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_v2(root, "placeholder")
    outside = _outside_with_cgroup_files(tmp_path)
    _fill(
        outside / "kubepods-besteffort.slice" / "kubepods-besteffort-pod1234_5678.slice", V2_FILES
    )
    (root / "kubepods.slice").symlink_to(outside)
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError, match=BE_SYSTEMD):
        apply_values(root, CgroupLocation(AUTO, BE_SYSTEMD), BATCH)

    assert snapshot(tmp_path) == before


def test_refuses_v1_hierarchy_symlinked_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_v1(root, "placeholder")
    outside = _outside_with_cgroup_files(tmp_path)
    _fill(outside / BE_CGROUPFS.lstrip("/"), V1_CPU_FILES)
    (root / "cpu").rename(root / "cpu.orig")
    (root / "cpu").symlink_to(outside)
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError, match="cpu hierarchy"):
        apply_values(root, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    assert snapshot(tmp_path) == before


def test_refuses_cgroup_file_symlinked_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(root, pod)
    outside = _outside_with_cgroup_files(tmp_path)
    (root / "memory" / pod / "memory.limit_in_bytes").unlink()
    (root / "memory" / pod / "memory.limit_in_bytes").symlink_to(outside / "memory.limit_in_bytes")
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError, match="symlink"):
        apply_values(root, CgroupLocation(AUTO, BE_CGROUPFS), BATCH)

    # Refused before any write, including the cpu files that were fine.
    assert snapshot(tmp_path) == before


def test_refuses_parent_resolving_to_a_hierarchy_top(tmp_path: Path) -> None:
    # Writing there would change the root cgroup's own values.
    make_v1(tmp_path, "kubepods")
    (tmp_path / "cpu" / "kubepods" / "pod1").symlink_to("..")
    (tmp_path / "memory" / "kubepods" / "pod1").symlink_to("..")
    _fill(tmp_path / "cpu", V1_CPU_FILES)
    before = snapshot(tmp_path)

    with pytest.raises(CgroupPathError, match="not below"):
        apply_values(tmp_path, CgroupLocation(AUTO, "/kubepods/pod1"), BATCH)

    assert snapshot(tmp_path) == before


def test_symlink_that_stays_inside_root_is_followed(tmp_path: Path) -> None:
    make_v2(tmp_path, "real/pod1")
    (tmp_path / "kubepods").symlink_to("real")

    report = apply_values(tmp_path, CgroupLocation(AUTO, "/kubepods/pod1"), BATCH)

    assert report.ok
    assert report.written[0].path == tmp_path / "real" / "pod1" / "cpu.weight"


# --- directories ----------------------------------------------------------------


def test_container_values_v1_cgroupfs(tmp_path: Path) -> None:
    pod = BE_CGROUPFS.lstrip("/")
    make_v1(tmp_path, f"{pod}/abc123")
    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_CGROUPFS, "abc123"), BATCH)
    assert report.ok
    assert (tmp_path / "cpu" / pod / "abc123" / "cpu.cfs_quota_us").read_text() == "50000"
    assert (tmp_path / "memory" / pod / "abc123" / "memory.limit_in_bytes").read_text() == str(GIB)


def test_container_values_v2_systemd_containerd_naming(tmp_path: Path) -> None:
    make_v2(tmp_path, f"{BE_SYSTEMD_DIR}/cri-containerd-abc123.scope")
    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD, "abc123"), BATCH)
    assert report.ok
    scope = tmp_path / BE_SYSTEMD_DIR / "cri-containerd-abc123.scope"
    assert (scope / "cpu.max").read_text() == "50000"


@pytest.mark.parametrize(
    ("cgroups_path", "directory"),
    [
        # CRI-O with systemd: runc's slice:prefix:name.
        (f"{BE_SYSTEMD}:crio:abc123", f"{BE_SYSTEMD_DIR}/crio-abc123.scope"),
        (f"{BE_SYSTEMD}::abc123", f"{BE_SYSTEMD_DIR}/abc123.scope"),
        # cgroupfs: a path from the root, whatever the runtime called the leaf.
        (f"{BE_CGROUPFS}/crio-abc123", f"{BE_CGROUPFS.lstrip('/')}/crio-abc123"),
    ],
)
def test_container_values_follow_the_runtimes_own_cgroups_path(
    tmp_path: Path, cgroups_path: str, directory: str
) -> None:
    make_v2(tmp_path, directory)
    report = apply_values(
        tmp_path, CgroupLocation(AUTO, BE_SYSTEMD, "abc123", cgroups_path=cgroups_path), BATCH
    )
    assert report.ok
    assert (tmp_path / directory / "cpu.max").read_text() == "50000"


@pytest.mark.parametrize(
    "cgroups_path",
    ["/kubepods/../../etc", f"{BE_SYSTEMD}:crio:..", f"{BE_SYSTEMD}:crio:a/b", "a:b", "x:y:z:w"],
)
def test_container_values_refuse_bad_runtime_paths(tmp_path: Path, cgroups_path: str) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    before = snapshot(tmp_path)
    with pytest.raises(CgroupPathError):
        apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD, "abc123", cgroups_path), BATCH)
    assert snapshot(tmp_path) == before


def test_container_values_refuse_escapes(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    with pytest.raises(CgroupPathError):
        apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD, ".."), BATCH)
    (tmp_path / BE_SYSTEMD_DIR / "cri-containerd-evil.scope").symlink_to(tmp_path.parent)
    with pytest.raises(CgroupPathError):
        apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD, "evil"), BATCH)


# --- property: nothing outside the root is ever written ---------------------------

_SEGMENTS = st.sampled_from(
    [
        "kubepods",
        "besteffort",
        "pod1",
        "kubepods.slice",
        "kubepods-besteffort.slice",
        "kubepods-besteffort-pod1.slice",
        "escape",
        "escape.slice",
        "cpu",
        "memory",
        "..",
        ".",
        "",
        "-",
        "-.slice",
    ]
)
_PARENTS = st.one_of(
    st.text(),
    # Real pod parents and parents through an escape symlink, so that many
    # examples do write and many try to leave.
    st.sampled_from(
        [
            "/kubepods/besteffort/pod1",
            "kubepods/besteffort/pod1",
            "kubepods-besteffort-pod1.slice",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
            "/escape",
            "/kubepods/escape",
            "/kubepods/besteffort/podescape",
            "escape.slice",
            "/kubepods.slice/escape.slice",
            "kubepods-besteffort-podescape.slice",
        ]
    ),
    st.lists(_SEGMENTS, max_size=6).map("/".join),
    st.lists(_SEGMENTS, max_size=4).map("-".join),
    st.lists(st.sampled_from(["kubepods", "besteffort", "pod1", "escape", ""]), max_size=4).map(
        lambda parts: "-".join(parts) + ".slice"
    ),
)


def _tree_with_escape_hatches(base: Path, version: CgroupVersion) -> Path:
    """A cgroup root whose pod dirs exist, plus `escape` symlinks to a directory outside it."""
    root = base / "root"
    outside = _outside_with_cgroup_files(base)
    make_tree(root, version, "kubepods/besteffort/pod1")
    make_tree(root, version, "kubepods-besteffort-pod1.slice")
    make_tree(
        root, version, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice"
    )
    hierarchies = [root] if version is CgroupVersion.V2 else [root / "cpu", root / "memory"]
    for hierarchy in hierarchies:
        for link in (
            "escape",
            "escape.slice",
            "kubepods/escape",
            "kubepods/besteffort/podescape",
            "kubepods.slice/escape.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podescape.slice",
        ):
            (hierarchy / link).symlink_to(outside)
    return root


@settings(max_examples=300, deadline=None)
@given(
    parent=_PARENTS,
    driver=st.sampled_from(list(CgroupDriver)),
    version=st.sampled_from(list(CgroupVersion)),
)
def test_writes_only_inside_root_or_refuses(
    parent: str, driver: CgroupDriver, version: CgroupVersion
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = _tree_with_escape_hatches(base, version)
        real_root = Path(os.path.realpath(root))
        outside_before = snapshot(base / "outside")
        try:
            report = apply_values(root, CgroupLocation(driver, parent), BATCH)
        except CgroupPathError:
            pass
        else:
            for path in report_paths(report):
                assert path.is_relative_to(real_root) and path.parent != real_root
        assert snapshot(base / "outside") == outside_before


# --- special files in the tree ----------------------------------------------------


def _in_thread(work: Callable[[], T]) -> T:
    """Run `work` in a thread: a blocked open fails the test instead of hanging it."""
    outcome: list[T] = []
    raised: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(work())
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=60)  # only separates "returned" from "blocked forever"
    assert not thread.is_alive(), "blocked on a special file"
    if raised:
        raise raised[0]
    (result,) = outcome
    return result


def test_a_fifo_in_place_of_a_cgroup_file_is_reported_without_blocking(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    fifo = tmp_path / BE_SYSTEMD_DIR / "cpu.max"
    fifo.unlink()
    os.mkfifo(fifo)

    report = _in_thread(lambda: apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH))

    assert [w.path.name for w in report.written] == ["cpu.weight", "memory.max"]
    assert [(f.path.name, f.operation, f.errno) for f in report.failed] == [
        ("cpu.max", "read", errno.EINVAL)
    ]
    assert "not a regular file" in report.failed[0].error
    with pytest.raises(OSError, match="not a regular file"):
        _in_thread(lambda: read_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD)))


def test_a_device_in_place_of_a_cgroup_file_is_not_read(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    device = tmp_path / BE_SYSTEMD_DIR / "memory.max"
    device.unlink()
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: never ends

    report = _in_thread(lambda: apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH))

    assert [(f.path.name, f.operation, f.errno) for f in report.failed] == [
        ("memory.max", "read", errno.EINVAL)
    ]


def test_a_file_longer_than_the_read_bound_is_refused_not_overwritten(tmp_path: Path) -> None:
    make_v2(tmp_path, BE_SYSTEMD_DIR)
    long_file = tmp_path / BE_SYSTEMD_DIR / "cpu.weight"
    long_file.write_text("1" * (cgroup_fs.MAX_FILE_BYTES + 1))

    report = apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH)

    assert [(f.path.name, f.operation, f.errno) for f in report.failed] == [
        ("cpu.weight", "read", errno.EFBIG)
    ]
    assert long_file.read_text() == "1" * (cgroup_fs.MAX_FILE_BYTES + 1)
    # At the bound it is read (and, not being a value, overwritten).
    long_file.write_text(" " * (cgroup_fs.MAX_FILE_BYTES - 1) + "7")
    assert apply_values(tmp_path, CgroupLocation(AUTO, BE_SYSTEMD), BATCH).ok


# --- a directory swapped for a symlink while the plugin writes ------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): swap two names atomically."""
    if _libc.renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_a_pod_dir_swapped_for_a_symlink_never_leads_a_write_outside(
    tmp_path: Path, version: CgroupVersion
) -> None:
    root = tmp_path / "root"
    outside = _outside_with_cgroup_files(tmp_path)
    make_tree(root, version, "kubepods/besteffort/pod1")
    hierarchies = [root] if version is CgroupVersion.V2 else [root / "cpu", root / "memory"]
    pairs = []
    for hierarchy in hierarchies:
        pod_dir = hierarchy / "kubepods" / "besteffort" / "pod1"
        decoy = hierarchy / "kubepods" / "besteffort" / "decoy"
        decoy.symlink_to(outside)
        pairs.append((pod_dir, decoy))
    outside_before = snapshot(outside)
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            for pod_dir, decoy in pairs:
                _exchange(pod_dir, decoy)
            swaps += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        # Alternate values so that every request has something to write.
        for request in range(400):
            values = BATCH if request % 2 else UNLIMITED_VALUES
            with contextlib.suppress(CgroupPathError):  # resolved while it was the symlink
                apply_values(root, CgroupLocation(AUTO, "/kubepods/besteffort/pod1"), values)
    finally:
        stop.set()
        thread.join()
    assert swaps > 0
    assert snapshot(outside) == outside_before


@pytest.mark.parametrize("version", list(CgroupVersion))
@pytest.mark.parametrize(
    ("driver", "parent"),
    [
        (CGROUPFS, "/system.slice"),
        (CGROUPFS, "/system.slice/sshd.service"),
        (CGROUPFS, "/user.slice/user-1000.slice/session-1.scope"),
        (CGROUPFS, "/kubepods/besteffort"),
        (AUTO, "system.slice"),
        (SYSTEMD, "/init.scope"),
        (SYSTEMD, "kubepods-besteffort.slice"),
    ],
)
def test_node_cgroups_outside_kubepods_are_left_as_they_are(
    tmp_path: Path, version: CgroupVersion, driver: CgroupDriver, parent: str
) -> None:
    # Issue 24: the node's own cgroups, named as a pod's parent, got its values.
    make_tree(tmp_path, version, parent.strip("/") if "/" in parent else parent)
    make_tree(tmp_path, version, "kubepods.slice/kubepods-besteffort.slice")
    before = snapshot(tmp_path)
    with pytest.raises(CgroupPathError, match="not a pod cgroup of kubelet's"):
        apply_values(tmp_path, CgroupLocation(driver, parent), BATCH)
    with pytest.raises(CgroupPathError, match="not a pod cgroup of kubelet's"):
        apply_values(tmp_path, CgroupLocation(driver, parent, "abc123"), BATCH)
    assert snapshot(tmp_path) == before
