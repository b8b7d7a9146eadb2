"""Which NRI version a runtime speaks (reference §3.2, §5.3, §5.4, checklist item 14)."""

from __future__ import annotations

import pytest

from nri_midbatch.nri.events import POD_EVENTS, Event, mask
from nri_midbatch.nri.version import (
    OLDEST,
    SAFE_UPDATE_CONTAINERS,
    format_version,
    nri_version,
    parse,
    valid_events,
)


@pytest.mark.parametrize(
    ("runtime_version", "expected"),
    [
        ("v1.7.0", (0, 3, 0)),
        ("v1.7.6", (0, 3, 0)),
        ("v1.7.7", (0, 4, 0)),
        ("v1.7.13", (0, 4, 0)),
        ("v1.7.14", (0, 6, 0)),
        ("v1.7.16", (0, 6, 1)),
        ("v1.7.24", (0, 6, 1)),
        ("1.7.24~ds1", (0, 6, 1)),  # Debian's package version string
        ("v1.7.25", (0, 6, 1)),
        ("v1.7.26", (0, 8, 0)),
        ("v2.0.0", (0, 8, 0)),
        ("v2.1.4", (0, 8, 0)),
        ("v2.1.4-12-gdeadbee", (0, 8, 0)),  # git describe
        ("v2.2.0", (0, 10, 0)),
        ("v2.2.1", (0, 11, 0)),
        ("v2.3.0", (0, 12, 0)),
        ("v2.4.0-beta.0", (0, 12, 1)),
        ("v3.0.0", (0, 12, 1)),  # newer than the table: at least the newest known
        ("v1.6.20", OLDEST),  # before NRI existed in containerd
    ],
)
def test_containerd_versions(runtime_version: str, expected: tuple[int, int, int]) -> None:
    assert nri_version("", "containerd", runtime_version) == expected


@pytest.mark.parametrize(
    ("runtime_version", "expected"),
    [
        ("1.26.0", (0, 2, 0)),
        ("1.26.1", (0, 2, 0)),
        ("1.26.2", (0, 3, 0)),
        ("1.28.4", (0, 3, 0)),
        ("1.29.0", (0, 5, 0)),
        ("1.29.2", (0, 6, 0)),
        ("1.30.0", (0, 6, 0)),
        ("1.31.2", (0, 6, 1)),
        ("v1.31.2", (0, 6, 1)),
        ("1.32.0", (0, 9, 0)),
        ("1.34.0", (0, 10, 0)),
        ("1.35.1", (0, 11, 0)),
        ("1.36.2", (0, 11, 0)),
        ("1.37.0", (0, 12, 0)),
        ("v1.37.1", (0, 12, 0)),
        # Newer than the table: at least the newest NRI it knows.
        ("1.38.0", (0, 12, 0)),
    ],
)
def test_crio_versions(runtime_version: str, expected: tuple[int, int, int]) -> None:
    assert nri_version("", "cri-o", runtime_version) == expected


@pytest.mark.parametrize(
    ("runtime_name", "runtime_version"),
    [
        ("containerd", "garbage"),
        ("containerd", ""),
        ("containerd", "latest"),
        ("cri-o", "x1.34.0"),
        ("podman", "v5.0.0"),
        ("", "v2.3.0"),
        ("", ""),
    ],
)
def test_unknown_runtimes_are_assumed_oldest(runtime_name: str, runtime_version: str) -> None:
    assert nri_version("", runtime_name, runtime_version) == OLDEST
    assert valid_events(nri_version("", runtime_name, runtime_version)) == 0x7FF


def test_declared_nri_version_wins_over_the_tables() -> None:
    assert nri_version("v0.12.0", "containerd", "v1.7.0") == (0, 12, 0)
    assert nri_version("v0.12.2", "", "") == (0, 12, 2)
    assert nri_version("0.13", "cri-o", "1.26.0") == (0, 13, 0)


def test_undecodable_declared_version_falls_back_to_the_tables() -> None:
    assert nri_version("unknown", "containerd", "v2.2.0") == (0, 10, 0)
    assert nri_version("", "containerd", "v2.2.0") == (0, 10, 0)


@pytest.mark.parametrize(
    ("version", "events"),
    [
        ((0, 2, 0), 0x7FF),
        ((0, 3, 0), 0x7FF),
        ((0, 8, 0), 0x7FF),
        ((0, 9, 1), 0x7FF),
        ((0, 10, 0), 0x3FFF),
        ((0, 11, 0), 0x3FFF),
        ((0, 12, 2), 0x3FFF),
        ((1, 0, 0), 0x3FFF),
    ],
)
def test_valid_events(version: tuple[int, int, int], events: int) -> None:
    assert valid_events(version) == events


@pytest.mark.parametrize(
    ("runtime_name", "runtime_version", "events"),
    [
        ("containerd", "v1.7.24", 0x7FF),
        ("containerd", "v2.1.4", 0x7FF),
        ("containerd", "v2.2.0", 0x3FFF),
        ("cri-o", "1.31.2", 0x7FF),
        ("cri-o", "1.33.0", 0x7FF),
        ("cri-o", "1.34.0", 0x3FFF),
    ],
)
def test_new_events_only_from_containerd_2_2_and_crio_1_34(
    runtime_name: str, runtime_version: str, events: int
) -> None:
    assert valid_events(nri_version("", runtime_name, runtime_version)) == events


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("v1.2.3", (1, 2, 3)),
        ("1.2.3", (1, 2, 3)),
        ("v1.2", (1, 2, 0)),
        (" v2.0.1 \n", (2, 0, 1)),
        ("1.2.3-rc.1+meta", (1, 2, 3)),
        ("v10.20.30", (10, 20, 30)),
        ("", None),
        ("v", None),
        ("1", None),
        ("x1.2.3", None),
        ("version 1.2.3", None),
    ],
)
def test_parse(text: str, parsed: tuple[int, int, int] | None) -> None:
    assert parse(text) == parsed


def test_format_version() -> None:
    assert format_version((0, 12, 2)) == "v0.12.2"
    assert format_version(SAFE_UPDATE_CONTAINERS) == "v0.12.2"
    assert parse(format_version((3, 14, 15))) == (3, 14, 15)


def test_event_bits_and_masks() -> None:
    assert Event.RUN_POD_SANDBOX.bit == 0x1
    assert Event.CREATE_CONTAINER.bit == 0x8
    assert Event.START_CONTAINER.bit == 0x20
    assert Event.REMOVE_CONTAINER.bit == 0x400
    assert Event.UPDATE_POD_SANDBOX.bit == 0x800
    assert Event.VALIDATE_CONTAINER_ADJUSTMENT.bit == 0x2000
    assert mask(frozenset(Event)) == 0x3FFF
    assert mask(frozenset(e for e in Event if e <= Event.REMOVE_CONTAINER)) == 0x7FF
    assert mask(frozenset({Event.CREATE_CONTAINER, Event.START_CONTAINER})) == 0x28
    assert mask(frozenset()) == 0
    assert (
        frozenset(
            {
                Event.RUN_POD_SANDBOX,
                Event.STOP_POD_SANDBOX,
                Event.REMOVE_POD_SANDBOX,
                Event.POST_UPDATE_POD_SANDBOX,
            }
        )
        == POD_EVENTS
    )
