"""Noticing that the configuration file changed.

Polling a stat signature is enough for a file that changes a few times a
day, needs no inotify binding, and sees a Kubernetes ConfigMap update, which
swaps a symlink (a new inode behind the same path).
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
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen = _signature(self.path)

    def changed(self) -> bool:
        """True once for each change since the last call (a vanished file is no change)."""
        current = _signature(self.path)
        if current is None or current == self._seen:
            return False
        self._seen = current
        return True
