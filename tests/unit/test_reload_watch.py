"""FileWatch reports a configuration change once the file holds still."""

from __future__ import annotations

import os
from pathlib import Path

from nri_midbatch.reload import FileWatch


def rewrite(path: Path, text: str, *, stamp: int) -> None:
    path.write_text(text)
    # Same-second rewrites must still differ: pin distinct mtimes.
    os.utime(path, ns=(stamp, stamp))


def test_a_change_is_reported_once_after_one_quiet_poll(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    rewrite(path, "failurePolicy: Ignore\n", stamp=1)
    watch = FileWatch(path)
    assert not watch.changed()
    rewrite(path, "failurePolicy: Fail\n", stamp=2)
    assert not watch.changed()  # seen, not yet settled
    assert watch.changed()
    assert not watch.changed()


def test_a_truncated_moment_is_never_reported(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    rewrite(path, "failurePolicy: Ignore\n", stamp=1)
    watch = FileWatch(path)
    rewrite(path, "", stamp=2)  # an editor truncates ...
    assert not watch.changed()
    rewrite(path, "failurePolicy: Fail\n", stamp=3)  # ... then writes
    assert not watch.changed()
    assert watch.changed()
    assert path.read_text() == "failurePolicy: Fail\n"


def test_a_vanished_file_is_no_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    rewrite(path, "failurePolicy: Ignore\n", stamp=1)
    watch = FileWatch(path)
    path.unlink()
    assert not watch.changed()
    assert not watch.changed()
    rewrite(path, "failurePolicy: Ignore\n", stamp=4)
    # Back (the inode number may be reused, the time is new): a change, once settled.
    assert not watch.changed()
    assert watch.changed()
