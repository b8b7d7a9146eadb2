"""The node's cgroup shape, as the end-to-end tests need to know it.

The host runs cgroup v1 with the cgroupfs driver. The guest legs
(test_guest_cgroup_v2.py) run the same tests on a cgroup v2 node, with the
cgroupfs or the systemd driver as NRI_E2E_CGROUP_DRIVER says. `NODE` is this
process's node: it spells pod cgroup parents as kubelet does for that driver,
creates the systemd slices kubelet would, finds the pod and container cgroup
directories, and reads their values in the node's own files, so a test
states what it expects once, in Koordinator's (v1) units, through `expect`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from nri_midbatch.cgroups import files
from nri_midbatch.cgroups.files import CgroupFile, CgroupVersion
from nri_midbatch.cgroups.values import cpu_shares_to_weight

CGROUP_ROOT = Path("/sys/fs/cgroup")
DRIVER_ENV = "NRI_E2E_CGROUP_DRIVER"
#: How many times slower than a plain host this node runs the tests: the
#: cgroup v2 guest (software emulation) sets it, and the harnesses' waits for
#: containerd and the plugin scale by it.
SLOWDOWN = float(os.environ.get("NRI_E2E_SLOWDOWN", "1"))


class Driver(StrEnum):
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


@dataclass(frozen=True)
class Values:
    """A cgroup's cpu, quota and memory values as the node's files hold them.

    cpu is `cpu.shares` on v1 and `cpu.weight` on v2; quota and memory read
    -1 for no limit on both versions.
    """

    cpu: int
    quota: int
    memory: int


# kubelet gives the BestEffort slice and every BestEffort pod's slice the
# minimum shares, 2; the other slices keep systemd's defaults here (the tests
# read no value of theirs).
_BESTEFFORT_CPU_WEIGHT = cpu_shares_to_weight(2)


def cgroup_controllers() -> list[str]:
    """Every v1 hierarchy mounted under /sys/fs/cgroup (cpu, memory, systemd, ...)."""
    with contextlib.suppress(FileNotFoundError):
        return sorted(p.name for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())
    return []


def _slice_path(name: str) -> Path:
    """systemd's cgroup path of a slice: a-b-c.slice -> a.slice/a-b.slice/a-b-c.slice."""
    parts = name.removesuffix(".slice").split("-")
    return Path(*("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))))


@dataclass(frozen=True)
class Node:
    version: CgroupVersion
    driver: Driver

    @classmethod
    def detect(cls) -> Node:
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        return cls(
            CgroupVersion.V2 if v2 else CgroupVersion.V1,
            Driver(os.environ.get(DRIVER_ENV, Driver.CGROUPFS)),
        )

    def missing(self) -> str | None:
        """Why this node cannot run the tests (no cpu controller where we look), or None."""
        if self.version is CgroupVersion.V1:
            if (CGROUP_ROOT / "cpu" / "cpu.shares").exists():
                return None
            return f"cgroup v1 with the cpu controller at {CGROUP_ROOT}/cpu"
        # systemd enables controllers for the slices that ask for them; without
        # it the node's setup enables them in the root's subtree_control.
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        if {"cpu", "memory"} <= set(controllers):
            return None
        return f"the cpu and memory controllers in {CGROUP_ROOT}/cgroup.controllers"

    # ------------------------------------------------------------ parents

    def new_cgroup_parent(self, qos: str = "besteffort", uid: str | None = None) -> str:
        """A fresh pod cgroup parent as kubelet spells it for this driver.

        cgroupfs: /kubepods/besteffort/pod<uid>; systemd:
        kubepods-besteffort-pod<uid with _ for ->.slice. Guaranteed pods sit
        right under kubepods.
        """
        uid = uid or str(uuid.uuid4())
        if self.driver is Driver.SYSTEMD:
            prefix = "kubepods" if qos == "guaranteed" else f"kubepods-{qos}"
            return f"{prefix}-pod{uid.replace('-', '_')}.slice"
        prefix = "/kubepods" if qos == "guaranteed" else f"/kubepods/{qos}"
        return f"{prefix}/pod{uid}"

    def prepare_parent(self, parent: str) -> None:
        """Create the pod's slice and its parents as kubelet does (systemd driver only).

        kubelet starts them as transient units before RunPodSandbox; the
        runtime then puts the containers' scopes in the pod's slice.
        """
        if self.driver is not Driver.SYSTEMD:
            return
        path = _slice_path(parent)
        for depth in range(1, len(path.parts) + 1):
            unit = path.parts[depth - 1]
            if (CGROUP_ROOT / Path(*path.parts[:depth])).is_dir():
                continue
            # kubepods.slice sits in the root slice; its children want their parent.
            wants = path.parts[depth - 2] if depth > 1 else None
            weight = _BESTEFFORT_CPU_WEIGHT if unit.startswith("kubepods-besteffort") else None
            self._start_slice(unit, wants, weight)
            self._wait_for_dir(CGROUP_ROOT / Path(*path.parts[:depth]))

    @staticmethod
    def _start_slice(unit: str, wants: str | None, cpu_weight: int | None) -> None:
        # (name, D-Bus signature, value...) as busctl spells each property.
        props: list[tuple[str, ...]] = [
            ("Description", "s", f"e2e {unit}"),
            ("DefaultDependencies", "b", "false"),
            ("CPUAccounting", "b", "true"),
            ("MemoryAccounting", "b", "true"),
            ("TasksAccounting", "b", "true"),
        ]
        if wants is not None:
            props.append(("Wants", "as", "1", wants))
        if cpu_weight is not None:
            props.append(("CPUWeight", "t", str(cpu_weight)))
        res = subprocess.run(
            [
                "busctl", "call", "--timeout=30",
                "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager", "StartTransientUnit",
                "ssa(sv)a(sa(sv))", unit, "fail", str(len(props)), *(t for p in props for t in p),
                "0",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"StartTransientUnit {unit} failed: {res.stderr.strip()}")

    @staticmethod
    def _wait_for_dir(path: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.is_dir():
            if time.monotonic() > deadline:
                raise RuntimeError(f"systemd did not create {path} within {timeout}s")
            time.sleep(0.02)

    # -------------------------------------------------------- directories

    def pod_dirs(self, parent: str) -> list[Path]:
        """The pod's cgroup directory in every hierarchy (one on v2)."""
        if self.version is CgroupVersion.V2:
            return [self.pod_dir("cpu", parent)]
        return [self.pod_dir(c, parent) for c in cgroup_controllers()]

    def pod_dir(self, controller: str, parent: str) -> Path:
        if self.version is CgroupVersion.V1:
            return CGROUP_ROOT / controller / parent.strip("/")
        if self.driver is Driver.SYSTEMD:
            return CGROUP_ROOT / _slice_path(parent)
        return CGROUP_ROOT / parent.strip("/")

    def container_dir(self, controller: str, parent: str, container_id: str) -> Path:
        """Where runc puts a container: <pod>/<id>, or <pod>/cri-containerd-<id>.scope."""
        name = container_id
        if self.driver is Driver.SYSTEMD:
            name = f"cri-containerd-{container_id}.scope"
        return self.pod_dir(controller, parent) / name

    # ------------------------------------------------------------- values

    def value_files(self) -> tuple[CgroupFile, CgroupFile, CgroupFile]:
        """The (cpu, quota, memory) files of this cgroup version."""
        return files.pod_files(self.version)

    def read_values(self, parent: str, container_id: str | None = None) -> Values:
        """The pod's (or a container's) values, read from the node's files."""
        cpu, quota, memory = (
            files.parse_value(f, self.read(f, parent, container_id)) for f in self.value_files()
        )
        return Values(cpu, quota, memory)

    def read(self, file: CgroupFile, parent: str, container_id: str | None = None) -> str:
        base = (
            self.container_dir(file.controller, parent, container_id)
            if container_id
            else self.pod_dir(file.controller, parent)
        )
        return (base / file.name).read_text().strip()

    def expect(self, shares: int, quota: int, memory: int) -> Values:
        """What the files hold for these v1 values (-1: no limit) on this node.

        On v2 both the plugin (pod) and runc 1.1.5 (container) turn shares into
        a weight with kubelet's linear formula, `cpu_shares_to_weight`. The
        container values come from runc, so a plugin formula that drifted from
        runc's would fail the container-level checks.
        """
        cpu = shares if self.version is CgroupVersion.V1 else cpu_shares_to_weight(shares)
        return Values(cpu, quota, memory)

    def plugin_config(self, text: str) -> str:
        """A plugin configuration for this node: names the systemd driver where it is used."""
        if self.driver is Driver.SYSTEMD:
            return "cgroups:\n  driver: systemd\n" + text
        return text


NODE = Node.detect()
