import pytest
from hypothesis import given
from hypothesis import strategies as st

from nri_midbatch.cgroups import values as cgroup_values
from nri_midbatch.cgroups.values import (
    UNLIMITED,
    CgroupValues,
    check_writable,
    clamp_cpu_shares,
    cpu_shares_to_weight,
    runtime_cpu_weights,
)
from nri_midbatch.policy import calculate


@pytest.mark.parametrize(
    ("shares", "weight"),
    [
        # 1 + (0 * 9999) // 262142 = 1
        (2, 1),
        # 1 + (1022 * 9999) // 262142 = 1 + 10218978 // 262142 = 1 + 38
        (1024, 39),
        # 1 + (262142 * 9999) // 262142 = 1 + 9999
        (262144, 10000),
        # 1 + (510 * 9999) // 262142 = 1 + 5099490 // 262142 = 1 + 19
        (512, 20),
        # Out of range: clamped like the kernel clamps shares.
        (0, 1),
        (-5, 1),
        (10**9, 10000),
    ],
)
def test_cpu_shares_to_weight(shares: int, weight: int) -> None:
    assert cpu_shares_to_weight(shares) == weight


@given(st.integers())
def test_weight_is_in_range_and_matches_kubelet_formula(shares: int) -> None:
    weight = cpu_shares_to_weight(shares)
    assert 1 <= weight <= 10000
    clamped = min(max(shares, 2), 262144)
    assert weight == 1 + ((clamped - 2) * 9999) // 262142


@given(st.integers(min_value=2, max_value=262143))
def test_weight_is_monotonic(shares: int) -> None:
    assert cpu_shares_to_weight(shares) <= cpu_shares_to_weight(shares + 1)


@pytest.mark.parametrize(("shares", "stored"), [(0, 2), (2, 2), (1024, 1024), (300000, 262144)])
def test_clamp_cpu_shares(shares: int, stored: int) -> None:
    assert clamp_cpu_shares(shares) == stored


@pytest.mark.parametrize("field", ["cpu_quota", "memory_limit"])
@pytest.mark.parametrize("bad", [0, -2, -100])
def test_values_refuse_non_positive_limits_other_than_unlimited(field: str, bad: int) -> None:
    kwargs = {"cpu_shares": 2, "cpu_quota": UNLIMITED, "memory_limit": UNLIMITED, field: bad}
    with pytest.raises(ValueError, match=field):
        check_writable(CgroupValues(**kwargs))


def test_values_accept_unlimited() -> None:
    values = CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)
    check_writable(values)
    assert values.cpu_quota == values.memory_limit == -1


def test_one_value_type_and_one_set_of_limits_for_policy_and_cgroups() -> None:
    for name in ("CgroupValues", "UNLIMITED", "CPU_SHARES_MIN", "CPU_SHARES_MAX"):
        assert getattr(cgroup_values, name) is getattr(calculate, name), name


@pytest.mark.parametrize(
    ("shares", "weights"),
    [
        # The ends and kubelet's default, where runc 1.3's curve is pinned: 1, 100, 10000.
        (2, (1, 1)),
        (1024, (39, 100)),
        (262144, (10000, 10000)),
        # Out of range: as the runtime clamps.
        (0, (1, 1)),
        (10**9, (10000, 10000)),
        # l = 11: 10^((121 + 1375) / 612 - 7/34) = 10^2.2386... = 173.2..., rounded up.
        (2048, (79, 174)),
    ],
)
def test_runtime_cpu_weights(shares: int, weights: tuple[int, int]) -> None:
    assert runtime_cpu_weights(shares) == weights


@given(st.integers(min_value=2, max_value=262143))
def test_runtime_cpu_weights_are_in_range_and_monotonic(shares: int) -> None:
    low, high = runtime_cpu_weights(shares), runtime_cpu_weights(shares + 1)
    assert all(1 <= w <= 10000 for w in low)
    assert low[0] <= high[0] and low[1] <= high[1]
