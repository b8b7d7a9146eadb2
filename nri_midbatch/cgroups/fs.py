"""The cgroup file I/O: version detection, confined path resolution, reads and writes.

Everything here is synchronous and touches only tiny pseudo-files, so the
async glue can run any of it in a thread. Nothing here creates a file or a
directory: the runtime creates pod cgroups, and a missing one is reported.
"""

import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from nri_midbatch.cgroups.files import (
    CgroupFile,
    CgroupVersion,
    Controller,
    needs_write,
    parse_value,
    pod_files,
    pod_settings,
)
from nri_midbatch.cgroups.paths import (
    CgroupDriver,
    CgroupPathError,
    container_relpath,
    pod_relpath,
)
from nri_midbatch.cgroups.report import FileFailure, FileUnchanged, FileWrite, WriteReport
from nri_midbatch.cgroups.values import PodCgroupReading, PodCgroupValues

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")

# O_NOFOLLOW closes the gap between resolving a path and opening it for the
# last component; no O_CREAT, so a missing file fails instead of appearing.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_TRUNC is a no-op on cgroupfs (as with `echo v > file`) and keeps plain
# files (test trees) holding exactly the value written.
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def detect_version(root: Path) -> CgroupVersion:
    """v2 if the root is a unified hierarchy, else v1 with one directory per controller."""
    if (root / "cgroup.controllers").exists():
        return CgroupVersion.V2
    return CgroupVersion.V1


def apply_pod_values(
    root: Path, driver: CgroupDriver, cgroup_parent: str, values: PodCgroupValues
) -> WriteReport:
    """Write the pod's cpu shares (or weight), CFS quota and memory limit.

    Raises CgroupPathError, before touching any file, if any target path is
    refused. Read and write errors do not raise: each file is attempted and
    its outcome (written with old and new text, unchanged, or failed with the
    errno) goes into the report.
    """
    return _apply(root, pod_relpath(driver, cgroup_parent), cgroup_parent, values)


def apply_container_values(
    root: Path,
    driver: CgroupDriver,
    cgroup_parent: str,
    container_id: str,
    values: PodCgroupValues,
    cgroups_path: str = "",
    runtime: str = "",
) -> WriteReport:
    """The same three files in a container's cgroup, for runtimes we cannot ask to update.

    Used when a new configuration must reach running containers and the
    runtime's UpdateContainers is unsafe; confined and reported like pods.
    `cgroups_path` is the runtime's own path for the container, when known;
    else the path follows the naming of `runtime` (its name from Configure).
    """
    relpath = container_relpath(driver, cgroup_parent, container_id, cgroups_path, runtime)
    return _apply(root, relpath, cgroups_path or cgroup_parent, values)


def _apply(
    root: Path, relpath: PurePosixPath, cgroup_parent: str, values: PodCgroupValues
) -> WriteReport:
    version = detect_version(root)
    settings = pod_settings(version, values)
    paths = _file_paths(root, version, relpath, cgroup_parent, [s.file for s in settings])
    written: list[FileWrite] = []
    unchanged: list[FileUnchanged] = []
    failed: list[FileFailure] = []
    for setting, path in zip(settings, paths, strict=True):
        try:
            old = _read(path)
        except OSError as exc:
            failed.append(FileFailure.from_os_error(path, "read", exc))
            continue
        if not needs_write(setting, old):
            unchanged.append(FileUnchanged(path, old))
            continue
        try:
            _write(path, setting.text)
        except OSError as exc:
            failed.append(FileFailure.from_os_error(path, "write", exc))
            continue
        written.append(FileWrite(path, old, setting.text))
    return WriteReport(version, tuple(written), tuple(unchanged), tuple(failed))


def read_pod_values(root: Path, driver: CgroupDriver, cgroup_parent: str) -> PodCgroupReading:
    """The pod cgroup's current cpu shares (v1) or weight (v2), quota and memory limit.

    Raises CgroupPathError for a refused path, OSError if a file cannot be
    read and ValueError if its content is not a cgroup value.
    """
    return _read_values(root, pod_relpath(driver, cgroup_parent), cgroup_parent)


