"""Kubelet's values kept on the host, one small file per pod, so that they survive a restart.

A pod's cgroup holds the plugin's values once it has written them, and the runtime reports the
plugin's values for the containers it updated: a restarted plugin that read either as
kubelet's would ratchet. What cannot be found again elsewhere is kept here, by pod uid:

- the pod's baseline (read from its cgroup at RunPodSandbox, before the plugin wrote it) and
  the pod-level fields the plugin set;
- for containers whose native-limits annotation does not tell (resized since their creation,
  or first seen running at a Synchronize without it): their baseline and the fields set.

A file is written when what it holds changes, and removed with its pod; a Synchronize removes
those of pods the runtime no longer runs, a slice of the directory at a time (`pruning`).
Without a directory (replay, or one that cannot be written) nothing is kept, which is said
once, and counted in `failures`.

The directory is the plugin's, but what is in it is read as anyone's input. Bounded: one
file per pod the runtime runs, each of at most MAX_FILE_BYTES and MAX_CONTAINERS containers
(a larger one is not written, and not read), and at most SYNC_READ_BYTES read for one
Synchronize (`ReadBudget`). A file that is no record (not JSON, nested deeper than the
format, values no cgroup file holds or kubelet never writes) is refused: logged with the pod
uid, counted by reason in `refused`, and ignored, as if the pod had none.

Every file is opened relative to the directory's descriptor, itself opened without following
a link, and never through a link: a record is written to a fresh name created exclusively
(O_EXCL | O_NOFOLLOW) and renamed over the pod's file, so a link planted under either name
fails the write (counted) and never turns it into a write elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.counts import CounterFamily, family, single
from nri_midbatch.policy import CgroupValues, NativeLimits
from nri_midbatch.policy.calculate import shared_values
from nri_midbatch.policy.holdable import unholdable_kubelet, unholdable_set

__all__ = [
    "MAX_CONTAINERS",
    "MAX_FILE_BYTES",
    "REFUSALS",
    "SYNC_READ_BYTES",
    "BaselineStore",
    "Kept",
    "PodRecord",
    "ReadBudget",
]

log = structlog.get_logger(__name__)

#: A pod of 2,000 containers, each resized, takes about 460 KB (530 KB at the largest values).
MAX_FILE_BYTES = 640 * 1024
#: The containers one record may keep: the same pod, with room to spare.
MAX_CONTAINERS = 2_500
#: The bytes of records read for one Synchronize, in its reply (which the runtime allows 2 s):
#: reading and decoding them costs 40-150 ms a MiB on a busy 2-core VM. 10,000 pods with a
#: record (about 150 bytes each) and 10,000 containers kept (about 230 bytes each) take 3.8 MB.
SYNC_READ_BYTES = 4 * 1024 * 1024
#: Directory entries one piece of pruning looks at: a removal costs 20-110 us.
PRUNE_PER_PIECE = 16
#: Why a record was refused: larger than MAX_FILE_BYTES; not a record (not JSON, nested
#: deeper than the format, another shape); a value no cgroup file holds or kubelet never
#: writes; more than MAX_CONTAINERS containers; past the Synchronize's SYNC_READ_BYTES.
REFUSALS = ("size", "format", "values", "containers", "budget")
FORMAT = 1
#: Pod uids as Kubernetes makes them (a UUID), or any name that is safe as a file name.
_SAFE_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SUFFIX = ".json"
#: A record being written: `.<uid>.json.<random>.tmp`, never a uid (no leading dot).
_TEMPORARY = re.compile(r"\..+\.tmp")
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking and not through a link: a FIFO or a device put there must not hang or flood
# the plugin.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_KUBELET_KEYS = (
    ("cpuShares", "cpu_shares"),
    ("cpuQuota", "cpu_quota"),
    ("cpuPeriod", "cpu_period"),
    ("memoryLimit", "memory_limit"),
)
_VALUE_KEYS = (
    ("cpuShares", "cpu_shares"),
    ("cpuQuota", "cpu_quota"),
    ("memoryLimit", "memory_limit"),
)


@dataclass(frozen=True, slots=True)
class Kept:
    """One cgroup's baseline, and the values the plugin set on it (None: none)."""

    kubelet: NativeLimits
    applied: CgroupValues | None = None


@dataclass(slots=True)
class PodRecord:
    #: None: the pod's own baseline is not known for sure (only its containers' are kept).
    pod: Kept | None
    containers: dict[str, Kept] = field(default_factory=dict)


