"""The tests' cgroup filesystem: kubelet's and runc's files for pods and containers under a
root, cgroup v1 (cpu/ and memory/ hierarchies) or v2 (one unified hierarchy).

The plugin reads and writes it with its cgroupfs driver; the systemd driver's units point into
it too (tests/unit/fake_systemd.py writes their files). Values are (shares, quota, memory) with
-1 for unlimited, written and read back as the kernel shows them.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.oracle.targets import UNLIMITED, Values, weight_of

#: What cgroup v1 shows for "no memory limit" (the page-aligned int64 maximum).
V1_UNLIMITED_MEMORY = 9223372036854771712

#: Kubelet's besteffort pod cgroup: minimal shares, no quota, no memory limit.
BESTEFFORT = Values(2, UNLIMITED, UNLIMITED)


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
        """As kubelet or runc write a cgroup's values: `only` those named."""
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
