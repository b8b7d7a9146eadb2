"""FileWatch reports a configuration change once the file holds still."""

from __future__ import annotations

import os
from pathlib import Path

from nri_midbatch.process.reload import FileWatch


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


def test_a_vanished_file_is_a_change_once_settled(tmp_path: Path) -> None:
    # The reader then finds it gone, and refuses the reload with that reason.
    path = tmp_path / "config.yaml"
    rewrite(path, "failurePolicy: Ignore\n", stamp=1)
    watch = FileWatch(path)
    path.unlink()
    assert not watch.changed()
    assert watch.changed()
    assert not watch.changed()
    rewrite(path, "failurePolicy: Ignore\n", stamp=4)
    # Back (the inode number may be reused, the time is new): a change, once settled.
    assert not watch.changed()
    assert watch.changed()


def test_without_settling_each_change_of_any_file_is_reported_at_once(tmp_path: Path) -> None:
    # The webhook's certificate and key: loaded together, retried on every change.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    rewrite(cert, "a", stamp=1)
    rewrite(key, "a", stamp=1)
    watch = FileWatch(cert, key, settle=False)
    assert not watch.changed()
    rewrite(cert, "b", stamp=2)
    assert watch.changed()
    assert not watch.changed()
    rewrite(key, "b", stamp=2)
    assert watch.changed()
    key.unlink()
    assert watch.changed()