class Refused(ValueError):
    """Why a file is not taken as a record; `reason` is one of REFUSALS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReadBudget:
    """The bytes of records one Synchronize may still read (SYNC_READ_BYTES to begin with)."""

    __slots__ = ("left",)

    def __init__(self, total: int = SYNC_READ_BYTES) -> None:
        self.left = total


class BaselineStore:
    """The directory of pod records; every failure is logged and counted, never raised."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        #: Files that could not be read (not a regular file, an I/O error), written or removed.
        self.failures = 0
        #: reason (one of REFUSALS) -> files read and not taken as records.
        self.refused: dict[str, int] = {}
        self._said = False
        self._said_refused: set[str] = set()

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_baseline_record_failures",
            "Pod records of kubelet's values (--state-dir) that could not be read, written or"
            " removed",
            self.failures,
        )
        yield family(
            "nri_midbatch_baseline_records_refused",
            "Pod records under --state-dir read and not taken (as if the pod had none), by reason",
            ("reason",),
            {(reason,): n for reason, n in dict(self.refused).items()},
            zeros=[(reason,) for reason in REFUSALS],
        )

    @property
    def keeping(self) -> bool:
        return self.directory is not None

    def uids(self) -> frozenset[str]:
        """The uids of the pods with a record."""
        if self.directory is None:
            return frozenset()
        try:
            with self._opened() as directory:
                names = os.listdir(directory)
        except FileNotFoundError:
            return frozenset()
        except OSError as exc:
            self._failed("listed", exc)
            return frozenset()
        return frozenset(n[: -len(_SUFFIX)] for n in names if n.endswith(_SUFFIX))

    def load(self, uid: str, budget: ReadBudget | None = None) -> PodRecord | None:
        """The pod's record; None if it has none, or none that can be taken (said why).

        `budget`: the bytes the Synchronize reading it may still read, reduced by the file's.
        """
        name = self._name(uid)
        if name is None:
            return None
        try:
            data = self._read(name, budget)
            return _decode(_parsed(data))
        except FileNotFoundError:
            return None
        except Refused as exc:
            self._refused(exc, uid)
        except OSError as exc:
            self._failed("read", exc, uid)
        return None

    def save(self, uid: str, record: PodRecord) -> None:
        name = self._name(uid)
        if name is None:
            return
        if len(record.containers) > MAX_CONTAINERS:
            self._failed("written", ValueError(f"more than {MAX_CONTAINERS} containers"), uid)
            return
        data = json.dumps(_encode(record), separators=(",", ":")).encode()
        if len(data) > MAX_FILE_BYTES:
            self._failed("written", ValueError(f"larger than {MAX_FILE_BYTES} bytes"), uid)
            return
        assert self.directory is not None  # _name said so
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with self._opened() as directory:
                _replace(directory, name, data)
        except OSError as exc:
            self._failed("written", exc, uid)

    def remove(self, uid: str) -> None:
        name = self._name(uid)
        if name is None:
            return
        try:
            with self._opened() as directory:
                os.unlink(name, dir_fd=directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._failed("removed", exc, uid)

    def prune(self, live: frozenset[str]) -> int:
        """Remove the records of pods not in `live`; how many were removed."""
        return sum(self.pruning(lambda: live))

    def pruning(self, live: Callable[[], Collection[str]]) -> Iterator[int]:
        """Remove the records of pods not in `live()`, and temporaries a crash left behind,
        PRUNE_PER_PIECE directory entries at a time: how many each piece removed.

        `live()` is asked anew for each piece that finds a record to remove, so a pod that
        started meanwhile keeps its record.
        """
        if self.directory is None:
            return
        try:
            with self._opened() as directory, os.scandir(directory) as entries:
                while names := [entry.name for entry in itertools.islice(entries, PRUNE_PER_PIECE)]:
                    yield self._prune_names(directory, names, live)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._failed("listed", exc)

    def _prune_names(
        self, directory: int, names: list[str], live: Callable[[], Collection[str]]
    ) -> int:
        stale = [n for n in names if n.endswith(_SUFFIX) or _TEMPORARY.fullmatch(n)]
        if not stale:
            return 0
        alive = live()
        removed = 0
        for name in stale:
            if name.endswith(_SUFFIX) and name[: -len(_SUFFIX)] in alive:
                continue
            try:
                os.unlink(name, dir_fd=directory)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._failed("removed", exc, name)
        return removed

    def _name(self, uid: str) -> str | None:
        if self.directory is None or not _SAFE_UID.fullmatch(uid):
            return None
        return f"{uid}{_SUFFIX}"

    @contextlib.contextmanager
    def _opened(self) -> Iterator[int]:
        """The directory's descriptor: every file is opened relative to it."""
        assert self.directory is not None
        directory = os.open(self.directory, _DIRECTORY_FLAGS)
        try:
            yield directory
        finally:
            os.close(directory)

    def _read(self, name: str, budget: ReadBudget | None) -> bytes:
        with self._opened() as directory:
            fd = os.open(name, _READ_FLAGS, dir_fd=directory)
        with os.fdopen(fd, "rb") as file:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise OSError(f"{name} is not a regular file")
            if status.st_size > MAX_FILE_BYTES:
                raise Refused("size", f"larger than {MAX_FILE_BYTES} bytes")
            if budget is not None and status.st_size > budget.left:
                raise Refused("budget", f"past the {SYNC_READ_BYTES} bytes read for one sync")
            data = file.read(MAX_FILE_BYTES + 1)  # the file may have grown since
        if len(data) > MAX_FILE_BYTES:
            raise Refused("size", f"larger than {MAX_FILE_BYTES} bytes")
        if budget is not None:
            budget.left -= len(data)
        return data

    def _failed(self, what: str, exc: Exception, uid: str = "") -> None:
        self.failures += 1
        # Once at warning, as a directory that fails fails for every pod; then at debug.
        (log.debug if self._said else log.warning)(
            f"kubelet's values not {what}: a restart may not find them",
            directory=str(self.directory),
            pod_uid=uid,
            error=str(exc),
        )
        self._said = True

    def _refused(self, exc: Refused, uid: str) -> None:
        reason = exc.reason
        self.refused[reason] = self.refused.get(reason, 0) + 1
        # Once a reason at warning (a Synchronize may meet thousands), then at debug.
        (log.debug if reason in self._said_refused else log.warning)(
            "pod record refused: the pod's values are taken as if it had none",
            directory=str(self.directory),
            pod_uid=uid,
            reason=reason,
            error=str(exc),
        )
        self._said_refused.add(reason)


def _replace(directory: int, name: str, data: bytes) -> None:
    """Write `data` to a fresh name, then rename it over `name`: no link is ever followed."""
    temporary = f".{name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(temporary, _CREATE_FLAGS, 0o600, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise


def _parsed(data: bytes) -> Any:
    """The JSON of a record; deep nesting ends the parser's recursion (at about 1,000
    levels), well short of the stack's end; the format itself nests 4 deep."""
    try:
        return json.loads(data)
    except RecursionError:
        raise Refused("format", "nested deeper than a record") from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise Refused("format", f"not JSON: {exc}") from None


def _encode(record: PodRecord) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "pod": None if record.pod is None else _encode_kept(record.pod),
        "containers": {cid: _encode_kept(kept) for cid, kept in record.containers.items()},
    }


