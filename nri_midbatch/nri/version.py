"""Which NRI version a runtime speaks, and what that allows.

Newer runtimes say so in `NRI_version`; older ones only give their own name
and version, which we map through the NRI version each release vendors. An
unknown runtime is assumed to be the oldest, because asking an old runtime for
events it does not know gets the plugin disconnected, while asking a new
runtime for fewer events costs nothing.
"""

from __future__ import annotations

import re

Version = tuple[int, int, int]

OLDEST: Version = (0, 2, 0)

_SEMVER = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")

# (first release, NRI version it vendors), ascending. From the runtimes' go.mod.
_CONTAINERD: tuple[tuple[Version, Version], ...] = (
    ((1, 7, 0), (0, 3, 0)),
    ((1, 7, 7), (0, 4, 0)),
    ((1, 7, 14), (0, 6, 0)),
    ((1, 7, 16), (0, 6, 1)),
    ((1, 7, 26), (0, 8, 0)),
    ((2, 0, 0), (0, 8, 0)),
    ((2, 2, 0), (0, 10, 0)),
    ((2, 2, 1), (0, 11, 0)),
    ((2, 3, 0), (0, 12, 0)),
    ((2, 4, 0), (0, 12, 1)),
)
_CRIO: tuple[tuple[Version, Version], ...] = (
    ((1, 26, 0), (0, 2, 0)),
    ((1, 26, 2), (0, 3, 0)),
    ((1, 27, 0), (0, 3, 0)),
    ((1, 29, 0), (0, 5, 0)),
    ((1, 29, 2), (0, 6, 0)),
    ((1, 31, 0), (0, 6, 1)),
    ((1, 32, 0), (0, 9, 0)),
    ((1, 33, 0), (0, 9, 0)),
    ((1, 34, 0), (0, 10, 0)),
    ((1, 35, 0), (0, 11, 0)),
    # 1.36 not checked: it maps to v0.11.0 above, which asks for the same
    # events (0x3FFF) and keeps UpdateContainers off just as v0.12.0 would.
    # 1.37 vendors v0.12.0 (issue 15: measured on CRI-O 1.37.0); from v0.12
    # the runtime also sends NRI_version itself.
    ((1, 37, 0), (0, 12, 0)),
)
_RUNTIMES = {"containerd": _CONTAINERD, "cri-o": _CRIO}

#: Events UPDATE_POD_SANDBOX .. VALIDATE_CONTAINER_ADJUSTMENT exist from here.
EVENTS_V010: Version = (0, 10, 0)
#: Runtimes before this hold a lock around UpdateContainers that can deadlock
#: against their own lifecycle paths (fixed after v0.12.1, in v0.12.2).
SAFE_UPDATE_CONTAINERS: Version = (0, 12, 2)


def parse(text: str) -> Version | None:
    match = _SEMVER.match(text.strip())
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def nri_version(nri_version_field: str, runtime_name: str, runtime_version: str) -> Version:
    """The runtime's NRI version, from Configure's fields."""
    declared = parse(nri_version_field) if nri_version_field else None
    if declared is not None:
        return declared
    table = _RUNTIMES.get(runtime_name.strip().lower())
    release = parse(runtime_version)
    if table is None or release is None:
        return OLDEST
    # A release newer than the table vendors at least the newest NRI we know.
    found = OLDEST
    for first, vendored in table:
        if release >= first:
            found = vendored
    return found


def valid_events(version: Version) -> int:
    """The event mask a runtime of this NRI version accepts."""
    return 0x3FFF if version >= EVENTS_V010 else 0x7FF


def format_version(version: Version) -> str:
    return "v{}.{}.{}".format(*version)
