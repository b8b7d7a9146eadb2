"""The tests' cgroup filesystem: kubelet's and runc's files for pods and containers under a
root, cgroup v1 (cpu/ and memory/ hierarchies) or v2 (one unified hierarchy).

The plugin reads and writes it with its cgroupfs driver; the systemd driver's units point into
it too (tests/unit/fake_systemd.py writes their files). Values are (shares, quota, memory) with
-1 for unlimited, written and read back as the kernel shows them.

On cgroup v1 a `cpu.cfs_quota_us` write that the kernel refuses is refused here too, with
EINVAL, whoever writes: kubelet and runc through `FakeTree.write`, the plugin through
`KERNEL_RULES`, the file operations a test gives the plugin it builds on the tree. The
kernel's rule (kernel/sched/core.c, `tg_cfs_schedulable_down`): with CFS bandwidth on v1, a
limited cgroup's quota/period may not exceed that of its nearest limited ancestor; an
unlimited cgroup (-1) takes its parent's limit for its children, and under no limit anything
goes. Cgroup v2 has no such refusal (there a child's cpu.max is only capped by its
parent's), so the v2 tree accepts any write as before.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

from nri_midbatch.cgroups.fs import CgroupFiles, FileTarget
from nri_midbatch.cgroups.paths import CgroupLocation
from nri_midbatch.cgroups.report import WriteReport
from nri_midbatch.cgroups.values import CgroupReading, CgroupValues
from tests.oracle.targets import UNLIMITED, Values, weight_of

#: What cgroup v1 shows for "no memory limit" (the page-aligned int64 maximum).
V1_UNLIMITED_MEMORY = 9223372036854771712

#: Kubelet's besteffort pod cgroup: minimal shares, no quota, no memory limit.
BESTEFFORT = Values(2, UNLIMITED, UNLIMITED)

#: The cpu hierarchies of the v1 trees alive in this process: their quota writes are checked.
_V1_CPU_ROOTS: set[Path] = set()

#: What the kernel's `to_ratio` shifts a quota by before dividing it by its period.
_BW_SHIFT = 20


class FakeTree:
    """Pod cgroups at root[/controller]/<cgroup parent>, containers one directory below."""

    def __init__(self, root: Path, version: int = 1) -> None:
        self.root, self.version = root, version
        if version == 2:
            root.mkdir(parents=True, exist_ok=True)
            (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        else:
            for controller in ("cpu", "memory"):
                (root / controller).mkdir(parents=True, exist_ok=True)
            _V1_CPU_ROOTS.add((root / "cpu").resolve())

    def directory(self, controller: str, relpath: str, container_id: str | None = None) -> Path:
        base = self.root if self.version == 2 else self.root / controller
        directory = base / relpath.strip("/")
        return directory if container_id is None else directory / container_id

    def write(
        self,
        relpath: str,
        values: Values,
        container_id: str | None = None,
        *,
        only: tuple[str, ...] = ("shares", "quota", "memory"),
    ) -> None:
        """As kubelet or runc write a cgroup's values: `only` those named.

        Raises OSError(EINVAL), before writing any of them, if cgroup v1 refuses the quota."""
        if self.version == 1 and "quota" in only:
            check_v1_quota(self.directory("cpu", relpath, container_id), values.quota)
        for (controller, name), text in self._texts(values).items():
            if _FIELD_OF[name] not in only:
                continue
            directory = self.directory(controller, relpath, container_id)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text + "\n")

    def _texts(self, values: Values) -> dict[tuple[str, str], str]:
        if self.version == 2:
            quota = "max" if values.quota == UNLIMITED else str(values.quota)
            memory = "max" if values.memory == UNLIMITED else str(values.memory)
            return {
                ("cpu", "cpu.weight"): str(weight_of(values.shares)),
                ("cpu", "cpu.max"): f"{quota} 100000",
                ("memory", "memory.max"): memory,
            }
        limit = V1_UNLIMITED_MEMORY if values.memory == UNLIMITED else values.memory
        return {
            ("cpu", "cpu.shares"): str(values.shares),
            ("cpu", "cpu.cfs_quota_us"): str(values.quota),
            ("memory", "memory.limit_in_bytes"): str(limit),
        }

    def read(self, relpath: str, container_id: str | None = None) -> Values:
        """The cgroup's values; on v2 `shares` holds the weight (see `expected`)."""
        cpu = self.directory("cpu", relpath, container_id)
        memory = self.directory("memory", relpath, container_id)
        if self.version == 2:
            max_quota = _text(cpu / "cpu.max").split()[0]
            max_memory = _text(memory / "memory.max")
            return Values(
                int(_text(cpu / "cpu.weight")),
                UNLIMITED if max_quota == "max" else int(max_quota),
                UNLIMITED if max_memory == "max" else int(max_memory),
            )
        limit = int(_text(memory / "memory.limit_in_bytes"))
        return Values(
            int(_text(cpu / "cpu.shares")),
            int(_text(cpu / "cpu.cfs_quota_us")),
            UNLIMITED if limit >= V1_UNLIMITED_MEMORY else limit,
        )

    def expected(self, values: Values) -> Values:
        """`values` as `read` shows them."""
        shares = weight_of(values.shares) if self.version == 2 else values.shares
        return Values(shares, values.quota, values.memory)

    def snapshot(self) -> dict[str, str]:
        """Every file anywhere under the root, with its content."""
        return {
            str(path.relative_to(self.root)): path.read_text()
            for path in sorted(self.root.rglob("*"))
            if path.is_file()
        }


