"""Kubelet's values kept on the host, one small file per pod, so that they survive a restart.

A pod's cgroup holds the plugin's values once it has written them, and the runtime reports the
plugin's values for the containers it updated: a restarted plugin that read either as
kubelet's would ratchet. What cannot be found again elsewhere is kept here, by pod uid:

- the pod's baseline (read from its cgroup at RunPodSandbox, before the plugin wrote it) and
  the pod-level fields the plugin set;
- for containers whose native-limits annotation does not tell (resized since their creation,
  or first seen running at a Synchronize without it): their baseline and the fields set.

A file is written when what it holds changes, and removed with its pod; a Synchronize removes
those of pods the runtime no longer runs. Bounded: one file per pod the runtime runs, each of
at most MAX_FILE_BYTES (a larger one is not written, and not read). Without a directory (replay,
or one that cannot be written) nothing is kept, which is said once, and counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.policy import CgroupValues, NativeLimits
from nri_midbatch.policy.calculate import shared_values

__all__ = ["MAX_FILE_BYTES", "BaselineStore", "Kept", "PodRecord"]

log = structlog.get_logger(__name__)

#: A pod of 2,000 containers, each resized, takes about 300 KB.
MAX_FILE_BYTES = 1024 * 1024
FORMAT = 1
#: Pod uids as Kubernetes makes them (a UUID), or any name that is safe as a file name.
_SAFE_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SUFFIX = ".json"

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


class BaselineStore:
    """The directory of pod records; every failure is logged and counted, never raised."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.failures = 0
        self._said = False

    @property
    def keeping(self) -> bool:
        return self.directory is not None

    def uids(self) -> frozenset[str]:
        """The uids of the pods with a record."""
        if self.directory is None:
            return frozenset()
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return frozenset()
        except OSError as exc:
            self._failed("listed", exc)
            return frozenset()
        return frozenset(n[: -len(_SUFFIX)] for n in names if n.endswith(_SUFFIX))

    def load(self, uid: str) -> PodRecord | None:
        path = self._path(uid)
        if path is None:
            return None
        try:
            # Non-blocking and not through a link: a FIFO or a device put there must not hang
            # or flood the plugin.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as file:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{path} is not a regular file")
                data = file.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._failed("read", exc, uid)
            return None
        if len(data) > MAX_FILE_BYTES:
            self._failed("read", ValueError(f"larger than {MAX_FILE_BYTES} bytes"), uid)
            return None
        try:
            return _decode(json.loads(data))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._failed("read", ValueError(f"not a record: {exc}"), uid)
            return None

    def save(self, uid: str, record: PodRecord) -> None:
        path = self._path(uid)
        if path is None:
            return
        data = json.dumps(_encode(record), separators=(",", ":")).encode()
        if len(data) > MAX_FILE_BYTES:
            self._failed("written", ValueError(f"larger than {MAX_FILE_BYTES} bytes"), uid)
            return
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            os.makedirs(path.parent, mode=0o700, exist_ok=True)
            with open(temporary, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._failed("written", exc, uid)

    def remove(self, uid: str) -> None:
        path = self._path(uid)
        if path is None:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._failed("removed", exc, uid)

    def prune(self, live: frozenset[str]) -> int:
        """Remove the records of pods not in `live`; how many were removed."""
        gone = self.uids() - live
        for uid in gone:
            self.remove(uid)
        return len(gone)

    def _path(self, uid: str) -> Path | None:
        if self.directory is None or not _SAFE_UID.fullmatch(uid):
            return None
        return self.directory / f"{uid}{_SUFFIX}"

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
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
    containers = data.get("containers", {})
    if not isinstance(containers, dict):
        raise ValueError("containers is not a map")
    return PodRecord(
        None if data["pod"] is None else _decode_kept(data["pod"]),
        {str(cid): _decode_kept(kept) for cid, kept in containers.items()},
    )


def _decode_kept(data: Any) -> Kept:
    kubelet = {attr: _int(data["kubelet"].get(key)) for key, attr in _KUBELET_KEYS}
    applied = None
    if "set" in data:
        values = {attr: _int(data["set"].get(key)) for key, attr in _VALUE_KEYS}
        quota = values["cpu_quota"]
        if quota is None:
            raise ValueError("set without cpuQuota")
        applied = shared_values(values["cpu_shares"], quota, values["memory_limit"])
    return Kept(NativeLimits(**kubelet), applied)


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise ValueError(f"{value!r} is not a whole number")
    return value
