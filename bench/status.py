"""`python -m bench.status`: what status clients cost a plugin process (issue 30), bounded.

Against one plugin process serving its status socket, on a node of 10,000 containers
(1,000 pods of 10, the benchmark's node):

1. Synchronizes of the node, chunked as the runtime chunks them, three without status
   clients and then three with two clients reading answers in a loop: the last chunk's
   seconds of each (a chunk takes 0.3-0.6 s);
2. one answer of the node: its bytes and seconds, the plugin's resident memory before it and
   the most sampled while it was made;
3. 1,100 clients that connect and never read: the plugin's open files while they wait, and
   its CPU seconds in the 10 s after they leave.

Prints one JSON object. Takes a few minutes and about 30 s of CPU; the plugin stops at the
end. `--plugin-path DIR` measures another commit's plugin (`git archive`), as `python -m
bench` does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import workload
from bench.run import SYNC_SUMMARY, Bench, Options, Plugin, SyncNode
from nri_midbatch.tools.status import read_answer

IDLE_CLIENTS = 1100
SYNCS = 3
AFTER_SECONDS = 10.0


def synchronize(bench: Bench, plugin: Plugin, node: SyncNode) -> list[float]:
    """Each chunk's seconds; returns once the plugin's work after the reply is done."""
    workload.reset_sync_cgroups(bench.cgroup_root, node.pods, node.containers)
    offset = bench.log_file.stat().st_size
    seconds = [plugin.runtime.call(chunk, timeout=30)[1] for chunk in node.chunks]
    bench.wait_for_log_line(offset, SYNC_SUMMARY)
    return seconds


def reading_in_a_loop(path: Path, stop: threading.Event, answers: list[int]) -> None:
    while not stop.is_set():
        answers.append(len(read_answer(path)))


def open_files(plugin: Plugin) -> int:
    return len(os.listdir(f"/proc/{plugin.process.pid}/fd"))


def measure(workdir: Path, pods: int, per_pod: int, plugin_path: str | None) -> dict[str, Any]:
    opts = Options(
        sync_pods=pods, sync_containers_per_pod=per_pod, status_socket=True, plugin_path=plugin_path
    )
    bench = Bench(opts, workdir)
    node = SyncNode.build(opts, bench.cgroup_root)
    status = workdir / "status.sock"
    # The plugin's limit on open files as a node's default, ours room for the clients.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    plugin = bench.launch()
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(IDLE_CLIENTS + 1024, hard), hard))
    out: dict[str, Any] = {"containers": len(node.containers), "pods": len(node.pods)}
    try:
        synchronize(bench, plugin, node)  # the plugin now knows the node
        quiet = [synchronize(bench, plugin, node) for _ in range(SYNCS)]
        out["sync_chunks"] = len(quiet[0])
        out["sync_last_chunk_s"] = [round(chunks[-1], 3) for chunks in quiet]

        stop, answers = threading.Event(), list[int]()
        readers = [
            threading.Thread(target=reading_in_a_loop, args=(status, stop, answers))
            for _ in range(2)
        ]
        for reader in readers:
            reader.start()
        time.sleep(0.5)  # both are reading
        busy = [synchronize(bench, plugin, node) for _ in range(SYNCS)]
        stop.set()
        for reader in readers:
            reader.join()
        out["sync_with_2_readers_last_chunk_s"] = [round(chunks[-1], 3) for chunks in busy]
        out["answers_during_syncs"] = len(answers)
        plugin.wait_idle()

        rss_before = plugin.rss_mb()
        peak, done = [rss_before], threading.Event()

        def sample() -> None:
            while not done.wait(0.01):
                peak.append(plugin.rss_mb())

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        answer = read_answer(status)
        out["answer_s"] = round(time.perf_counter() - started, 3)
        done.set()
        sampler.join()
        document = json.loads(answer)
        out["answer_bytes"] = len(answer)
        out["answer_workloads"] = len(document["workloads"])
        out["answer_omitted"] = document.get("omitted")
        out["rss_before_answer_mb"] = round(rss_before, 1)
        out["rss_most_during_answer_mb"] = round(max(peak), 1)

        files = open_files(plugin)
        clients = []
        for _ in range(IDLE_CLIENTS):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            try:
                client.connect(str(status))
            except BlockingIOError:
                client.close()
                continue
            clients.append(client)
        time.sleep(1.0)
        out["idle_clients_tried"] = IDLE_CLIENTS
        out["idle_clients_connected"] = len(clients)
        out["plugin_open_files_before"] = files
        out["plugin_open_files_with_idle_clients"] = open_files(plugin)
        for client in clients:
            client.close()
        cpu = plugin.cpu_seconds()
        time.sleep(AFTER_SECONDS)
        out[f"plugin_cpu_s_in_{AFTER_SECONDS:.0f}_s_after_they_left"] = round(
            plugin.cpu_seconds() - cpu, 2
        )
    finally:
        plugin.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.status", description=__doc__)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--containers-per-pod", type=int, default=10)
    parser.add_argument("--plugin-path", metavar="DIR", help="run the plugin code in DIR")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-status-") as workdir:
        figures = measure(Path(workdir), args.pods, args.containers_per_pod, args.plugin_path)
        print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