def read_container_values(
    root: Path, driver: CgroupDriver, cgroup_parent: str, container_id: str, cgroups_path: str = ""
) -> PodCgroupReading:
    """The same three values in a container's cgroup (found as apply_container_values does).

    Raises as read_pod_values does; FileNotFoundError once the container is gone.
    """
    relpath = container_relpath(driver, cgroup_parent, container_id, cgroups_path)
    return _read_values(root, relpath, cgroups_path or cgroup_parent)


def _read_values(root: Path, relpath: PurePosixPath, cgroup_parent: str) -> PodCgroupReading:
    version = detect_version(root)
    files = pod_files(version)
    paths = _file_paths(root, version, relpath, cgroup_parent, files)
    cpu, quota, memory = (
        parse_value(file, _read(path)) for file, path in zip(files, paths, strict=True)
    )
    v1 = version is CgroupVersion.V1
    return PodCgroupReading(
        cpu_shares=cpu if v1 else None,
        cpu_weight=None if v1 else cpu,
        cpu_quota=quota,
        memory_limit=memory,
    )


def _file_paths(
    root: Path,
    version: CgroupVersion,
    relpath: PurePosixPath,
    cgroup_parent: str,
    files: Sequence[CgroupFile],
) -> list[Path]:
    # Every path is resolved before any file is opened, so a refusal leaves
    # the tree exactly as it was. Files of one controller share a directory,
    # resolved once (on v2, all three do).
    paths = []
    directories: dict[str, Path] = {}
    for file in files:
        directory = directories.get(file.controller)
        if directory is None:
            directory = _confined_dir(root, version, file.controller, relpath, cgroup_parent)
            directories[file.controller] = directory
        path = directory / file.name
        # The names are fixed, so a differing real path means the file itself
        # is a symlink, which no cgroup file is. The directory is a real path
        # already, so only a file that is a link can resolve elsewhere: one
        # lstat spares resolving the whole path again for every other file.
        if _is_link(path) and Path(os.path.realpath(path)) != path:
            raise CgroupPathError(f"cgroup parent {cgroup_parent!r}: {path} is a symlink")
        paths.append(path)
    return paths


def _confined_dir(
    root: Path,
    version: CgroupVersion,
    controller: Controller,
    relpath: PurePosixPath,
    cgroup_parent: str,
) -> Path:
    real_root = Path(os.path.realpath(root))
    if version is CgroupVersion.V2:
        hierarchy = real_root
    else:
        # On v1, `cpu` is often a symlink to `cpu,cpuacct`; following it is
        # fine as long as the hierarchy stays inside the root.
        hierarchy = Path(os.path.realpath(real_root / controller))
        if not _strictly_inside(hierarchy, real_root):
            raise CgroupPathError(
                f"cgroup parent {cgroup_parent!r}: {controller} hierarchy {hierarchy} "
                f"is outside {real_root}"
            )
    # Strictly below the hierarchy, not merely the root: a parent resolving to
    # a hierarchy's top would rewrite the root cgroup's own files.
    directory = Path(os.path.realpath(hierarchy / relpath))
    if not _strictly_inside(directory, hierarchy):
        raise CgroupPathError(
            f"cgroup parent {cgroup_parent!r} resolves to {directory}, not below {hierarchy}"
        )
    return directory


def _is_link(path: Path) -> bool:
    """Whether `path` is a symlink; one that cannot be examined is not (as realpath has it)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _strictly_inside(path: Path, base: Path) -> bool:
    return path != base and path.is_relative_to(base)


def _read(path: Path) -> str:
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8", errors="replace").strip()


def _write(path: Path, text: str) -> None:
    fd = os.open(path, _WRITE_FLAGS)
    try:
        # One write(2): the kernel parses each write as a whole value.
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
