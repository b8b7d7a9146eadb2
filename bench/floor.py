"""A plugin with no policy: what any plugin pays for a Synchronize on this machine and runtime.

`python -m bench.floor --socket-path PATH` registers with the benchmark's
runtime through the plugin's own transport and session (mux, ttrpc, protobuf
decoding of every chunk: upb decodes each message whole, as Go's protobuf
unmarshals it into structs) and answers every Synchronize with an empty
reply. It decides and keeps nothing. The benchmark times the same node's
Synchronize against it, in the same run as the plugin's: the floor under
the plugin's time, and a proxy for a Go plugin's, whose time is mostly this
same receiving and decoding (docs/performance.md, "Synchronize floor").
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.glue.plugin import MidBatchPlugin
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.runner import run_external
from nri_midbatch.nri.session import RuntimeInfo, Session
from nri_midbatch.rpc import loop as event_loop


class FloorPlugin:
    """Subscribes to what the real plugin does, so that the runtime treats both alike."""

    events = MidBatchPlugin.events

    async def configure(self, config: str, runtime: RuntimeInfo) -> None:
        return None

    def synchronize_part(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        return None

    async def synchronize(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]
    ) -> api.SynchronizeResponse:
        return api.SynchronizeResponse()

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        return api.CreateContainerResponse()

    async def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> Sequence[api.ContainerUpdate]:
        return ()

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        return ()

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        return None

    async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
        return None

    async def container_event(
        self, event: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        return None


async def serve(socket_path: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await run_external(Session(FloorPlugin(), "floor", "10"), socket_path, stop)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--socket-path", required=True)
    args = parser.parse_args()
    event_loop.run(serve(args.socket_path), event_loop.loop_factory())


if __name__ == "__main__":
    main()
