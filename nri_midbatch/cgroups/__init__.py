"""cgroup files written directly: pods, because NRI cannot adjust a pod sandbox,
and containers, when a new configuration must reach them on a runtime whose
UpdateContainers is unsafe.

`paths`, `values` and `files` are pure; `fs` holds all of the file I/O.
"""

from nri_midbatch.cgroups.files import CgroupVersion
from nri_midbatch.cgroups.fs import (
    DEFAULT_CGROUP_ROOT,
    apply_values,
    detect_version,
    read_values,
)
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupLocation, CgroupPathError
from nri_midbatch.cgroups.report import FileFailure, FileUnchanged, FileWrite, WriteReport
from nri_midbatch.cgroups.values import (
    UNLIMITED,
    CgroupReading,
    CgroupValues,
    cpu_shares_to_weight,
)

__all__ = [
    "DEFAULT_CGROUP_ROOT",
    "UNLIMITED",
    "CgroupDriver",
    "CgroupLocation",
    "CgroupPathError",
    "CgroupReading",
    "CgroupValues",
    "CgroupVersion",
    "FileFailure",
    "FileUnchanged",
    "FileWrite",
    "WriteReport",
    "apply_values",
    "cpu_shares_to_weight",
    "detect_version",
    "read_values",
]
