import pytest

from nri_midbatch.cgroups.files import (
    CPU_CFS_QUOTA_US,
    CPU_MAX,
    CPU_SHARES,
    CPU_WEIGHT,
    MEMORY_LIMIT_IN_BYTES,
    MEMORY_MAX,
    CgroupFile,
    CgroupVersion,
    Setting,
    needs_write,
    parse_value,
    pod_settings,
)
from nri_midbatch.cgroups.values import UNLIMITED, CgroupValues
from tests.factory import GI as GIB


def test_v1_settings_in_write_order() -> None:
    values = CgroupValues(cpu_shares=512, cpu_quota=50000, memory_limit=GIB)
    assert pod_settings(CgroupVersion.V1, values) == (
        Setting(CPU_SHARES, 512, "512"),
        Setting(CPU_CFS_QUOTA_US, 50000, "50000"),
        Setting(MEMORY_LIMIT_IN_BYTES, GIB, "1073741824"),
    )


def test_v2_settings_in_write_order() -> None:
    values = CgroupValues(cpu_shares=1024, cpu_quota=50000, memory_limit=GIB)
    assert pod_settings(CgroupVersion.V2, values) == (
        Setting(CPU_WEIGHT, 39, "39"),
        # Quota token only: the kernel keeps the current period.
        Setting(CPU_MAX, 50000, "50000"),
        Setting(MEMORY_MAX, GIB, "1073741824"),
    )


@pytest.mark.parametrize(("version", "text"), [(CgroupVersion.V1, "-1"), (CgroupVersion.V2, "max")])
def test_unlimited_text(version: CgroupVersion, text: str) -> None:
    values = CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)
    _, quota, memory = pod_settings(version, values)
    assert (quota.text, quota.value) == (text, UNLIMITED)
    assert (memory.text, memory.value) == (text, UNLIMITED)


def test_v1_shares_are_clamped_to_what_the_kernel_stores() -> None:
    values = CgroupValues(cpu_shares=1, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)
    assert pod_settings(CgroupVersion.V1, values)[0] == Setting(CPU_SHARES, 2, "2")


@pytest.mark.parametrize(
    ("file", "text", "value"),
    [
        (CPU_SHARES, "1024\n", 1024),
        (CPU_CFS_QUOTA_US, "-1\n", UNLIMITED),
        (CPU_CFS_QUOTA_US, "50000", 50000),
        (MEMORY_LIMIT_IN_BYTES, "9223372036854771712\n", UNLIMITED),
        # 64 KiB pages round LONG_MAX down further.
        (MEMORY_LIMIT_IN_BYTES, "9223372036854710272", UNLIMITED),
        (MEMORY_LIMIT_IN_BYTES, "1073741824", GIB),
        (CPU_WEIGHT, "100\n", 100),
        (CPU_MAX, "max 100000\n", UNLIMITED),
        (CPU_MAX, "50000 100000\n", 50000),
        (CPU_MAX, "50000", 50000),
        (MEMORY_MAX, "max\n", UNLIMITED),
        (MEMORY_MAX, "1073741824\n", GIB),
    ],
)
def test_parse_value(file: CgroupFile, text: str, value: int) -> None:
    assert parse_value(file, text) == value


@pytest.mark.parametrize("text", ["", "  \n", "abc", "1_000", "+5", "1.5", "١٢"])
def test_parse_value_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match=r"cpu\.shares"):
        parse_value(CPU_SHARES, text)


@pytest.mark.parametrize(
    ("setting", "current", "expected"),
    [
        (Setting(CPU_MAX, UNLIMITED, "max"), "max 100000", False),
        (Setting(CPU_MAX, 50000, "50000"), "max 100000", True),
        (Setting(CPU_MAX, 50000, "50000"), "50000 100000", False),
        (Setting(MEMORY_LIMIT_IN_BYTES, UNLIMITED, "-1"), "9223372036854771712", False),
        (Setting(CPU_SHARES, 1024, "1024"), "garbage", True),
    ],
)
def test_needs_write(setting: Setting, current: str, expected: bool) -> None:
    assert needs_write(setting, current) is expected
