"""A plugin with no policy and no framework: the Synchronize floor of this machine and runtime.

`python -m bench.floor --socket-path PATH` is the least any plugin can do on
the benchmark's runtime: a blocking socket, the mux and ttrpc framing read
straight off it, each request decoded whole (upb decodes a message whole, as
Go's protobuf unmarshals it into structs), and every Synchronize chunk
answered with an empty reply. It shares no code with the plugin's transport
(only the generated messages, and the framing constants of the benchmark's
runtime), so that changes to the plugin's transport do not move it: the
benchmark times the same Synchronize against it, in the same run, as the
reference that a Go plugin's time is estimated from
(docs/performance-history.md, "Synchronize floor").

`--reuse-large-buffers` gives it the plugin's heap settings
(nri_midbatch/process/heap.py): the benchmark runs it that way too, to show
how much of the plugin's lead over the floor those settings are
(docs/performance-history.md, round 7). The estimate is made from the floor without them.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys

from bench.runtime import (
    MUX,
    REQUEST,
    RESPONSE,
    RUNTIME_SERVICE,
    SUBSCRIBED_EVENTS,
    TTRPC,
)
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.process.heap import reuse_large_buffers
from nri_midbatch.wire.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN


def _frame(conn: int, stream_id: int, msg_type: int, body: bytes) -> bytes:
    # Replies here are a few bytes: one mux frame each.
    return (
        MUX.pack(conn, TTRPC.size + len(body))
        + TTRPC.pack(len(body), stream_id, msg_type, 0)
        + body
    )


def _answer(method: str, payload: bytes) -> bytes:
    """The reply's payload; each request is decoded whole first, as any plugin must."""
    reply: api.ConfigureResponse | api.SynchronizeResponse | None = None
    if method == "Configure":
        api.ConfigureRequest.FromString(payload)
        reply = api.ConfigureResponse(events=SUBSCRIBED_EVENTS)
    elif method == "Synchronize":
        chunk = api.SynchronizeRequest.FromString(payload)
        reply = api.SynchronizeResponse(more=chunk.more)
    # Every other reply of the Plugin service may be empty.
    return b"" if reply is None else bytes(reply.SerializeToString())


def serve(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    register = api.RegisterPluginRequest(plugin_name="floor", plugin_idx="10")
    request = ttrpc_pb2.Request(
        service=RUNTIME_SERVICE, method="RegisterPlugin", payload=register.SerializeToString()
    )
    sock.sendall(_frame(RUNTIME_SERVICE_CONN, 1, REQUEST, request.SerializeToString()))
    data = bytearray()
    streams: dict[int, bytearray] = {
        PLUGIN_SERVICE_CONN: bytearray(),
        RUNTIME_SERVICE_CONN: bytearray(),
    }
    while chunk := sock.recv(1 << 20):
        data += chunk
        offset = 0
        while len(data) - offset >= MUX.size:
            conn, length = MUX.unpack_from(data, offset)
            if len(data) - offset - MUX.size < length:
                break
            streams.setdefault(conn, bytearray()).extend(
                memoryview(data)[offset + MUX.size : offset + MUX.size + length]
            )
            offset += MUX.size + length
        del data[:offset]
        buffered = streams[PLUGIN_SERVICE_CONN]
        while len(buffered) >= TTRPC.size:
            length, stream_id = TTRPC.unpack_from(buffered)[:2]
            if len(buffered) < TTRPC.size + length:
                break
            call = ttrpc_pb2.Request.FromString(bytes(buffered[TTRPC.size : TTRPC.size + length]))
            del buffered[: TTRPC.size + length]
            reply = ttrpc_pb2.Response(payload=_answer(call.method, call.payload))
            sock.sendall(
                _frame(PLUGIN_SERVICE_CONN, stream_id, RESPONSE, reply.SerializeToString())
            )
        streams[RUNTIME_SERVICE_CONN].clear()  # the RegisterPlugin reply: nothing to do with it


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--socket-path", required=True)
    parser.add_argument(
        "--reuse-large-buffers",
        action="store_true",
        help="glibc's heap set as the plugin sets it (nri_midbatch/process/heap.py)",
    )
    args = parser.parse_args()
    if args.reuse_large_buffers:
        reuse_large_buffers()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.socket_path)


if __name__ == "__main__":
    main()
