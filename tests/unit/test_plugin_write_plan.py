"""A reload's cgroup-file path finds containers where the runtime put them."""

from __future__ import annotations

from pathlib import Path

from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.state.plan import ContainerChange, Plan

SLICE = "kubepods-besteffort-podu.slice"
SLICE_DIR = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice"


def test_write_plan_uses_the_runtimes_cgroups_path(tmp_path: Path) -> None:
    # cgroup v2 with CRI-O's container naming under systemd: crio-<id>.scope.
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    scope = tmp_path / SLICE_DIR / "crio-abc.scope"
    scope.mkdir(parents=True)
    for name, text in (("cpu.weight", "100"), ("cpu.max", "max 100000"), ("memory.max", "max")):
        (scope / name).write_text(text)
    plugin = MidBatchPlugin(
        settings_of(load_config_text(f"cgroups:\n  root: {tmp_path}\n", "test"))
    )
    pod = PodView("u", "ns", "p", {}, {}, SLICE)
    change = ContainerChange(
        pod, ContainerView("abc", "app"), CgroupValues(512, 50_000, 1 << 30), f"{SLICE}:crio:abc"
    )

    assert plugin.reconcile.follow.write_plan(Plan((change,), ())) == Plan((), ())
    assert (scope / "cpu.max").read_text() == "50000"
    assert (scope / "memory.max").read_text() == str(1 << 30)
    # Without the runtime's path, containerd's naming is assumed: not there.
    elsewhere = ContainerChange(pod, change.container, change.values)
    assert plugin.reconcile.follow.write_plan(Plan((elsewhere,), ())) == Plan((elsewhere,), ())