class KernelRules(CgroupFiles):
    """The plugin's cgroup file operations on a fake tree (its writer's seam, cgroups/fs.py):
    the real ones, but a `cpu.cfs_quota_us` write that a v1 kernel refuses is refused, with
    EINVAL, before it is written. A tree that is not v1 takes any write."""

    def write_file(self, target: FileTarget, text: str) -> None:
        if target.path.name == "cpu.cfs_quota_us":
            check_v1_quota(target.path.parent, int(text))
        super().write_file(target, text)


#: What a test gives the plugin it builds on a fake tree (`MidBatchPlugin` and `App` take it
#: as `cgroup_files`): nothing holds state, so one serves every test.
KERNEL_RULES = KernelRules()


def _unwatched(_location: CgroupLocation) -> None:
    pass


class Watched(KernelRules):
    """`KernelRules` telling the test of each cgroup the plugin's writer writes or reads
    (`read` only; the convergence pass's located reads are not told), before it does.

    Set `applying` or `reading` when the test starts watching; raising from one is the
    write's or the read's failure."""

    def __init__(self) -> None:
        self.applying: Callable[[CgroupLocation], None] = _unwatched
        self.reading: Callable[[CgroupLocation], None] = _unwatched

    def apply_values(
        self, root: Path, location: CgroupLocation, values: CgroupValues
    ) -> WriteReport:
        self.applying(location)
        return super().apply_values(root, location, values)

    def read_values(self, root: Path, location: CgroupLocation) -> CgroupReading:
        self.reading(location)
        return super().read_values(root, location)


def check_v1_quota(directory: Path, quota: int) -> None:
    """Raise OSError(EINVAL) if `quota` in `directory`'s cpu.cfs_quota_us, under a v1 tree's
    cpu hierarchy, breaks the kernel's rule: a limited cgroup's ratio at most its nearest
    limited ancestor's, for the cgroup against its ancestors and its descendants against it."""
    directory = directory.resolve()
    cpu_root = next((r for r in _V1_CPU_ROOTS if directory.is_relative_to(r)), None)
    if cpu_root is None:
        return
    above = None
    for ancestor in directory.parents:
        if not ancestor.is_relative_to(cpu_root):
            break
        if (above := _ratio(ancestor)) is not None:
            break
    own = _ratio(directory, quota)
    if own is not None and above is not None and own > above:
        raise OSError(errno.EINVAL, f"quota {quota} above its parent's limit", str(directory))
    if not _below(directory, above if own is None else own):
        raise OSError(errno.EINVAL, f"quota {quota} below a child's", str(directory))


def _below(directory: Path, limit: int | None) -> bool:
    """Whether every limited cgroup below `directory` keeps within `limit` (None: no limit)
    and, in turn, within its own nearest limited ancestor's; a cgroup not made yet has none."""
    if not directory.is_dir():
        return True
    for child in directory.iterdir():
        if child.is_dir():
            own = _ratio(child)
            if own is not None and limit is not None and own > limit:
                return False
            if not _below(child, limit if own is None else own):
                return False
    return True


def _ratio(directory: Path, quota: int | None = None) -> int | None:
    """The kernel's normalized bandwidth of the cgroup, `quota` if given, else its file's:
    quota << 20 // period (`to_ratio`); None for no limit (-1, or no file yet: a new cgroup
    is unlimited)."""
    if quota is None:
        quota_file = directory / "cpu.cfs_quota_us"
        if not quota_file.exists():
            return None
        quota = int(_text(quota_file))
    if quota < 0:
        return None
    period_file = directory / "cpu.cfs_period_us"
    period = int(_text(period_file)) if period_file.exists() else 100_000
    return (quota << _BW_SHIFT) // period


_FIELD_OF = {
    "cpu.weight": "shares",
    "cpu.shares": "shares",
    "cpu.max": "quota",
    "cpu.cfs_quota_us": "quota",
    "memory.max": "memory",
    "memory.limit_in_bytes": "memory",
}


def _text(path: Path) -> str:
    """The file's value. Unlike a kernel's cgroup file, a plain file the plugin is rewriting
    reads empty between its truncation and its write: read it again then."""
    deadline = time.monotonic() + 1.0
    while not (text := path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.001)
    return text
