"""glibc keeps a Synchronize chunk's buffers in its heap for the next (process/heap.py).

A chunk is 4 MiB received in pieces, copied into its message and copied again
(its payload); in a fresh process each of those landed on new pages, a page
fault per 4 KiB touched. Measured in a child process of its own, as the
plugin's first Synchronize is: the settings are glibc's, for the whole process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The receive path's allocations for one chunk, as wire/ does them; then the
# page faults of eight more chunks once the first has been through.
_CHUNKS = """
import sys
from nri_midbatch.process.heap import reuse_large_buffers

tuned = reuse_large_buffers() if sys.argv[1] == "tuned" else False
piece = b"x" * (256 << 10)

def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])

def chunk():
    received = bytearray()
    for _ in range(16):
        received += piece
    message = bytes(memoryview(received)[10:])
    payload = bytes(memoryview(message)[8:])
    return len(payload)

chunk()
start = faults()
for _ in range(8):
    chunk()
print(tuned, faults() - start)
"""


def _is_glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):
        return False


glibc = pytest.mark.skipif(not _is_glibc(), reason="glibc's settings")


def _faults_of_eight_chunks(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHUNKS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@glibc
def test_chunk_buffers_are_reused_instead_of_faulted_in_anew() -> None:
    applied, tuned = _faults_of_eight_chunks("tuned")
    _, default = _faults_of_eight_chunks("default")
    assert applied
    # Eight chunks of three 4 MiB buffers are 24,000 pages: glibc's defaults fault
    # most of them in again; kept in the heap, they are all touched already.
    assert default > 8_000
    assert tuned < 100