def _encode_kept(kept: Kept) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kubelet": {
            key: getattr(kept.kubelet, attr)
            for key, attr in _KUBELET_KEYS
            if getattr(kept.kubelet, attr) is not None
        }
    }
    if kept.applied is not None:
        out["set"] = {
            key: getattr(kept.applied, attr)
            for key, attr in _VALUE_KEYS
            if getattr(kept.applied, attr) is not None
        }
    return out


def _decode(data: Any) -> PodRecord:
    if not isinstance(data, dict):
        raise Refused("format", "not a JSON object")
    version = data.get("format")
    if type(version) is not int or version != FORMAT:
        raise Refused("format", f"format {version!r}, not {FORMAT}")
    if "pod" not in data:
        raise Refused("format", "no pod")
    containers = data.get("containers", {})
    if not isinstance(containers, dict):
        raise Refused("format", "containers is not a map")
    if len(containers) > MAX_CONTAINERS:
        raise Refused("containers", f"more than {MAX_CONTAINERS} containers")
    pod = data["pod"]
    return PodRecord(
        None if pod is None else _decode_kept(pod),
        {cid: _decode_kept(kept) for cid, kept in containers.items()},
    )


def _decode_kept(data: Any) -> Kept:
    if not isinstance(data, dict) or not isinstance(told := data.get("kubelet"), dict):
        raise Refused("format", "a baseline without a map of kubelet's values")
    kubelet = NativeLimits(**{attr: _int(told.get(key)) for key, attr in _KUBELET_KEYS})
    if (why := unholdable_kubelet(kubelet)) is not None:
        raise Refused("values", f"kubelet's {why}")
    if "set" not in data:
        return Kept(kubelet)
    if not isinstance(kept := data["set"], dict):
        raise Refused("format", "set is not a map")
    values = {attr: _int(kept.get(key)) for key, attr in _VALUE_KEYS}
    quota = values["cpu_quota"]
    if quota is None:
        raise Refused("format", "set without cpuQuota")
    applied = CgroupValues(values["cpu_shares"], quota, values["memory_limit"])
    if (why := unholdable_set(applied)) is not None:
        raise Refused("values", f"set {why}")
    return Kept(kubelet, shared_values(applied.cpu_shares, quota, applied.memory_limit))


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise Refused("values", f"{value!r} is not a whole number")
    return value
