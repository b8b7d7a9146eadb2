"""Koordinator batchresource formulas (reference §4.3/§4.4) and the never-loosen rule."""

from __future__ import annotations

from fractions import Fraction

import pytest

from nri_midbatch.policy import (
    CgroupValues,
    NativeLimits,
    PriorityClass,
    QoSClass,
    Rules,
    Tier,
)
from nri_midbatch.policy.calculate import (
    container_values,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    pod_values,
)
from nri_midbatch.policy.spec import ContainerSpec
from nri_midbatch.policy.trace import Step, render
from tests.factory import BATCH_CPU as CPU
from tests.factory import BATCH_MEMORY as MEMORY
from tests.factory import GI

BATCH = Tier(
    name="batch",
    priority_classes=(PriorityClass.BATCH, PriorityClass.FREE),
    qos_classes=frozenset({QoSClass.BE}),
    cpu_resource=CPU,
    memory_resource=MEMORY,
)
KOORDINATOR = Rules()
UNSET = NativeLimits()


def entry(
    request: int | None = None,
    limit: int | None = None,
    memory: int | None = None,
    memory_request: int | None = None,
) -> ContainerSpec:
    requests = {CPU: request, MEMORY: memory_request}
    limits = {CPU: limit, MEMORY: memory}
    return ContainerSpec(
        requests={k: v for k, v in requests.items() if v is not None},
        limits={k: v for k, v in limits.items() if v is not None},
    )


def container(
    spec: ContainerSpec, rules: Rules = KOORDINATOR, native: NativeLimits = UNSET
) -> tuple[CgroupValues, list[str]]:
    trace: list[Step] = []
    return container_values(spec, BATCH, rules, native, trace), list(render(trace))


def pod(
    containers: dict[str, ContainerSpec], rules: Rules = KOORDINATOR, native: NativeLimits = UNSET
) -> tuple[CgroupValues, list[str]]:
    trace: list[Step] = []
    return pod_values(containers, BATCH, rules, native, trace), list(render(trace))


@pytest.mark.parametrize(
    ("milli_cpu", "shares"),
    [
        (500, 512),
        (1000, 1024),
        (0, 2),
        (-100, 2),
        (1, 2),  # 1*1024/1000 = 1, clamped up to the minimum
        (2, 2),
        (3, 3),
        (256_000, 262_144),
        (300_000, 262_144),  # clamped to the maximum
        (1_000_000_000, 262_144),
        # koordlet multiplies in int64: 2^62 * 1024 wraps to 0 and it writes 2. Exact here,
        # so a huge request is the most shares, never the fewest (docs/koordinator.md).
        (2**62, 262_144),
        (2**63 - 1, 262_144),
    ],
)
def test_milli_cpu_to_shares(milli_cpu: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli_cpu) == shares


@pytest.mark.parametrize(
    ("milli_cpu", "quota"),
    [
        (500, 50_000),
        (1000, 100_000),
        (1500, 150_000),
        (0, -1),
        (-5, -1),
        (5, 1000),  # 500 < 1000: raised to the minimum quota
        (1, 1000),
        (10, 1000),
        (11, 1100),
        # koordlet's int64 product wraps past 92233720368547 milli-cores (negative: -1, or a
        # small positive quota); exact here, and a result beyond int64 is refused by the
        # decision (reason "overflow").
        (2**62, 2**62 * 100),
    ],
)
def test_milli_cpu_to_quota(milli_cpu: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli_cpu) == quota


# Koordinator's batch_resource_test.go examples and the §4.3 edge cases, container level.
@pytest.mark.parametrize(
    ("spec", "rules", "expected"),
    [
        (entry(request=500), KOORDINATOR, CgroupValues(512, -1, -1)),
        (entry(limit=500), KOORDINATOR, CgroupValues(2, 50_000, -1)),
        (entry(limit=1000), KOORDINATOR, CgroupValues(2, 100_000, -1)),
        (entry(), KOORDINATOR, CgroupValues(2, -1, -1)),
        (
            entry(limit=500),
            Rules(cpu_normalization_ratio=Fraction(6, 5)),
            CgroupValues(2, 41_667, -1),  # ceil(50000 / 1.2)
        ),
        # A request is not defaulted to the limit.
        (entry(limit=1000, memory=GI), KOORDINATOR, CgroupValues(2, 100_000, GI)),
        (entry(request=500, limit=5), KOORDINATOR, CgroupValues(512, 1000, -1)),
        (entry(limit=0), KOORDINATOR, CgroupValues(2, -1, -1)),
        (entry(request=-5, limit=-5, memory=-5), KOORDINATOR, CgroupValues(2, -1, -1)),
        (entry(request=300_000), KOORDINATOR, CgroupValues(262_144, -1, -1)),
        (entry(memory=0), KOORDINATOR, CgroupValues(2, -1, -1)),
        # The memory request plays no part.
        (entry(memory_request=GI), KOORDINATOR, CgroupValues(2, -1, -1)),
        (
            entry(request=500, limit=500, memory=2 * GI),
            Rules(cfs_quota=False),
            CgroupValues(512, -1, 2 * GI),
        ),
        (entry(limit=500), Rules(cpu_normalization_ratio=Fraction(1)), CgroupValues(2, 50_000, -1)),
        (
            entry(limit=500),
            Rules(cpu_normalization_ratio=Fraction(1, 2)),  # ratios in (0, 1] are not applied
            CgroupValues(2, 50_000, -1),
        ),
        (entry(), Rules(cpu_normalization_ratio=Fraction(2)), CgroupValues(2, -1, -1)),
        (entry(limit=5), Rules(cpu_normalization_ratio=Fraction(2)), CgroupValues(2, 500, -1)),
        (
            entry(limit=600),
            Rules(cpu_normalization_ratio=Fraction(6, 5)),
            CgroupValues(2, 50_000, -1),  # exact: 60000 / 1.2 is 50000, no float residue
        ),
    ],
)
def test_container_values(spec: ContainerSpec, rules: Rules, expected: CgroupValues) -> None:
    assert container(spec, rules)[0] == expected


