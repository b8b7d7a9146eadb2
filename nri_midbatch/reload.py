"""Noticing that the configuration file changed.

Polling a stat signature is enough for a file that changes a few times a
day, needs no inotify binding, and sees a Kubernetes ConfigMap update, which
swaps a symlink (a new inode behind the same path). A change is acted on one
poll after it is seen, once the file holds still.
"""

from __future__ import annotations

import os
from pathlib import Path

Signature = tuple[int, int, int] | None


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class FileWatch:
    """Reports a change once the file has held still for one poll.

    Editors and `echo > file` truncate before they write: a poll between the
    two would see an empty file, which is a valid configuration (all
    defaults). Waiting until two polls agree skips such half-written states.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen = _signature(self.path)
        self._pending: Signature = self._seen

    def changed(self) -> bool:
        """True once for each settled change (a vanished file is no change)."""
        current = _signature(self.path)
        settled = current == self._pending
        self._pending = current
        if current is None or current == self._seen or not settled:
            return False
        self._seen = current
        return True
