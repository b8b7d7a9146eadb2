"""The outcome of applying pod values: one entry per file, so partial success is visible."""

import errno as errno_codes
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nri_midbatch.cgroups.files import CgroupVersion


@dataclass(frozen=True)
class FileWrite:
    """A file that held `old` and was written `new` (both as text, stripped)."""

    path: Path
    old: str
    new: str


@dataclass(frozen=True)
class FileUnchanged:
    """A file that already held the wanted value, so it was not written."""

    path: Path
    value: str


@dataclass(frozen=True)
class FileFailure:
    """A file that could not be read or written; the others were still attempted."""

    path: Path
    operation: Literal["read", "write"]
    errno: int | None
    error: str

    @classmethod
    def from_os_error(
        cls, path: Path, operation: Literal["read", "write"], exc: OSError
    ) -> "FileFailure":
        return cls(path, operation, exc.errno, describe_os_error(exc))


@dataclass(frozen=True)
class WriteReport:
    version: CgroupVersion
    written: tuple[FileWrite, ...]
    unchanged: tuple[FileUnchanged, ...]
    failed: tuple[FileFailure, ...]

    @property
    def ok(self) -> bool:
        return not self.failed


def describe_os_error(exc: OSError) -> str:
    """`EBUSY: Device or resource busy`: the symbolic name is what people search for."""
    if exc.errno is None:
        return str(exc)
    name = errno_codes.errorcode.get(exc.errno, f"errno {exc.errno}")
    return f"{name}: {exc.strerror}"
