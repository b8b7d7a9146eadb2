"""The cgroup file I/O: version detection, confined path resolution, reads and writes.

Everything here is synchronous and touches only tiny pseudo-files, so the
async callers can run any of it in a thread. Nothing here creates a file or a
directory: the runtime creates pod cgroups, and a missing one is reported.
"""

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
from nri_midbatch.cgroups.paths import CgroupLocation, CgroupPathError
from nri_midbatch.cgroups.report import FileFailure, FileUnchanged, FileWrite, WriteReport
from nri_midbatch.cgroups.values import CgroupReading, CgroupValues

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")

# Files are opened relative to their directory's descriptor, never by path,
# and O_NOFOLLOW refuses a file swapped for a symlink; no O_CREAT, so a
# missing file fails instead of appearing. O_NONBLOCK: a FIFO planted in
# place of a cgroup file must not block the open (it is then refused as not
# a regular file; every cgroupfs interface file is one).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# O_TRUNC is a no-op on cgroupfs (as with `echo v > file`) and keeps plain
# files (test trees) holding exactly the value written.
_WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Each directory from the root down is opened relative to the one above it,
# refusing symlinks: a directory swapped for a symlink after the path was
# checked (renameat2 RENAME_EXCHANGE) fails the open instead of leading out.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The most read from one cgroup file: the ones read here hold one line of a few
#: dozen bytes, so anything longer (a device planted in the tree) is refused.
MAX_FILE_BYTES = 4096


def detect_version(root: Path) -> CgroupVersion:
    """v2 if the root is a unified hierarchy, else v1 with one directory per controller."""
    if (root / "cgroup.controllers").exists():
        return CgroupVersion.V2
    return CgroupVersion.V1


def apply_values(
    root: Path,
    location: CgroupLocation,
    values: CgroupValues,
    write: Callable[["FileTarget", str], None] | None = None,
) -> WriteReport:
    """Write the cgroup's cpu shares (or weight), CFS quota and memory limit.

    Pods' because NRI cannot adjust a pod sandbox; containers' when a new configuration
    must reach them and the runtime's UpdateContainers is unsafe.

    Raises CgroupPathError, before touching any file, if any target path is
    refused. Read and write errors do not raise: each file is attempted and
    its outcome (written with old and new text, unchanged, or failed with the
    errno) goes into the report. `write` writes one file: `CgroupFiles.apply_values` passes
    its `write_file`; None is the plain write.
    """
    write_file = _write if write is None else write
    relpath, named = location.relpath(), location.named
    version = detect_version(root)
    settings = pod_settings(version, values)
    written: list[FileWrite] = []
    unchanged: list[FileUnchanged] = []
    failed: list[FileFailure] = []
    with _open_targets(root, version, relpath, named, [s.file for s in settings]) as targets:
        for setting, target in zip(settings, targets, strict=True):
            try:
                old = _read(target)
            except OSError as exc:
                failed.append(FileFailure.from_os_error(target.path, "read", exc))
                continue
            if not needs_write(setting, old):
                unchanged.append(FileUnchanged(target.path, old))
                continue
            try:
                write_file(target, setting.text)
            except OSError as exc:
                failed.append(FileFailure.from_os_error(target.path, "write", exc))
                continue
            written.append(FileWrite(target.path, old, setting.text))
    return WriteReport(version, tuple(written), tuple(unchanged), tuple(failed))


def read_values(root: Path, location: CgroupLocation) -> CgroupReading:
    """The cgroup's current cpu shares (v1) or weight (v2), quota and memory limit.

    Raises CgroupPathError for a refused path, OSError if a file cannot be
    read (FileNotFoundError once the cgroup is gone) and ValueError if its
    content is not a cgroup value.
    """
    return read_located(locate(root, location))


@dataclass(frozen=True, slots=True)
class LocatedFiles:
    """A cgroup's value files (`pod_files`), resolved and checked below the root.

    What `read_located` opens, as often as it is asked: each directory from `real_root`
    down by its names, one at a time and refusing a symlink, and each file refusing one,
    so whatever was renamed or swapped since, what is read is inside the root.
    """

    version: CgroupVersion
    real_root: str
    #: per file, in `pod_files` order: its directory's names below `real_root`, its name
    files: tuple[tuple[tuple[str, ...], str], ...]
    #: No symlink was met below the hierarchies: while these names open without following
    #: a link, they are what resolving the cgroup's path again would give.
    plain: bool


def locate(root: Path, location: CgroupLocation) -> LocatedFiles:
    """Resolve and check the cgroup's value files. Raises CgroupPathError for a refused path."""
    relpath, named = location.relpath(), location.named
    version = detect_version(root)
    real_root = Path(os.path.realpath(root))
    paths, plain = _file_paths(real_root, version, relpath, named, pod_files(version))
    files = tuple((path.parent.relative_to(real_root).parts, path.name) for path in paths)
    return LocatedFiles(version, str(real_root), files, plain)


