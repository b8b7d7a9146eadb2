"""Writing a recording as JSON lines, without slowing any call it records.

Event handlers only enqueue (`put_nowait`). One writer task converts records to their lines
(format.py) and writes them in a thread. When the queue is full the record is dropped and
counted, never the event; the file rotates at a size cap so a long recording cannot fill the
disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

import structlog

from nri_midbatch.counts import CounterFamily, single
from nri_midbatch.recording.call import CallRecord, CallRecorder
from nri_midbatch.recording.format import json_line, record_json
from nri_midbatch.recording.redact import DEFAULT_KEPT_ANNOTATIONS

log = structlog.get_logger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BACKUPS = 3
DEFAULT_QUEUE_SIZE = 1024
#: While writes keep failing, how often to log how many records were lost.
FAILURE_SUMMARY_EVERY = 60.0
#: Records converted and written per hop to the writer thread.
_BATCH = 256


# -- the file ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """What became of a batch of lines handed to a LineSink."""

    lines: int  # written whole
    refused: int  # longer than the size cap on their own
    error: Exception | None = None  # why the rest were lost


class LineSink(Protocol):
    """Where the writer thread puts encoded lines; only ever called from that thread."""

    def write(self, lines: Sequence[bytes]) -> Written: ...

    def close(self) -> None: ...


class RotatingFile:
    """FILE, rotated to FILE.1 .. FILE.K before a line would take it past `max_bytes`.

    A line longer than the cap on its own is refused: writing it would break the cap.
    With no backups, rotation starts FILE afresh.

    FILE is followed by name: when it is renamed away or removed (logrotate without
    copytruncate), the next write opens a new FILE. Lines are written with unbuffered
    writes, and a write that fails part-way is cut back to the last whole line, so a full
    disk costs the lines it refused and never leaves half a line before the next one.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = 0) -> None:
        if max_bytes <= 0:
            raise ValueError(f"record size cap must be positive, not {max_bytes}")
        if backups < 0:
            raise ValueError(f"record backups must be 0 or more, not {backups}")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd = -1
        self._size = 0
        self._identity = (0, 0)
        # Opened here, at start-up, so an unwritable path fails the command at once.
        self._open()

    def _open(self) -> None:
        # 0o600 for a new file: a recording holds what the pods were started with.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        stat = os.fstat(fd)
        self._fd, self._size, self._identity = fd, stat.st_size, (stat.st_dev, stat.st_ino)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _follow_path(self) -> None:
        """Reopen FILE if the path no longer names the file we hold open."""
        try:
            stat = os.stat(self.path)
            if self._fd >= 0 and (stat.st_dev, stat.st_ino) == self._identity:
                return
        except FileNotFoundError:
            pass
        if self._fd >= 0:
            log.info("recording file moved or removed; opening a new one", path=str(self.path))
        self._close_fd()
        self._open()

    def write(self, lines: Sequence[bytes]) -> Written:
        written = refused = 0
        try:
            self._follow_path()
            chunk: list[bytes] = []
            chunk_size = 0
            for line in lines:
                if len(line) > self.max_bytes:
                    refused += 1
                    continue
                if self._size + chunk_size + len(line) > self.max_bytes:
                    self._append(chunk, chunk_size)
                    written += len(chunk)
                    chunk, chunk_size = [], 0
                    self._rotate()
                chunk.append(line)
                chunk_size += len(line)
            self._append(chunk, chunk_size)
            written += len(chunk)
        except OSError as exc:
            return Written(written, refused, exc)
        return Written(written, refused)

    def _append(self, chunk: Sequence[bytes], size: int) -> None:
        """Write whole lines or none: a failed write is cut back to where it started."""
        if not chunk:
            return
        data = memoryview(b"".join(chunk))
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):  # not a regular file (/dev/full): nothing to cut
                os.ftruncate(self._fd, self._size)
            raise
        self._size += size

    def _rotate(self) -> None:
        """Make room at FILE.1 and move FILE there; a failure loses no backup.

        Only the backups below the first free slot move, so a rotation that fails part-way
        leaves a gap the next one fills instead of pushing another backup out.
        """
        if not self.backups:
            os.ftruncate(self._fd, 0)
            self._size = 0
            return
        free = next(
            (n for n in range(1, self.backups) if not self._backup(n).exists()), self.backups
        )
        for index in range(free - 1, 0, -1):
            os.replace(self._backup(index), self._backup(index + 1))
        os.replace(self.path, self._backup(1))
        self._close_fd()
        self._open()

    def _backup(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def close(self) -> None:
        self._close_fd()


# -- the recorder ------------------------------------------------------------


class Recorder(CallRecorder):
    """A CallRecorder writing to a LineSink; use as `async with recorder:`.

    A failing sink (a full disk, say) is logged once when it starts failing, then summed up
    every `failure_summary_every` seconds while it lasts, and once more when a write succeeds
    again; every record lost meanwhile is counted in `dropped`.
    """

    def __init__(
        self,
        sink: LineSink,
        *,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        flush_timeout: float = 10.0,
        failure_summary_every: float = FAILURE_SUMMARY_EVERY,
        raw: bool = False,
        kept_annotations: Collection[str] = DEFAULT_KEPT_ANNOTATIONS,
    ) -> None:
        """kept_annotations: the annotations whose values a redacted recording keeps."""
        self._sink = sink
        self._raw = raw
        self._kept_annotations = frozenset(kept_annotations)
        self._queue: asyncio.Queue[CallRecord] = asyncio.Queue(maxsize=queue_size)
        self._flush_timeout = flush_timeout
        self._writer: asyncio.Task[None] | None = None
        self.written = 0
        #: Records lost: queue full, refused by the file, or a failed write.
        self.dropped = 0
        self._burst = 0  # drops since the queue last had room
        self._summary_every = failure_summary_every
        self._failed: int | None = None  # records lost since writes began failing; None: fine
        self._summary_due = 0.0

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_records_dropped",
            "Recording lines lost: queue full, over the size cap, or a failed write",
            self.dropped,
        )

    def keep(self, record: CallRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1
            if not self._burst:
                log.warning(
                    "recording queue full: dropping records, never events",
                    queue_size=self._queue.maxsize,
                )
            self._burst += 1
            return
        if self._burst:
            log.warning("recording resumed", dropped=self._burst, dropped_total=self.dropped)
            self._burst = 0

    async def __aenter__(self) -> Recorder:
        self._writer = asyncio.create_task(self._write_loop())
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def drained(self) -> None:
        """Wait until every record queued so far is written or counted as dropped."""
        await self._queue.join()

    async def close(self) -> None:
        """Write what is queued (for at most flush_timeout), then close the file.

        Never raises for the file: a plugin stopping on a full disk still exits cleanly.
        """
        flushed = True
        try:
            async with asyncio.timeout(self._flush_timeout):
                await self.drained()
        except TimeoutError:
            flushed = False
            self.dropped += self._queue.qsize()
            log.error("recording not flushed in time", lost=self._queue.qsize())
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        # A write still stuck in the thread owns the file; the process exit closes it.
        if flushed:
            try:
                await asyncio.to_thread(self._sink.close)
            except OSError as exc:
                log.error("recording file not closed cleanly", error=str(exc))
        log.info("recording closed", written=self.written, dropped=self.dropped)

    async def _write_loop(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < _BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                written = await asyncio.to_thread(self._write, batch)
            finally:
                for _ in batch:
                    queue.task_done()
            # Counted and logged here, on the event loop, where `keep` counts too.
            self.written += written.lines
            self.dropped += len(batch) - written.lines
            if written.refused:
                log.warning("record larger than the size cap dropped", count=written.refused)
            self._note_failure(written.error, len(batch) - written.lines - written.refused)

    def _note_failure(self, error: Exception | None, lost: int) -> None:
        """Log the start of a spell of failed writes, a summary now and then, and its end."""
        if error is None:
            if self._failed is not None:
                log.warning("recording resumed", lost=self._failed, dropped_total=self.dropped)
                self._failed = None
            return
        now = time.monotonic()
        if self._failed is None:
            self._failed = lost
            self._summary_due = now + self._summary_every
            log.error(
                "recording write failed; dropping records until a write succeeds",
                error=str(error),
                lost=lost,
            )
            return
        self._failed += lost
        if now >= self._summary_due:
            self._summary_due = now + self._summary_every
            log.error("recording writes still failing", error=str(error), lost=self._failed)

    def _write(self, batch: Sequence[CallRecord]) -> Written:
        """Runs in the writer thread (JSON conversion is the costly part)."""
        try:
            lines = [
                json_line(
                    record_json(record, raw=self._raw, kept_annotations=self._kept_annotations)
                )
                for record in batch
            ]
        except Exception as exc:  # a record that cannot be converted costs itself only
            return Written(0, 0, exc)
        return self._sink.write(lines)