def test_container_trace_says_where_each_value_came_from() -> None:
    _, trace = container(
        entry(request=500, limit=500), Rules(cpu_normalization_ratio=Fraction(6, 5))
    )
    assert trace == [
        f"cpu.shares 512 from request {CPU}=500",
        f"cpu quota 50000 from limit {CPU}=500",
        "cpu quota 41667 = ceil(50000 / cpuNormalizationRatio 1.2)",
        f"memory limit -1 from no positive limit {MEMORY}",
    ]


def test_pod_sums_limits_of_listed_containers() -> None:
    values, _ = pod({"a": entry(limit=500, memory=GI), "b": entry(limit=1000, memory=2 * GI)})
    assert values == CgroupValues(2, 150_000, 3 * GI)


def test_pod_sums_positive_requests_only() -> None:
    values, _ = pod(
        {"a": entry(request=500), "b": entry(request=1000), "c": entry(request=-3), "d": entry()}
    )
    assert values.cpu_shares == 1536


def test_pod_without_requests_gets_minimum_shares() -> None:
    assert pod({"a": entry(limit=1000), "b": entry()})[0].cpu_shares == 2


def test_pod_unlimited_as_soon_as_one_listed_container_lacks_a_limit() -> None:
    values, trace = pod(
        {"a": entry(limit=500, memory=GI), "b": entry(request=500), "c": entry(limit=500)}
    )
    assert values == CgroupValues(512, -1, -1)
    assert f"pod cpu quota -1 from container 'b' having no limit {CPU} (pod unlimited)" in trace


def test_pod_with_empty_container_list_is_unlimited() -> None:
    # Koordinator would compute memory 0 here; a 0 limit is never written.
    assert pod({})[0] == CgroupValues(2, -1, -1)


def test_pod_rules() -> None:
    containers = {"a": entry(limit=500), "b": entry(limit=1000)}
    assert pod(containers, Rules(cfs_quota=False))[0].cpu_quota == -1
    assert pod(containers, Rules(cpu_normalization_ratio=Fraction(6, 5)))[0].cpu_quota == 125_000


@pytest.mark.parametrize(
    ("native", "computed_limit", "quota"),
    [
        (NativeLimits(cpu_quota=20_000), 500, 20_000),  # native tighter
        (NativeLimits(cpu_quota=80_000), 500, 50_000),  # computed tighter
        (NativeLimits(cpu_quota=50_000), 500, 50_000),
        (NativeLimits(cpu_quota=20_000), None, 20_000),  # computed unlimited
        (NativeLimits(cpu_quota=-1), 500, 50_000),  # native unlimited
        (NativeLimits(cpu_quota=0), None, -1),
        # Compared per the same period: 20000/50000us is 0.4 CPU, tighter than 0.5.
        (NativeLimits(cpu_quota=20_000, cpu_period=50_000), 500, 20_000),
        # 150000/200000us is 0.75 CPU, looser than 0.5.
        (NativeLimits(cpu_quota=150_000, cpu_period=200_000), 500, 50_000),
        # The period decides: 60000/200000us is 0.3 CPU (tighter than 50000 per 100000us),
        # 40000/50000us is 0.8 CPU (looser), although the raw quotas compare the other way.
        (NativeLimits(cpu_quota=60_000, cpu_period=200_000), 500, 60_000),
        (NativeLimits(cpu_quota=40_000, cpu_period=50_000), 500, 50_000),
    ],
)
def test_never_loosen_quota(native: NativeLimits, computed_limit: int | None, quota: int) -> None:
    values, _ = container(entry(limit=computed_limit), native=native)
    assert values.cpu_quota == quota


def test_never_loosen_applies_after_rules() -> None:
    native = NativeLimits(cpu_quota=20_000)
    assert container(entry(limit=500), Rules(cfs_quota=False), native)[0].cpu_quota == 20_000
    ratio = Rules(cpu_normalization_ratio=Fraction(2))
    assert container(entry(limit=500), ratio, NativeLimits(cpu_quota=30_000))[0].cpu_quota == 25_000


@pytest.mark.parametrize(
    ("native", "computed", "memory"),
    [
        (GI, 2 * GI, GI),
        (4 * GI, 2 * GI, 2 * GI),
        (GI, None, GI),
        (None, 2 * GI, 2 * GI),
        (-1, 2 * GI, 2 * GI),
    ],
)
def test_never_loosen_memory(native: int | None, computed: int | None, memory: int) -> None:
    values, _ = container(entry(memory=computed), native=NativeLimits(memory_limit=native))
    assert values.memory_limit == memory


def test_never_loosen_is_traced() -> None:
    _, trace = container(
        entry(limit=500, memory=2 * GI), native=NativeLimits(cpu_quota=20_000, memory_limit=GI)
    )
    assert (
        "cpu quota 20000: native 20000/100000us is tighter than computed 50000; never loosen"
        in trace
    )
    assert (
        f"memory limit {GI}: native {GI} is tighter than computed {2 * GI}; never loosen" in trace
    )
    _, quiet = container(entry(limit=500), native=NativeLimits(cpu_quota=80_000))
    assert not any("never loosen" in line for line in quiet)


def test_never_loosen_at_pod_level() -> None:
    values, _ = pod(
        {"a": entry(limit=500, memory=2 * GI)},
        native=NativeLimits(cpu_quota=10_000, memory_limit=GI),
    )
    assert values == CgroupValues(2, 10_000, GI)