class OpenDirectories:
    """Directories below real roots, each opened once for a batch of reads and held until
    `close`.

    Each is opened relative to its parent's descriptor (from the root's down), refusing a
    symlink, so what is opened is inside the root whatever is renamed or swapped meanwhile;
    cgroups side by side share their parents' descriptors. Held for a moment (one read, or
    one piece of the convergence pass): a descriptor names the directory it opened.
    """

    def __init__(self) -> None:
        self._fds: dict[tuple[str, tuple[str, ...]], int] = {}

    def open(self, real_root: str, names: tuple[str, ...]) -> int:
        """The directory `names` below `real_root` (a real path), open; the caller does not
        close it."""
        key = (real_root, names)
        fd = self._fds.get(key)
        if fd is None:
            if names:
                parent = self.open(real_root, names[:-1])
                fd = os.open(names[-1], _DIR_FLAGS, dir_fd=parent)
            else:
                fd = os.open(real_root, _DIR_FLAGS)
            self._fds[key] = fd
        return fd

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def read_located(
    located: LocatedFiles, directories: OpenDirectories | None = None
) -> CgroupReading:
    """What the located files hold now, their directories opened in `directories` (held by
    the caller) or, without, for this read alone.

    Raises OSError (FileNotFoundError once the cgroup is gone, ELOOP where a directory or a
    file became a symlink) and ValueError, as `read_values`.
    """
    opened = OpenDirectories() if directories is None else directories
    try:
        texts = [
            _read_at(opened.open(located.real_root, names), name) for names, name in located.files
        ]
    finally:
        if directories is None:
            opened.close()
    files = pod_files(located.version)
    cpu, quota, memory = (parse_value(file, text) for file, text in zip(files, texts, strict=True))
    v1 = located.version is CgroupVersion.V1
    return CgroupReading(
        cpu_shares=cpu if v1 else None,
        cpu_weight=None if v1 else cpu,
        cpu_quota=quota,
        memory_limit=memory,
    )


@dataclass(frozen=True)
class FileTarget:
    """A cgroup file about to be written: its path (for reports) and its open directory, or
    why that failed."""

    path: Path
    dir_fd: int | None
    dir_error: OSError | None

    @property
    def name(self) -> str:
        """What is opened, relative to `dir_fd`."""
        return self.path.name


@contextlib.contextmanager
def _open_targets(
    root: Path,
    version: CgroupVersion,
    relpath: PurePosixPath,
    cgroup_parent: str,
    files: Sequence[CgroupFile],
) -> Iterator[list[FileTarget]]:
    """The files' targets, their directories open until the block ends.

    Raises CgroupPathError before opening anything if a path is refused.
    """
    real_root = Path(os.path.realpath(root))
    paths, _ = _file_paths(real_root, version, relpath, cgroup_parent, files)
    directories = OpenDirectories()
    try:
        opened: dict[Path, tuple[int | None, OSError | None]] = {}
        targets = []
        for path in paths:
            directory = path.parent
            if directory not in opened:
                names = directory.relative_to(real_root).parts
                try:
                    dir_fd = directories.open(str(real_root), names)
                except OSError as exc:
                    # Kept without its traceback, which holds this frame: a
                    # cycle for the garbage collector on every missing cgroup.
                    opened[directory] = (None, exc.with_traceback(None))
                else:
                    opened[directory] = (dir_fd, None)
            targets.append(FileTarget(path, *opened[directory]))
        yield targets
    finally:
        directories.close()


def _file_paths(
    real_root: Path,
    version: CgroupVersion,
    relpath: PurePosixPath,
    cgroup_parent: str,
    files: Sequence[CgroupFile],
) -> tuple[list[Path], bool]:
    """The files' real paths, and whether no symlink was met below the hierarchies."""
    # Every path is resolved before any file is opened, so a refusal leaves
    # the tree exactly as it was. Files of one controller share a directory,
    # resolved once (on v2, all three do).
    paths = []
    plain = True
    directories: dict[str, Path] = {}
    for file in files:
        directory = directories.get(file.controller)
        if directory is None:
            directory, below = _confined_dir(
                real_root, version, file.controller, relpath, cgroup_parent
            )
            plain = plain and below
            directories[file.controller] = directory
        path = directory / file.name
        # The names are fixed, so a differing real path means the file itself
        # is a symlink, which no cgroup file is. The directory is a real path
        # already, so only a file that is a link can resolve elsewhere: one
        # lstat spares resolving the whole path again for every other file.
        if _is_link(path) and Path(os.path.realpath(path)) != path:
            raise CgroupPathError(f"cgroup parent {cgroup_parent!r}: {path} is a symlink")
        paths.append(path)
    return paths, plain


