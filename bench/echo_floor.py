"""The round-trip floor of an asyncio server on this machine, with no plugin in it.

`python -m bench.echo_floor [asyncio|uvloop]`: a child process answers every
5.7 KB write (a CreateContainer's size) with 40 bytes from an asyncio stream
reader, exactly the read/write path the plugin's connection uses; this
process times 5,000 round trips over a Unix socket. Whatever CreateContainer
costs above this floor is the plugin's own work.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time

REQUEST = b"x" * 5800
ROUNDS = 5000


async def _serve(path: str) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    while data := await reader.read(256 * 1024):
        writer.write(data[:40])


def _server(path: str, loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(_serve(path))
    else:
        asyncio.run(_serve(path))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _server(sys.argv[2], sys.argv[3])
        return 0
    loop = sys.argv[1] if len(sys.argv) > 1 else "asyncio"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "echo.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        child = subprocess.Popen([sys.executable, "-m", "bench.echo_floor", "--serve", path, loop])
        sock, _ = listener.accept()
        latencies = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            sock.sendall(REQUEST)
            sock.recv(65536)
            latencies.append(time.perf_counter() - started)
        sock.close()
        child.wait(10)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e6
    p99 = latencies[int(len(latencies) * 0.99)] * 1e6
    print(f"{loop}: round trip p50 {p50:.0f} us, p99 {p99:.0f} us over {ROUNDS} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
