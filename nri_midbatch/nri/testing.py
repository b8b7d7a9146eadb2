"""An in-process NRI runtime that drives a plugin over a real socket.

`replay --via-socket`, the benchmark and the tests use it to exercise the
plugin's whole transport (mux, ttrpc, session) exactly as a runtime would:
it serves the Runtime service on mux connection 2 and calls the Plugin service
on connection 1, through the same codecs seen from the other side.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.nri.session import PLUGIN_SERVICE, RUNTIME_SERVICE
from nri_midbatch.rpc.connection import MuxConnection
from nri_midbatch.rpc.service import CallContext, Method, Service
from nri_midbatch.wire.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN

ResponseT = TypeVar("ResponseT", bound=Message)

DEFAULT_REQUEST_TIMEOUT = 2.0


@dataclass
class RuntimeRecord:
    """What the plugin asked of the runtime, for assertions."""

    registrations: list[api.RegisterPluginRequest] = field(default_factory=list)
    updates: list[api.ContainerUpdate] = field(default_factory=list)
    registered: asyncio.Event = field(default_factory=asyncio.Event)


class LoopbackRuntime:
    """The runtime end of one plugin connection."""

    def __init__(
        self,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        failed_updates: Sequence[str] = (),
    ) -> None:
        self.record = RuntimeRecord()
        self.request_timeout = request_timeout
        self._failed_updates = frozenset(failed_updates)
        #: Cleared, UpdateContainers is taken in (and recorded) but never answered.
        self.answering_updates = asyncio.Event()
        self.answering_updates.set()
        self.conn = MuxConnection(
            {RUNTIME_SERVICE: self._service()},
            server_conn=RUNTIME_SERVICE_CONN,
            client_conn=PLUGIN_SERVICE_CONN,
            name="loopback-runtime",
        )

    @classmethod
    async def over(
        cls,
        sock: socket.socket,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        failed_updates: Sequence[str] = (),
    ) -> LoopbackRuntime:
        """A runtime serving on the connected `sock`."""
        runtime = cls(request_timeout=request_timeout, failed_updates=failed_updates)
        await runtime.conn.attach(sock)
        return runtime

    def _service(self) -> Service:
        async def register(request: api.RegisterPluginRequest, _ctx: CallContext) -> api.Empty:
            self.record.registrations.append(request)
            self.record.registered.set()
            return api.Empty()

        async def update(
            request: api.UpdateContainersRequest, _ctx: CallContext
        ) -> api.UpdateContainersResponse:
            self.record.updates.extend(request.update)
            await self.answering_updates.wait()
            failed = [u for u in request.update if u.container_id in self._failed_updates]
            return api.UpdateContainersResponse(failed=failed)

        return Service(
            RUNTIME_SERVICE,
            {
                "RegisterPlugin": Method(api.RegisterPluginRequest, register),
                "UpdateContainers": Method(api.UpdateContainersRequest, update),
            },
        )

    async def call(
        self, method: str, request: Message, response_type: type[ResponseT]
    ) -> ResponseT:
        return await self.conn.call(
            PLUGIN_SERVICE, method, request, response_type, timeout=self.request_timeout
        )

    async def configure(
        self,
        *,
        config: str = "",
        runtime_name: str = "containerd",
        runtime_version: str = "v2.3.0",
        nri_version: str = "",
        registration_timeout: float = 5.0,
    ) -> api.ConfigureResponse:
        """Wait for the plugin to register, then configure it (no Synchronize yet)."""
        async with asyncio.timeout(registration_timeout):
            await self.record.registered.wait()
        return await self.call(
            "Configure",
            api.ConfigureRequest(
                config=config,
                runtime_name=runtime_name,
                runtime_version=runtime_version,
                registration_timeout=int(registration_timeout * 1000),
                request_timeout=int(self.request_timeout * 1000),
                NRI_version=nri_version,
            ),
            api.ConfigureResponse,
        )

    async def start(
        self,
        *,
        config: str = "",
        runtime_name: str = "containerd",
        runtime_version: str = "v2.3.0",
        nri_version: str = "",
        pods: Sequence[api.PodSandbox] = (),
        containers: Sequence[api.Container] = (),
        registration_timeout: float = 5.0,
    ) -> tuple[api.ConfigureResponse, api.SynchronizeResponse]:
        """What a runtime does after accepting a plugin: wait, configure, synchronize."""
        configured = await self.configure(
            config=config,
            runtime_name=runtime_name,
            runtime_version=runtime_version,
            nri_version=nri_version,
            registration_timeout=registration_timeout,
        )
        synced = await self.call(
            "Synchronize",
            api.SynchronizeRequest(pods=pods, containers=containers),
            api.SynchronizeResponse,
        )
        return configured, synced

    async def close(self) -> None:
        self.conn.close("runtime closed")