def _confined_dir(
    real_root: Path,
    version: CgroupVersion,
    controller: Controller,
    relpath: PurePosixPath,
    cgroup_parent: str,
) -> tuple[Path, bool]:
    """The cgroup's real directory in the controller's hierarchy, and whether no symlink was
    met below the hierarchy."""
    if version is CgroupVersion.V2:
        hierarchy = real_root
    else:
        # On v1, `cpu` is often a symlink to `cpu,cpuacct`; following it is
        # fine as long as the hierarchy stays inside the root.
        hierarchy = _realpath(real_root / controller, cgroup_parent)
        if not _strictly_inside(hierarchy, real_root):
            raise CgroupPathError(
                f"cgroup parent {cgroup_parent!r}: {controller} hierarchy {hierarchy} "
                f"is outside {real_root}"
            )
    # Strictly below the hierarchy, not merely the root: a parent resolving to
    # a hierarchy's top would rewrite the root cgroup's own files.
    directory, plain = _realpath_below(hierarchy, relpath, cgroup_parent)
    if not _strictly_inside(directory, hierarchy):
        raise CgroupPathError(
            f"cgroup parent {cgroup_parent!r} resolves to {directory}, not below {hierarchy}"
        )
    return directory, plain


def _realpath_below(base: Path, relpath: PurePosixPath, cgroup_parent: str) -> tuple[Path, bool]:
    """realpath(base / relpath), where `base` is a real path already, and whether it is
    `base / relpath` as it stands (no symlink, `.` or `..` in `relpath`).

    Only the components below `base` are examined (one lstat each, not one for
    every component from /): a path with no symlink in them is its own real
    path. At a symlink, or a component realpath would interpret, the whole
    path is resolved as before, so the outcome is realpath's in every case.
    """
    path = str(base)
    for part in relpath.parts:
        path = f"{path}/{part}"
        if part in ("..", ".") or _is_link(path):
            return _realpath(base / relpath, cgroup_parent), False
    return Path(path), True


def _realpath(path: Path, cgroup_parent: str) -> Path:
    try:
        return Path(os.path.realpath(path))
    except OSError as exc:
        # A component changed from symlink to directory while it was resolved
        # (EINVAL from readlink): the tree is being rearranged under us.
        raise CgroupPathError(
            f"cgroup parent {cgroup_parent!r}: {path} cannot be resolved: {exc.strerror}"
        ) from None


def _is_link(path: Path | str) -> bool:
    """Whether `path` is a symlink; one that cannot be examined is not (as realpath has it)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _strictly_inside(path: Path, base: Path) -> bool:
    return path != base and path.is_relative_to(base)


def _read(target: FileTarget) -> str:
    return _read_at(_dir_of(target), target.name)


def _read_at(dir_fd: int, name: str) -> str:
    fd = _open_at(dir_fd, name, _READ_FLAGS)
    try:
        data = b""
        while len(data) <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"more than {MAX_FILE_BYTES} bytes, not a cgroup value")
    return data.decode("utf-8", errors="replace").strip()


def _write(target: FileTarget, text: str) -> None:
    fd = _open_at(_dir_of(target), target.name, _WRITE_FLAGS)
    try:
        # One write(2): the kernel parses each write as a whole value.
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _dir_of(target: FileTarget) -> int:
    if target.dir_error is not None:
        # A copy: raised, the kept error would take on this traceback, whose
        # frames hold the target that holds it.
        error = target.dir_error
        raise OSError(error.errno, error.strerror, error.filename)
    assert target.dir_fd is not None  # one or the other
    return target.dir_fd


def _open_at(dir_fd: int, name: str, flags: int) -> int:
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file, so not a cgroup file")
    except BaseException:
        os.close(fd)
        raise
    return fd


class CgroupFiles:
    """The file operations the cgroup writer (plugin/cgroup_writer.py) and the systemd
    driver's repairs (cgroups/systemd.py) use: these, on the files under their root.

    The writer's seam for tests: a test hands the writer (through `MidBatchPlugin` or `App`,
    `cgroup_files=`) a subclass that refuses a write as a kernel would, fails one, or counts
    reads, and everything else runs as it does on a node (tests/fake_cgroups.py,
    docs/testing.md). Holds nothing: one instance serves any number of writers.
    """

    def apply_values(
        self, root: Path, location: CgroupLocation, values: CgroupValues
    ) -> WriteReport:
        """`apply_values`, each file written by `write_file`."""
        return apply_values(root, location, values, self.write_file)

    def read_values(self, root: Path, location: CgroupLocation) -> CgroupReading:
        return read_values(root, location)

    def locate(self, root: Path, location: CgroupLocation) -> LocatedFiles:
        return locate(root, location)

    def read_located(
        self, located: LocatedFiles, directories: OpenDirectories | None = None
    ) -> CgroupReading:
        return read_located(located, directories)

    def write_file(self, target: FileTarget, text: str) -> None:
        """Write `text` to one cgroup file, in one write(2). Raises OSError."""
        _write(target, text)


#: The kernel's cgroup files, as the plugin reads and writes them on a node.
KERNEL_FILES = CgroupFiles()
