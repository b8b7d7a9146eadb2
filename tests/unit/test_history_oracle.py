"""The oracle of the history tests: Koordinator's own examples, and its independence."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.oracle.model import MI, Config, ContainerModel, Extended, Kind, Native, PodModel
from tests.oracle.targets import (
    Values,
    container_target,
    kubelet_pod,
    pod_target,
    quota_of,
    scaled,
    shares_of,
    weight_of,
)

ORACLE = Path(__file__).parents[1] / "oracle"


@pytest.mark.parametrize("path", sorted(ORACLE.glob("*.py")), ids=lambda p: p.name)
def test_the_oracle_shares_no_code_with_the_plugin(path: Path) -> None:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module)
    assert {name for name in imported if name.split(".")[0] == "nri_midbatch"} == set()


def test_koordinators_unit_test_examples() -> None:
    """batch_resource_test.go, and koordinator.md's exact ratio arithmetic."""
    assert shares_of(500) == 512
    assert shares_of(None) == 2
    assert quota_of(500) == 50_000
    assert quota_of(1000) == 100_000
    assert quota_of(5) == 1000
    assert quota_of(None) == -1
    assert scaled(quota_of(500), "1.2") == 41_667
    assert scaled(quota_of(1150), "1.15") == 100_000
    assert scaled(100_000, "1.0") == 100_000
    assert (weight_of(2), weight_of(262144)) == (1, 10000)


def test_pod_level_sums_only_listed_containers_and_never_loosens_kubelets() -> None:
    listed = Extended(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)
    pod = PodModel(
        "p",
        Kind.BATCH_BE,
        (
            ContainerModel("a", listed, Native()),
            ContainerModel("b", Extended(cpu_request=500, cpu_limit=500), Native()),
            ContainerModel("unlisted", None, Native()),
        ),
    )
    # b has no memory limit: the pod has none; its quota is the sum of a and b.
    assert pod_target(pod, Config(), pod_resources=True) == Values(1024, 150_000, -1)
    assert container_target(pod, pod.containers[2], Config()) == Values(2, -1, -1)
    mid = PodModel(
        "m",
        Kind.MID_LS,
        (ContainerModel("a", listed, Native(cpu_request=500, cpu_limit=500, memory_limit=MI)),),
        Native(cpu_request=100, cpu_limit=100, memory_limit=MI),
    )
    assert kubelet_pod(mid) == Values(614, 60_000, 2 * MI)
    assert pod_target(mid, Config(cfs_quota=False), pod_resources=False) == Values(
        512, 60_000, 2 * MI
    )
    # Outside every tier, and in observe mode, kubelet's values stand.
    assert pod_target(mid, Config(mid_tier=False), pod_resources=True) == kubelet_pod(mid)
    assert pod_target(mid, Config(observe=True), pod_resources=True) == kubelet_pod(mid)
