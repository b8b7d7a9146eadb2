"""Where a pod's or a container's cgroup is (`CgroupLocation`) -> its directory relative to
the cgroup root.

Pure: no file system access. The strings come from NRI's
`PodSandbox.linux.cgroup_parent` and `Container.linux.cgroups_path`, i.e. from the
runtime, so they are checked here before anything joins them onto a real directory;
confinement after symlink resolution is checked again where the I/O happens (`fs.py`).

Only cgroups kubelet creates for pods are accepted, and containers directly
inside them: the parent is a runtime's or a CRI client's to choose, and a
batch pod "in" `system.slice` or `/init.scope` would otherwise have its
limits written into (and, under the systemd driver, held by) the node's own
services. Pods are below `kubepods` in kubelet's `--cgroup-root` (`/` by default,
`/kubelet` in KinD): `<root>/kubepods/...` with cgroupfs, the slices named
`<root>-kubepods-...` with systemd. Nothing outside that root's `kubepods` is accepted.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Literal

_SLICE_SUFFIX = ".slice"

#: How each runtime names a container's cgroup inside its pod's, for when it
#: sends no cgroups_path: runtime name (as in Configure, lower case) ->
#: (cgroupfs directory prefix, systemd scope unit prefix). containerd's runc
#: uses the bare id with cgroupfs; CRI-O writes `crio-<id>` with both drivers.
_CONTAINER_PREFIXES = {
    "containerd": ("", "cri-containerd-"),
    "cri-o": ("crio-", "crio-"),
}
_DEFAULT_RUNTIME = "containerd"

#: kubelet's pod cgroups: `kubepods/pod<uid>` (Guaranteed), or one QoS level
#: lower; under the systemd driver the same names joined by `-` into slices.
_KUBEPODS = "kubepods"
_QOS_LEVELS = ("burstable", "besteffort")
_POD_PREFIX = "pod"
_SCOPE_SUFFIX = ".scope"

#: Whose cgroup: a pod's, or a container's inside it.
Level = Literal["pod", "container"]


class CgroupPathError(ValueError):
    """A cgroup parent or container id that must not be turned into a path."""


#: kubelet's `--cgroup-root` as names, e.g. `/kubelet` -> ("kubelet",); `/` -> ().
KubeletRoot = tuple[str, ...]


def kubelet_root(flag: str) -> KubeletRoot:
    """kubelet's `--cgroup-root`, spelled as the flag is (a cgroupfs path), as names.

    kubelet reads the flag as a cgroupfs path under either driver and appends `kubepods`
    (and a QoS level, and `pod<uid>`) to its names; the systemd driver then joins them
    with `-` into a slice, each name's own `-` turned into `_` (kubelet's
    cgroup_manager_linux.go, ToSystemd).
    """
    if not flag.startswith("/"):
        raise CgroupPathError(f"kubelet cgroup root {flag!r}: not an absolute path")
    _check_text(flag, flag)
    names = tuple(name for name in flag.split("/") if name)
    for name in names:
        if name in (".", ".."):
            raise CgroupPathError(f"kubelet cgroup root {flag!r}: {name!r} segment not allowed")
    return names


class CgroupDriver(StrEnum):
    """How the kubelet names pod cgroups (its `--cgroup-driver`)."""

    AUTO = "auto"
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


def resolve_driver(driver: CgroupDriver, cgroup_parent: str) -> CgroupDriver:
    """Pick a concrete driver; AUTO guesses from the spelling of the parent."""
    if driver is not CgroupDriver.AUTO:
        return driver
    if cgroup_parent.endswith(_SLICE_SUFFIX):
        return CgroupDriver.SYSTEMD
    return CgroupDriver.CGROUPFS


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """What finds a pod's cgroup, or one of its containers', below the cgroup root.

    All of it comes from the runtime (NRI's PodSandbox and Container, Configure's runtime
    name), so `relpath` checks it before it is joined onto a real directory.
    """

    driver: CgroupDriver
    cgroup_parent: str
    #: None: the pod's own cgroup.
    container_id: str | None = None
    #: The runtime's own path for the container (NRI's `Container.linux.cgroups_path`).
    cgroups_path: str = ""
    #: The runtime's name from Configure: its naming finds a container sent without a path.
    runtime: str = ""
    #: kubelet's `--cgroup-root`: pods are accepted below its `kubepods` only.
    kubelet_root: KubeletRoot = ()

    @property
    def level(self) -> Level:
        return "pod" if self.container_id is None else "container"

    @property
    def named(self) -> str:
        """The runtime's string the cgroup was found by, for messages."""
        return self.cgroups_path or self.cgroup_parent

    def relpath(self) -> PurePosixPath:
        """The cgroup's directory relative to the root (of a v1 hierarchy or of v2).

        Raises CgroupPathError for anything that is not a plain downward path to a pod
        cgroup of kubelet's, or to a container's directly inside one.
        """
        if self.container_id is None:
            return _pod_relpath(self.driver, self.cgroup_parent, self.kubelet_root)
        return self._container_relpath(self.container_id)

    def _container_relpath(self, container_id: str) -> PurePosixPath:
        # The runtime's own `cgroups_path` wins when it is known, since runtimes
        # name containers differently. Else the naming of `runtime`: containerd
        # nests `<id>` (cgroupfs) or `cri-containerd-<id>.scope` (systemd) in the
        # pod's cgroup, CRI-O `crio-<id>` or `crio-<id>.scope`. An unknown runtime
        # is taken for containerd.
        if self.cgroups_path:
            relpath = runtime_cgroups_relpath(self.cgroups_path)
            if not _is_kubepods_container(relpath.parts, self.kubelet_root):
                raise CgroupPathError(
                    f"cgroups path {self.cgroups_path!r}: not a container cgroup directly "
                    "inside a pod cgroup of kubelet's"
                )
            return relpath
        parent = self.cgroup_parent
        pod = _pod_relpath(self.driver, parent, self.kubelet_root)
        _check_text(container_id, parent)
        if not _is_segment(container_id):
            raise CgroupPathError(
                f"container id {container_id!r} (cgroup parent {parent!r}) "
                "is not a single path segment"
            )
        cgroupfs_prefix, scope_prefix = _CONTAINER_PREFIXES.get(
            self.runtime.strip().lower(), _CONTAINER_PREFIXES[_DEFAULT_RUNTIME]
        )
        if resolve_driver(self.driver, parent) is CgroupDriver.SYSTEMD:
            return pod / f"{scope_prefix}{container_id}.scope"
        return pod / f"{cgroupfs_prefix}{container_id}"


