"""Pod records on the host: round trips, and every bad file refused without harm."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_midbatch.policy import CgroupValues, NativeLimits
from nri_midbatch.state.store import MAX_FILE_BYTES, BaselineStore, Kept, PodRecord

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
    assert store.failures == 3


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": 2, "pod": {"kubelet": {}}}',
        '{"format": 1, "pod": {"kubelet": {"cpuQuota": "1"}}}',
        '{"format": 1, "pod": {"kubelet": {}, "set": {"cpuShares": 2}}}',
        '{"format": 1, "pod": {"kubelet": {}}, "containers": []}',
    ],
)
def test_a_file_that_is_not_a_record_is_counted_and_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / "p.json").write_text(text)
    store = BaselineStore(tmp_path)
    assert store.load("p") is None
    assert store.failures == 1


def test_a_record_past_the_bound_is_not_written(tmp_path: Path) -> None:
    many = {f"c{n:06}": RECORD.containers["c1"] for n in range(20_000)}
    store = BaselineStore(tmp_path)
    store.save(UID, PodRecord(RECORD.pod, many))
    assert store.uids() == frozenset() and store.failures == 1


def test_without_a_directory_nothing_is_kept(tmp_path: Path) -> None:
    store = BaselineStore(None)
    store.save(UID, RECORD)
    assert not store.keeping and store.load(UID) is None and store.uids() == frozenset()


def test_an_unwritable_directory_is_counted_not_raised(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = BaselineStore(tmp_path / "file" / "pods")
    store.save(UID, RECORD)
    assert store.failures == 1
