"""Noticing that watched files changed: the configuration, the webhook's certificate.

Polling a stat signature is enough for files that change a few times a
day, needs no inotify binding, and sees a Kubernetes ConfigMap or Secret
update, which swaps a symlink (a new inode behind the same path).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Per file: (inode, size, mtime), or None while it cannot be examined (gone).
Signature = tuple[tuple[int, int, int] | None, ...]


def signature(paths: tuple[Path, ...]) -> Signature:
    result: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows the ..data symlink a mounted volume swaps
        except OSError:
            result.append(None)
        else:
            result.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(result)


class FileWatch:
    """Reports each change of the files' signature once.

    With `settle` (the configuration), a change is reported once the files
    have held still for one poll: editors and `echo > file` truncate before
    they write, and a poll between the two would see an empty file, which
    is a valid configuration (all defaults). A file that vanishes is a
    change too, once settled: the reader finds it gone and says so.
    """

    def __init__(self, *paths: str | Path, settle: bool = True) -> None:
        self.paths = tuple(Path(path) for path in paths)
        self._settle = settle
        self._seen = signature(self.paths)
        self._pending = self._seen

    def changed(self) -> bool:
        current = signature(self.paths)
        settled = current == self._pending or not self._settle
        self._pending = current
        if current == self._seen or not settled:
            return False
        self._seen = current
        return True