def _pod_relpath(driver: CgroupDriver, cgroup_parent: str, root: KubeletRoot) -> PurePosixPath:
    _check_text(cgroup_parent, cgroup_parent)
    concrete = resolve_driver(driver, cgroup_parent)
    # A systemd parent with slashes is already an expanded path (the form
    # `/kubepods.slice/kubepods-besteffort.slice/...`); only a bare unit name
    # needs expanding.
    if concrete is CgroupDriver.SYSTEMD and "/" not in cgroup_parent:
        segments = _expand_slice(cgroup_parent)
    else:
        segments = _split_segments(cgroup_parent)
    if not _is_kubepods_pod(segments, root):
        cgroupfs, systemd = "/".join((*root, _KUBEPODS)), "-".join((*_escaped(root), _KUBEPODS))
        raise CgroupPathError(
            f"cgroup parent {cgroup_parent!r}: not a pod cgroup of kubelet's "
            f"({cgroupfs}[/<qos>]/pod<uid>, or a {systemd}[-<qos>]-pod<uid>.slice; "
            "kubelet's --cgroup-root is cgroups.kubeletCgroupRoot)"
        )
    return PurePosixPath(*segments)


def runtime_cgroups_relpath(cgroups_path: str) -> PurePosixPath:
    """An OCI `linux.cgroupsPath` as runc reads it, relative to the root.

    `/a/b/c` with the cgroupfs driver; `slice:prefix:name` with systemd, which
    is the unit `prefix-name.scope` inside the expanded slice (containerd
    writes prefix `cri-containerd`, CRI-O `crio`).
    """
    _check_text(cgroups_path, cgroups_path)
    if cgroups_path.startswith("/") or ":" not in cgroups_path:
        return PurePosixPath(*_split_segments(cgroups_path))
    parts = cgroups_path.split(":")
    if len(parts) != 3 or not all(_is_segment(p) for p in (parts[0], parts[2])):
        raise CgroupPathError(f"cgroups path {cgroups_path!r}: not slice:prefix:name")
    slice_name, prefix, name = parts
    if prefix and not _is_segment(prefix):
        raise CgroupPathError(f"cgroups path {cgroups_path!r}: bad unit prefix")
    unit = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return PurePosixPath(*_expand_slice(slice_name), unit)


