"""Pod records on the host: round trips, and every bad file refused without harm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nri_midbatch.policy import CgroupValues, NativeLimits
from nri_midbatch.state.store import (
    MAX_CONTAINERS,
    MAX_FILE_BYTES,
    PRUNE_PER_PIECE,
    SYNC_READ_BYTES,
    BaselineStore,
    Kept,
    PodRecord,
    ReadBudget,
)

UID = "f2427b7d-c2e2-468d-9120-fb7404a46e60"
RECORD = PodRecord(
    Kept(NativeLimits(cpu_quota=150_000, memory_limit=1 << 30, cpu_shares=1536)),
    {
        "c1": Kept(
            NativeLimits(cpu_quota=50_000, cpu_period=100_000, cpu_shares=512),
            CgroupValues(None, 41_667, None),
        )
    },
)


def test_a_record_comes_back_as_it_was_kept(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "pods")
    store.save(UID, RECORD)
    assert store.uids() == {UID}
    assert BaselineStore(tmp_path / "pods").load(UID) == RECORD
    store.remove(UID)
    assert store.load(UID) is None and store.uids() == frozenset()
    assert store.failures == 0


def test_prune_keeps_only_live_pods(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for uid in ("a", "b", "c"):
        store.save(uid, RECORD)
    assert store.prune(frozenset({"b"})) == 2
    assert store.uids() == {"b"}


@pytest.mark.parametrize("uid", ["../etc", "a/b", "", ".hidden", "x" * 200])
def test_unsafe_uids_are_never_paths(tmp_path: Path, uid: str) -> None:
    store = BaselineStore(tmp_path / "pods")
    store.save(uid, RECORD)
    assert store.load(uid) is None
    assert not (tmp_path / "pods").exists() or os.listdir(tmp_path / "pods") == []


def test_a_fifo_a_link_and_a_huge_file_are_refused_without_blocking(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "target").write_text("{}")
    os.symlink(tmp_path / "target", tmp_path / "link.json")
    with open(tmp_path / "huge.json", "wb") as file:
        file.truncate(MAX_FILE_BYTES + 1)
    assert store.load("fifo") is None
    assert store.load("link") is None
    assert store.load("huge") is None
    assert store.failures == 2 and store.refused == {"size": 1}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        "\xff",
        '{"format": 2, "pod": {"kubelet": {}}}',
        '{"format": true, "pod": {"kubelet": {}}}',
        '{"format": 1}',
        '{"format": 1, "pod": {"kubelet": []}}',
        '{"format": 1, "pod": {"kubelet": {}, "set": {"cpuShares": 2}}}',
        '{"format": 1, "pod": {"kubelet": {}, "set": []}}',
        '{"format": 1, "pod": {"kubelet": {}}, "containers": []}',
        '{"format": 1, "pod": null, "containers": {"c": 5}}',
    ],
)
def test_a_file_that_is_not_a_record_is_counted_and_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / "p.json").write_text(text)
    store = BaselineStore(tmp_path)
    assert store.load("p") is None
    assert store.refused == {"format": 1} and store.failures == 0


@pytest.mark.parametrize(("opening", "depth"), [("[", 200_000), ('{"a":', 100_000)])
def test_a_record_nested_deep_is_refused_not_raised(
    tmp_path: Path, opening: str, depth: int
) -> None:
    """200 KB of `[` made every Synchronize answer status 2 (RecursionError)."""
    (tmp_path / "p.json").write_text(opening * depth)
    store = BaselineStore(tmp_path)
    with capture_logs() as logs:
        assert store.load("p") is None
    assert store.refused == {"format": 1}
    assert [(e["log_level"], e["pod_uid"], e["reason"]) for e in logs] == [
        ("warning", "p", "format")
    ]


def _pod_kept(kubelet: str, applied: str | None = None) -> str:
    kept = f'{{"kubelet": {kubelet}' + ("" if applied is None else f', "set": {applied}') + "}"
    return f'{{"format": 1, "pod": {kept}}}'


@pytest.mark.parametrize(
    "text",
    [
        _pod_kept('{"cpuQuota": -5}'),
        _pod_kept('{"cpuQuota": 999}'),
        _pod_kept('{"cpuQuota": 18446744073709551614}'),
        _pod_kept(f'{{"cpuQuota": {1 << 44}}}'),
        _pod_kept('{"cpuQuota": 100000.0}'),
        _pod_kept('{"memoryLimit": 1e30}'),
        _pod_kept(f'{{"memoryLimit": {10**30}}}'),
        _pod_kept('{"memoryLimit": 0}'),
        _pod_kept('{"cpuShares": 1}'),
        _pod_kept('{"cpuShares": 262145}'),
        _pod_kept('{"cpuShares": true}'),
        _pod_kept('{"cpuPeriod": 999}'),
        _pod_kept('{"cpuPeriod": 1000001}'),
        _pod_kept('{"cpuQuota": "100000"}'),
        _pod_kept("{}", '{"cpuQuota": -5}'),
        _pod_kept("{}", '{"cpuQuota": 0}'),
        _pod_kept("{}", f'{{"cpuQuota": {1 << 63}}}'),
        _pod_kept("{}", '{"cpuQuota": 50000, "memoryLimit": -2}'),
        _pod_kept("{}", '{"cpuQuota": 50000, "cpuShares": 0}'),
        _pod_kept("{}", '{"cpuQuota": false}'),
    ],
)
def test_values_no_cgroup_file_holds_refuse_the_record(tmp_path: Path, text: str) -> None:
    (tmp_path / "p.json").write_text(text)
    store = BaselineStore(tmp_path)
    assert store.load("p") is None
    assert store.refused == {"values": 1}


def test_values_at_the_edges_of_what_a_cgroup_file_holds_are_taken(tmp_path: Path) -> None:
    kubelet = NativeLimits(
        cpu_quota=(1 << 44) - 1, cpu_period=1_000_000, memory_limit=(1 << 63) - 1, cpu_shares=2
    )
    low = NativeLimits(cpu_quota=1000, cpu_period=1000, memory_limit=1, cpu_shares=262_144)
    record = PodRecord(
        Kept(kubelet, CgroupValues(262_144, -1, -1)),
        {
            "c": Kept(low, CgroupValues(2, 1, (1 << 63) - 1)),
            "d": Kept(low, CgroupValues(None, 1, None)),
        },
    )
    store = BaselineStore(tmp_path)
    store.save(UID, record)
    assert store.load(UID) == record and store.refused == {}


def test_a_record_past_the_bound_is_not_written(tmp_path: Path) -> None:
    many = {f"c{n:06}": RECORD.containers["c1"] for n in range(MAX_CONTAINERS + 1)}
    store = BaselineStore(tmp_path)
    store.save(UID, PodRecord(RECORD.pod, many))
    assert store.uids() == frozenset() and store.failures == 1


def test_the_largest_pod_claimed_fits_a_record(tmp_path: Path) -> None:
    """2,000 containers, each resized, at the largest values a cgroup file takes."""
    top = NativeLimits((1 << 44) - 1, 1_000_000, (1 << 63) - 1, 262_144)
    kept = Kept(top, CgroupValues(262_144, (1 << 63) - 1, (1 << 63) - 1))
    record = PodRecord(kept, {f"{n:064x}": kept for n in range(2_000)})
    store = BaselineStore(tmp_path)
    store.save(UID, record)
    assert store.load(UID) == record and store.failures == 0


def test_a_file_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    kept = '"c{}":{{"kubelet":{{}}}}'
    body = ",".join(kept.format(n) for n in range(MAX_FILE_BYTES // 16))
    text = '{"format":1,"pod":null,"containers":{' + body + "}}"
    assert len(text) > MAX_FILE_BYTES
    (tmp_path / "p.json").write_text(text)
    store = BaselineStore(tmp_path)
    assert store.load("p") is None and store.refused == {"size": 1}


def test_a_record_with_more_containers_than_the_bound_is_refused(tmp_path: Path) -> None:
    body = ",".join(f'"c{n}":{{"kubelet":{{}}}}' for n in range(MAX_CONTAINERS + 1))
    (tmp_path / "p.json").write_text('{"format":1,"pod":null,"containers":{' + body + "}}")
    store = BaselineStore(tmp_path)
    assert store.load("p") is None and store.refused == {"containers": 1}


def test_one_synchronize_reads_records_up_to_its_budget(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for uid in ("a", "b", "c"):
        store.save(uid, RECORD)
    size = (tmp_path / "a.json").stat().st_size
    budget = ReadBudget(2 * size)
    assert [store.load(uid, budget) for uid in ("a", "b", "c")] == [RECORD, RECORD, None]
    assert store.refused == {"budget": 1} and budget.left == 0
    assert store.load("c") == RECORD  # no budget: outside a Synchronize


def test_a_budget_past_the_default_refuses_what_is_beyond_it(tmp_path: Path) -> None:
    """SYNC_READ_BYTES is what one Synchronize reads, whatever the records' sizes."""
    store = BaselineStore(tmp_path)
    body = "0" * (MAX_FILE_BYTES - 64)
    text = '{"format":1,"pod":{"kubelet":{"cpuQuota":100000}},"pad":"' + body + '"}'
    count = SYNC_READ_BYTES // len(text) + 2
    for n in range(count):
        (tmp_path / f"p{n}.json").write_text(text)
    budget = ReadBudget()
    loaded = [store.load(f"p{n}", budget) for n in range(count)]
    assert sum(r is not None for r in loaded) == SYNC_READ_BYTES // len(text)
    assert store.refused == {"budget": count - SYNC_READ_BYTES // len(text)}


def test_without_a_directory_nothing_is_kept(tmp_path: Path) -> None:
    store = BaselineStore(None)
    store.save(UID, RECORD)
    assert not store.keeping and store.load(UID) is None and store.uids() == frozenset()


def test_an_unwritable_directory_is_counted_not_raised(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = BaselineStore(tmp_path / "file" / "pods")
    store.save(UID, RECORD)
    assert store.failures == 1


def _planted(tmp_path: Path, *names: str) -> tuple[Path, Path]:
    """A state directory with links of `names` to a file outside it: (directory, file)."""
    pods = tmp_path / "pods"
    pods.mkdir()
    outside = tmp_path / "outside"
    outside.write_text("precious")
    for name in names:
        os.symlink(outside, pods / name)
    return pods, outside


def test_a_link_planted_as_the_temporary_file_is_never_written_through(tmp_path: Path) -> None:
    """`.<uid>.json.tmp` linked to a file outside made the next write overwrite that file."""
    pods, outside = _planted(tmp_path, f".{UID}.json.tmp", f"{UID}.json.new")
    store = BaselineStore(pods)
    store.save(UID, RECORD)
    assert outside.read_text() == "precious"
    assert store.load(UID) == RECORD and store.failures == 0


def test_a_link_planted_as_the_record_is_replaced_not_followed(tmp_path: Path) -> None:
    pods, outside = _planted(tmp_path, f"{UID}.json")
    store = BaselineStore(pods)
    assert store.load(UID) is None  # read through no link either
    store.save(UID, RECORD)
    assert outside.read_text() == "precious"
    assert not (pods / f"{UID}.json").is_symlink() and store.load(UID) == RECORD
    store.remove(UID)
    assert outside.exists()


def test_a_state_directory_that_is_a_link_is_neither_written_nor_pruned(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.json").write_text("{}")
    os.symlink(elsewhere, tmp_path / "pods")
    store = BaselineStore(tmp_path / "pods")
    store.save(UID, RECORD)
    assert store.prune(frozenset()) == 0
    store.remove("a")
    assert os.listdir(elsewhere) == ["a.json"]
    assert store.failures == 3


def test_a_write_leaves_no_temporary_behind(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for _ in range(3):
        store.save(UID, RECORD)
    assert os.listdir(tmp_path) == [f"{UID}.json"]
    assert (tmp_path / f"{UID}.json").stat().st_mode & 0o777 == 0o600


def test_pruning_goes_a_slice_of_the_directory_at_a_time(tmp_path: Path) -> None:
    """30,000 stale records were removed in one piece of work (1.15 s)."""
    store = BaselineStore(tmp_path)
    stale = 3 * PRUNE_PER_PIECE
    for n in range(stale):
        store.save(f"gone-{n}", RECORD)
    (tmp_path / f".gone-0.json.{'0' * 16}.tmp").write_text("left by a crash")
    live = {"new"}
    asked = 0

    def alive() -> set[str]:
        nonlocal asked
        asked += 1
        return live

    pieces = []
    for removed in store.pruning(alive):
        pieces.append(removed)
        if len(pieces) == 1:
            store.save("new", RECORD)  # a pod started between two pieces keeps its record
    assert len(pieces) >= 3 and max(pieces) <= PRUNE_PER_PIECE
    assert sum(pieces) == stale + 1 and asked == len(pieces)
    assert os.listdir(tmp_path) == ["new.json"]