def _is_kubepods_pod(segments: Sequence[str], root: KubeletRoot) -> bool:
    """Whether the path is a pod cgroup kubelet creates, with either driver."""
    return _is_cgroupfs_pod(segments, root) or _is_systemd_pod(segments, root)


def _is_cgroupfs_pod(segments: Sequence[str], root: KubeletRoot) -> bool:
    *levels, pod = segments
    return _is_kubelet_levels(levels, root) and _is_pod_name(pod)


def _is_systemd_pod(segments: Sequence[str], root: KubeletRoot) -> bool:
    # The whole chain of slices, as systemd nests them: nothing above the
    # root's first slice, nothing between it and the pod's slice.
    *levels, pod = segments[-1].removesuffix(_SLICE_SUFFIX).split("-")
    if not (_is_kubelet_levels(levels, _escaped(root)) and _is_pod_name(pod)):
        return False
    try:
        return list(segments) == _expand_slice(segments[-1])
    except CgroupPathError:
        return False


def _is_kubelet_levels(levels: Sequence[str], root: Sequence[str]) -> bool:
    """The root's `kubepods`, or it and a QoS level: where kubelet puts pods."""
    depth = len(root)
    if tuple(levels[:depth]) != tuple(root):
        return False
    below = levels[depth:]
    if not below or below[0] != _KUBEPODS:
        return False
    return len(below) == 1 or (len(below) == 2 and below[1] in _QOS_LEVELS)


def _escaped(root: KubeletRoot) -> tuple[str, ...]:
    """The root's names as kubelet's systemd driver writes them into a slice name."""
    return tuple(name.replace("-", "_") for name in root)


def _is_kubepods_container(segments: Sequence[str], root: KubeletRoot) -> bool:
    """A container's cgroup: one level inside a pod's; a systemd pod's holds scopes."""
    if len(segments) < 2 or not _is_kubepods_pod(segments[:-1], root):
        return False
    if not _is_systemd_pod(segments[:-1], root):
        return True
    # A scope unit, as runc names it from `slice:prefix:id`: `<prefix>-<id>.scope`
    # (cri-containerd-<id>, crio-<id>), or `<id>.scope` with no prefix.
    unit = segments[-1]
    return unit.endswith(_SCOPE_SUFFIX) and unit != _SCOPE_SUFFIX


def _is_pod_name(name: str) -> bool:
    return name.startswith(_POD_PREFIX) and len(name) > len(_POD_PREFIX)


def _is_segment(text: str) -> bool:
    return text not in ("", ".", "..") and "/" not in text


def _check_text(text: str, cgroup_parent: str) -> None:
    # NUL would truncate the path in the kernel; lone surrogates cannot be
    # encoded for the file system and never come out of a protobuf string.
    if "\x00" in text:
        raise CgroupPathError(f"cgroup parent {cgroup_parent!r}: contains NUL")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CgroupPathError(f"cgroup parent {cgroup_parent!r}: not valid text") from exc


def _split_segments(cgroup_parent: str) -> list[str]:
    # A leading "/" means "from the cgroup root", which is where every path
    # starts anyway, so empty segments carry no meaning and are dropped.
    segments = [s for s in cgroup_parent.split("/") if s]
    for segment in segments:
        if segment in (".", ".."):
            raise CgroupPathError(
                f"cgroup parent {cgroup_parent!r}: {segment!r} segments are not allowed"
            )
    if not segments:
        raise CgroupPathError(f"cgroup parent {cgroup_parent!r}: names the cgroup root itself")
    return segments


def _expand_slice(slice_name: str) -> list[str]:
    """`a-b-c.slice` -> [`a.slice`, `a-b.slice`, `a-b-c.slice`], as systemd and runc do.

    In a slice name each `-` starts a child level, so empty components
    (`a--b.slice`, `-a.slice`) are invalid. `-.slice` is the root slice,
    which is never a pod's cgroup.
    """
    stem = slice_name.removesuffix(_SLICE_SUFFIX)
    if stem == slice_name or not stem or stem == "-":
        raise CgroupPathError(f"cgroup parent {slice_name!r}: not a systemd slice below the root")
    components = stem.split("-")
    if "" in components:
        raise CgroupPathError(f"cgroup parent {slice_name!r}: empty component in slice name")
    return ["-".join(components[: i + 1]) + _SLICE_SUFFIX for i in range(len(components))]
