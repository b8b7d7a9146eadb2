"""Session: the NRI plugin protocol, driven by a LoopbackRuntime or a raw runtime.

Reference §4.1, §4.2, §4.5, §4.6 and checklist items 12-20.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import traceback

import pytest
from google.protobuf.message import Message
from structlog.testing import capture_logs

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.api import ttrpc_pb2
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.lifecycle import Phase
from nri_midbatch.nri.session import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    Link,
    RegistrationError,
    Session,
    SessionObserver,
    SessionState,
    SyncLimits,
)
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code
from tests.factory import container, pod, update

from .nri_fixtures import ALL_EVENTS, STEP_TIMEOUT, RawPeer, RecordingPlugin, loopback, run


def configure(
    runtime_name: str = "containerd",
    runtime_version: str = "v2.3.0",
    nri_version: str = "",
    **kwargs: object,
) -> api.ConfigureRequest:
    return api.ConfigureRequest(
        runtime_name=runtime_name,
        runtime_version=runtime_version,
        NRI_version=nri_version,
        **kwargs,
    )


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def test_register_plugin_carries_name_and_idx() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        async with loopback(plugin, name="midbatch", idx="42") as lb:
            configured, synced = await lb.runtime.start(config="some: config")
            (registration,) = lb.runtime.record.registrations
            assert registration.plugin_name == "midbatch"
            assert registration.plugin_idx == "42"
            assert registration.NRI_version == "v0.12.2"
            assert configured.events == 0x1FFF
            assert list(synced.update) == []
            assert not synced.more
            state = lb.session.state
            assert (state.registered, state.configured, state.synchronized) == (True, True, True)
            assert state.events == 0x1FFF
            config, info = plugin.configs[0]
            assert config == "some: config"
            assert (info.name, info.version, info.nri_version) == (
                "containerd",
                "v2.3.0",
                (0, 12, 0),
            )
            assert info.request_timeout == pytest.approx(2.0)
            assert info.registration_timeout == pytest.approx(5.0)

    run(scenario())


def test_conn_1_is_served_before_register_plugin_is_answered() -> None:
    """A runtime that sends Configure first and answers RegisterPlugin later."""
    plugin = RecordingPlugin()

    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(plugin, "midbatch", "10", registration_timeout=STEP_TIMEOUT)
        task = asyncio.create_task(session.run(sock))
        message, request = await peer.read_request(2)
        # The plugin's first message: RegisterPlugin on conn 2, stream 1.
        assert peer.frames[0][0] == 2
        assert message.stream_id == 1
        assert (request.service, request.method) == (RUNTIME_SERVICE, "RegisterPlugin")
        assert request.timeout_nano > 0
        registration = api.RegisterPluginRequest.FromString(request.payload)
        assert (registration.plugin_name, registration.plugin_idx) == ("midbatch", "10")

        peer.send_request(
            1,
            1,
            PLUGIN_SERVICE,
            "Configure",
            api.ConfigureRequest(runtime_name="containerd", runtime_version="v1.7.24"),
            timeout_nano=2_000_000_000,
        )
        reply, response = await peer.read_response(1)
        assert reply.stream_id == 1
        assert not response.HasField("status")
        assert api.ConfigureResponse.FromString(response.payload).events == 0x7FF
        assert not session.state.registered

        peer.send_response(2, 1, raw=b"")  # RegisterPlugin's Empty reply, 0 bytes
        peer.send_request(1, 3, PLUGIN_SERVICE, "Synchronize", api.SynchronizeRequest())
        reply, response = await peer.read_response(1)
        assert reply.stream_id == 3
        assert not response.HasField("status")
        assert session.state.registered and session.state.configured
        assert plugin.syncs == [([], [])]

        peer.close()
        reason = await task
        assert reason == "closed by peer"
        assert not session.state.registered

    run(scenario())


def test_registration_refused_raises_registration_error() -> None:
    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(RecordingPlugin(), "bad name!", "1")
        task = asyncio.create_task(session.run(sock))
        message, _ = await peer.read_request(2)
        error = ttrpc_pb2.Response(status={"code": 2, "message": "invalid plugin index"})
        peer.send_response(2, message.stream_id, raw=error.SerializeToString())
        with pytest.raises(RegistrationError, match="invalid plugin index"):
            await task
        assert await peer.read_eof() == b""
        peer.close()

    run(scenario())


def test_connection_closed_during_registration_is_a_registration_error() -> None:
    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(RecordingPlugin(), "midbatch", "10")
        task = asyncio.create_task(session.run(sock))
        await peer.read_request(2)
        peer.close()  # the runtime goes away before answering RegisterPlugin
        with pytest.raises(RegistrationError):
            await task

    run(scenario())


def test_connection_closed_before_configure_is_a_registration_error() -> None:
    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(RecordingPlugin(), "midbatch", "10")
        task = asyncio.create_task(session.run(sock))
        message, _ = await peer.read_request(2)
        peer.send_response(2, message.stream_id, raw=b"")
        # Close only once the session has the reply: then it waits for Configure.
        async with asyncio.timeout(STEP_TIMEOUT):
            while not session.state.register_replied:
                await asyncio.sleep(0)
        peer.close()
        with pytest.raises(RegistrationError, match="before Configure"):
            await task

    run(scenario())


def test_no_configure_within_registration_timeout() -> None:
    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(RecordingPlugin(), "midbatch", "10", registration_timeout=0.1)
        task = asyncio.create_task(session.run(sock))
        message, _ = await peer.read_request(2)
        peer.send_response(2, message.stream_id, raw=b"")
        with pytest.raises(RegistrationError, match="no Configure"):
            await task
        peer.close()

    run(scenario())


# ---------------------------------------------------------------------------
# Configure: the event mask (§3.2)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime_name", "runtime_version", "nri_version", "mask"),
    [
        ("containerd", "v1.7.24", "", 0x7FF),
        ("containerd", "1.7.24~ds1", "", 0x7FF),
        ("cri-o", "1.31.2", "", 0x7FF),
        ("some-runtime", "v9.0.0", "", 0x7FF),
        ("", "", "", 0x7FF),
        ("containerd", "v2.1.4", "", 0x7FF),
        ("containerd", "v2.2.0", "", 0x1FFF),
        ("cri-o", "1.34.0", "", 0x1FFF),
        ("containerd", "v2.4.0", "v0.12.0", 0x1FFF),
        ("some-runtime", "", "v0.12.0", 0x1FFF),
    ],
)
def test_configure_mask_fits_the_runtime(
    runtime_name: str, runtime_version: str, nri_version: str, mask: int
) -> None:
    plugin = RecordingPlugin(ALL_EVENTS)

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            configured, _ = await lb.runtime.start(
                runtime_name=runtime_name, runtime_version=runtime_version, nri_version=nri_version
            )
            assert configured.events == mask
            assert lb.session.state.events == mask

    run(scenario())


def test_configure_mask_is_only_what_the_plugin_wants() -> None:
    plugin = RecordingPlugin({Event.CREATE_CONTAINER, Event.START_CONTAINER})

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            configured, _ = await lb.runtime.start()
            assert configured.events == 0x28
            assert configured.SerializeToString() == bytes.fromhex("1028")

    run(scenario())


def test_configure_drops_new_events_on_old_runtimes() -> None:
    wanted = {Event.CREATE_CONTAINER, Event.UPDATE_POD_SANDBOX, Event.POST_UPDATE_POD_SANDBOX}
    plugin = RecordingPlugin(wanted)

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            configured, _ = await lb.runtime.start(runtime_version="v1.7.24")
            assert configured.events == 0x8

    run(scenario())


def test_configure_never_answers_zero() -> None:
    # Only events an NRI v0.6 runtime does not know: zero would mean "all".
    plugin = RecordingPlugin({Event.UPDATE_POD_SANDBOX, Event.VALIDATE_CONTAINER_ADJUSTMENT})

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            async with asyncio.timeout(STEP_TIMEOUT):
                await lb.runtime.record.registered.wait()
            with pytest.raises(RpcError) as info:
                await lb.runtime.call(
                    "Configure",
                    configure("containerd", "v1.7.24"),
                    api.ConfigureResponse,
                )
            assert info.value.code != Code.OK
            assert plugin.configs == []
            assert not lb.session.state.configured

    run(scenario())


# ---------------------------------------------------------------------------
# Synchronize (§4.2)
# ---------------------------------------------------------------------------


def test_split_synchronize_is_buffered_and_delivered_once() -> None:
    plugin = RecordingPlugin(sync_updates=[update("c3")])
    chunks = [
        ([pod("p0"), pod("p1")], [container("c0", "p0")]),
        ([pod("p2")], [container("c1", "p1"), container("c2", "p2")]),
        ([], [container("c3", "p0")]),
        ([pod("p3")], [container("c4", "p3")]),
    ]

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            async with asyncio.timeout(STEP_TIMEOUT):
                await lb.runtime.record.registered.wait()
            await lb.runtime.call("Configure", configure(), api.ConfigureResponse)
            for i, (pods, containers) in enumerate(chunks):
                last = i == len(chunks) - 1
                reply = await lb.runtime.call(
                    "Synchronize",
                    api.SynchronizeRequest(pods=pods, containers=containers, more=not last),
                    api.SynchronizeResponse,
                )
                if not last:
                    assert reply.more is True
                    assert list(reply.update) == []
                    assert reply.SerializeToString() == bytes.fromhex("1001")
                    assert plugin.syncs == []
                else:
                    assert reply.more is False
                    assert list(reply.update) == [update("c3")]
            ((pods, containers),) = plugin.syncs
            assert [p.id for p in pods] == ["p0", "p1", "p2", "p3"]
            assert [c.id for c in containers] == ["c0", "c1", "c2", "c3", "c4"]
            assert pods[0] == pod("p0")
            state = lb.session.state
            assert (state.sync_chunks, state.sync_pods, state.sync_containers) == (4, 4, 5)
            assert state.synchronized

    run(scenario())


def test_unsplit_synchronize_after_a_split_one_starts_fresh() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            await lb.runtime.start(pods=[pod("a")], containers=[container("x", "a")])
            await lb.runtime.call(
                "Synchronize", api.SynchronizeRequest(pods=[pod("b")]), api.SynchronizeResponse
            )
            assert [[p.id for p in pods] for pods, _ in plugin.syncs] == [["a"], ["b"]]

    run(scenario())


# ---------------------------------------------------------------------------
# Events: dedicated v0.12 RPCs and StateChange (§4.6)
# ---------------------------------------------------------------------------

POD_RPCS = [
    ("RunPodSandbox", api.RunPodSandboxRequest, api.RunPodSandboxResponse, Event.RUN_POD_SANDBOX),
    (
        "StopPodSandbox",
        api.StopPodSandboxRequest,
        api.StopPodSandboxResponse,
        Event.STOP_POD_SANDBOX,
    ),
    (
        "RemovePodSandbox",
        api.RemovePodSandboxRequest,
        api.RemovePodSandboxResponse,
        Event.REMOVE_POD_SANDBOX,
    ),
    (
        "PostUpdatePodSandbox",
        api.PostUpdatePodSandboxRequest,
        api.PostUpdatePodSandboxResponse,
        Event.POST_UPDATE_POD_SANDBOX,
    ),
]
CONTAINER_RPCS = [
    (
        "PostCreateContainer",
        api.PostCreateContainerRequest,
        api.PostCreateContainerResponse,
        Event.POST_CREATE_CONTAINER,
    ),
    (
        "StartContainer",
        api.StartContainerRequest,
        api.StartContainerResponse,
        Event.START_CONTAINER,
    ),
    (
        "PostStartContainer",
        api.PostStartContainerRequest,
        api.PostStartContainerResponse,
        Event.POST_START_CONTAINER,
    ),
    (
        "PostUpdateContainer",
        api.PostUpdateContainerRequest,
        api.PostUpdateContainerResponse,
        Event.POST_UPDATE_CONTAINER,
    ),
    (
        "RemoveContainer",
        api.RemoveContainerRequest,
        api.RemoveContainerResponse,
        Event.REMOVE_CONTAINER,
    ),
]


def test_every_dedicated_event_rpc_reaches_the_plugin() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            await lb.runtime.start()
            for method, request_type, response_type, _ in POD_RPCS:
                reply = await lb.runtime.call(method, request_type(pod=pod("p1")), response_type)
                assert reply == response_type()
            for method, request_type, response_type, _ in CONTAINER_RPCS:
                reply = await lb.runtime.call(
                    method,
                    request_type(pod=pod("p1"), container=container("c1", "p1")),
                    response_type,
                )
                assert reply == response_type()
            assert plugin.pod_events == [(kind, "p1") for *_, kind in POD_RPCS]
            assert plugin.container_events == [(kind, "p1", "c1") for *_, kind in CONTAINER_RPCS]

    run(scenario())


def test_the_session_says_when_the_runtime_s_requests_have_been_answered() -> None:
    """Observers are told the connection is idle (the plugin's deferred work waits for it)
    after each answered event."""
    plugin = RecordingPlugin()
    answered: list[int] = []

    class Idle(SessionObserver):
        def idle(self) -> None:
            answered.append(len(plugin.pod_events))

    async def scenario() -> None:
        async with loopback(plugin, observers=[Idle()]) as lb:
            await lb.runtime.start()
            before = len(answered)
            for n in range(2):
                method, request_type, response_type, _ = POD_RPCS[0]
                await lb.runtime.call(method, request_type(pod=pod(f"p{n}")), response_type)
            assert answered[before:] == [1, 2]

    run(scenario())


def test_observers_may_ask_their_connection_whether_a_request_is_in_progress() -> None:
    """`connected` hands observers each connection: busy while an event is served, and its
    writes to the runtime counted (what the deferred work asks before each piece)."""
    links: list[Link] = []
    seen: list[tuple[bool, int]] = []

    async def during(_event: Event) -> None:
        seen.append((links[-1].busy(), links[-1].writes))

    class Connections(SessionObserver):
        def connected(self, link: Link) -> None:
            links.append(link)

    plugin = RecordingPlugin(on_event=during)

    async def scenario() -> None:
        async with loopback(plugin, observers=[Connections()]) as lb:
            await lb.runtime.start()
            (link,) = links
            method, request_type, response_type, _ = POD_RPCS[0]
            await lb.runtime.call(method, request_type(pod=pod("p")), response_type)
            await asyncio.sleep(0)
            (during_event,) = seen
            assert during_event[0] is True
            assert link.busy() is False
            assert link.writes > during_event[1]  # the event's reply, at least

    run(scenario())


def test_every_state_change_event_reaches_the_plugin() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            await lb.runtime.start(runtime_version="v1.7.24")
            for *_, kind in POD_RPCS + CONTAINER_RPCS:
                reply = await lb.runtime.call(
                    "StateChange",
                    api.StateChangeEvent(
                        event=kind, pod=pod("p2"), container=container("c2", "p2")
                    ),
                    api.Empty,
                )
                assert reply == api.Empty()
            assert plugin.pod_events == [(kind, "p2") for *_, kind in POD_RPCS]
            assert plugin.container_events == [(kind, "p2", "c2") for *_, kind in CONTAINER_RPCS]

    run(scenario())


def test_an_event_the_plugin_does_not_handle_gets_an_empty_reply() -> None:
    """As from the Go stub: a runtime may call any method; only defined handlers run."""
    plugin = RecordingPlugin({Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER})

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            configured, _ = await lb.runtime.start()
            assert configured.events == Event.CREATE_CONTAINER.bit | Event.REMOVE_CONTAINER.bit
            ctr = container("c", "p")
            stopped = await lb.runtime.call(
                "StopContainer",
                api.StopContainerRequest(pod=pod("p"), container=ctr),
                api.StopContainerResponse,
            )
            assert stopped == api.StopContainerResponse()
            started = api.StartContainerRequest(pod=pod("p"), container=ctr)
            await lb.runtime.call("StartContainer", started, api.StartContainerResponse)
            await lb.runtime.call(
                "RemoveContainer",
                api.RemoveContainerRequest(pod=pod("p"), container=ctr),
                api.RemoveContainerResponse,
            )
            assert plugin.stopped == []
            assert plugin.container_events == [(Event.REMOVE_CONTAINER, "p", "c")]

    run(scenario())


def test_a_failing_handler_traceback_names_the_methods_it_went_through() -> None:
    """Named bound methods, not closures (it read _serve, run, run, run, handle, ...)."""
    failures: list[BaseException] = []

    class Failing(RecordingPlugin):
        async def create_container(
            self, pod: api.PodSandbox, container: api.Container
        ) -> api.CreateContainerResponse:
            raise ValueError("no")

    class Call:
        def replied(self, response: Message) -> None:
            pass

        def failed(self, error: BaseException) -> None:
            failures.append(error)

    class Recorder(SessionObserver):
        def call_begun(self, method: str, request: Message) -> Call:
            return Call()

    async def scenario() -> None:
        plugin_end, runtime_end = socket.socketpair()
        runtime = await LoopbackRuntime.over(runtime_end)
        session = Session(Failing(), "midbatch", "10", observers=[Recorder()])
        task = asyncio.create_task(session.run(plugin_end))
        await runtime.start()
        request = api.CreateContainerRequest(pod=pod("p"), container=container("c", "p"))
        with pytest.raises(RpcError):
            await runtime.call("CreateContainer", request, api.CreateContainerResponse)
        await runtime.close()
        await asyncio.gather(task, return_exceptions=True)

    run(scenario())
    (error,) = failures
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert frames == ["_serve", "_around", "_create_container", "create_container"]


def test_state_change_with_unknown_event_is_acknowledged() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            await lb.runtime.start()
            reply = await lb.runtime.call("StateChange", api.StateChangeEvent(event=99), api.Empty)
            assert reply == api.Empty()
            assert plugin.pod_events == []
            assert plugin.container_events == []

    run(scenario())


def test_unknown_state_change_events_are_warned_of_a_few_times_a_minute() -> None:
    """Issue 24: 149 bytes of warning per message, without a limit; now 5 a minute, then a count."""
    now = [0.0]

    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "10", clock=lambda: now[0])
        peer, task = await registered_raw(session)
        stream = itertools.count(3, 2)
        for event_id in range(100, 1100):
            request = api.StateChangeEvent(event=event_id)
            peer.send_request(1, next(stream), PLUGIN_SERVICE, "StateChange", request)
            _, response = await peer.read_response(1)
            assert not response.HasField("status")  # acknowledged all the same
        now[0] = 60.0
        peer.send_request(
            1, next(stream), PLUGIN_SERVICE, "StateChange", api.StateChangeEvent(event=99)
        )
        await peer.read_response(1)
        peer.close()
        await task

    with capture_logs() as logs:
        run(scenario())
    warnings = [line for line in logs if line["event"] == "unknown event in StateChange"]
    assert [(w["event_id"], w["suppressed_before"]) for w in warnings] == [
        (100, 0),
        (101, 0),
        (102, 0),
        (103, 0),
        (104, 0),
        (99, 995),
    ]


def test_unimplemented_plugin_method_triggers_the_go_fallback_status() -> None:
    async def scenario() -> None:
        async with loopback(RecordingPlugin()) as lb:
            await lb.runtime.start()
            with pytest.raises(RpcError) as info:
                await lb.runtime.call("FutureEvent", api.Empty(), api.Empty)
            assert (info.value.code, info.value.message) == (
                Code.UNIMPLEMENTED,
                "method FutureEvent",
            )

    run(scenario())


def test_lifecycle_rpcs_reach_the_plugin() -> None:
    adjust = api.ContainerAdjustment(annotations={"a": "b"})
    plugin = RecordingPlugin(create_response=api.CreateContainerResponse(adjust=adjust))

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            await lb.runtime.start()
            created = await lb.runtime.call(
                "CreateContainer",
                api.CreateContainerRequest(pod=pod("p"), container=container("c", "p")),
                api.CreateContainerResponse,
            )
            assert created.adjust == adjust
            resources = api.LinuxResources(cpu=api.LinuxCPU(shares=api.OptionalUInt64(value=2)))
            updated = await lb.runtime.call(
                "UpdateContainer",
                api.UpdateContainerRequest(
                    pod=pod("p"), container=container("c", "p"), linux_resources=resources
                ),
                api.UpdateContainerResponse,
            )
            assert list(updated.update) == [update("c")]
            stopped = await lb.runtime.call(
                "StopContainer",
                api.StopContainerRequest(pod=pod("p"), container=container("c", "p")),
                api.StopContainerResponse,
            )
            assert list(stopped.update) == [update("c")]
            await lb.runtime.call(
                "UpdatePodSandbox",
                api.UpdatePodSandboxRequest(pod=pod("p"), linux_resources=resources),
                api.UpdatePodSandboxResponse,
            )
            assert plugin.created == [("p", "c")]
            assert plugin.updated == [("p", "c", resources)]
            assert plugin.stopped == [("p", "c")]
            assert [(p, r) for p, _, r in plugin.pod_updates] == [("p", resources)]

    run(scenario())


def test_validate_container_adjustment_approves() -> None:
    async def scenario() -> None:
        async with loopback(RecordingPlugin()) as lb:
            await lb.runtime.start()
            reply = await lb.runtime.call(
                "ValidateContainerAdjustment",
                api.ValidateContainerAdjustmentRequest(pod=pod("p"), container=container("c")),
                api.ValidateContainerAdjustmentResponse,
            )
            assert reply.reject is False
            assert reply.reason == ""

    run(scenario())


def test_shutdown_answers_empty() -> None:
    async def scenario() -> None:
        async with loopback(RecordingPlugin()) as lb:
            await lb.runtime.start()
            assert await lb.runtime.call("Shutdown", api.Empty(), api.Empty) == api.Empty()
            assert lb.session.state.registered  # still connected

    run(scenario())


# ---------------------------------------------------------------------------
# UpdateContainers (§4.5)
# ---------------------------------------------------------------------------


def test_update_containers_awaited_in_an_event_handler_raises() -> None:
    errors: list[BaseException] = []
    holder: dict[str, Session] = {}

    async def hook(_event: Event) -> None:
        try:
            await holder["session"].update_containers([update("c1")])
        except RuntimeError as exc:
            errors.append(exc)

    plugin = RecordingPlugin(on_event=hook)

    async def scenario() -> None:
        async with loopback(plugin) as lb:
            holder["session"] = lb.session
            await lb.runtime.start()
            await lb.runtime.call(
                "StartContainer",
                api.StartContainerRequest(pod=pod("p"), container=container("c1", "p")),
                api.StartContainerResponse,
            )
            await lb.runtime.call(
                "CreateContainer",
                api.CreateContainerRequest(pod=pod("p"), container=container("c1", "p")),
                api.CreateContainerResponse,
            )
            assert len(errors) == 2
            assert all("as the reload pass does" in str(e) for e in errors)
            assert lb.runtime.record.updates == []

    run(scenario())


def test_update_containers_outside_handlers_returns_failed() -> None:
    async def scenario() -> None:
        async with loopback(RecordingPlugin(), failed_updates=["bad"]) as lb:
            await lb.runtime.start()
            assert await lb.session.update_containers([update("good")]) == []
            failed = await lb.session.update_containers([update("bad"), update("ok")])
            assert failed == [update("bad")]
            assert lb.runtime.record.updates == [update("good"), update("bad"), update("ok")]

    run(scenario())


def test_update_containers_before_configure_raises() -> None:
    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "10")
        with pytest.raises(RuntimeError):
            await session.update_containers([update("c")])

    run(scenario())


# ---------------------------------------------------------------------------
# Ending
# ---------------------------------------------------------------------------


def test_run_returns_the_close_reason_and_resets_state() -> None:
    states: list[tuple[bool, bool, bool]] = []
    plugin = RecordingPlugin()

    class States(SessionObserver):
        def state_changed(self, state: SessionState) -> None:
            states.append((state.registered, state.configured, state.synchronized))

    async def scenario() -> None:
        async with loopback(plugin, observers=[States()]) as lb:
            await lb.runtime.start()
            await lb.runtime.close()
            assert await lb.task == "closed by peer"
            assert states[-1] == (False, False, False)
            assert (True, True, True) in states

    run(scenario())


def test_session_close_ends_run() -> None:
    async def scenario() -> None:
        async with loopback(RecordingPlugin()) as lb:
            await lb.runtime.start()
            lb.session.close()
            assert await lb.task == "session closed"

    run(scenario())


# ---------------------------------------------------------------------------
# The failure contract: any reply to our calls is a result or RpcError
# ---------------------------------------------------------------------------


async def registered_raw(session: Session) -> tuple[RawPeer, asyncio.Task[str]]:
    """A raw runtime that has registered and configured `session`."""
    peer, sock = await RawPeer.pair()
    task = asyncio.create_task(session.run(sock))
    message, _ = await peer.read_request(2)
    peer.send_response(2, message.stream_id, raw=b"")
    peer.send_request(1, 1, PLUGIN_SERVICE, "Configure", configure())
    await peer.read_response(1)
    return peer, task


@pytest.mark.parametrize(
    ("kind", "body", "code"),
    [
        (1, b"", Code.INTERNAL),  # a Request where the reply belongs
        (2, b"\xff\xff", Code.INTERNAL),  # an undecodable Response
        (2, ttrpc_pb2.Response(payload=b"\xff").SerializeToString(), Code.INTERNAL),
        (None, b"", Code.DEADLINE_EXCEEDED),  # no reply at all
    ],
    ids=["wrong type", "garbage", "garbage payload", "no answer"],
)
def test_update_containers_fails_only_with_rpc_error(
    kind: int | None, body: bytes, code: Code
) -> None:
    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "10")
        peer, task = await registered_raw(session)
        # Short only where no answer comes: a reply must not race the deadline.
        deadline = 0.2 if kind is None else STEP_TIMEOUT
        call = asyncio.create_task(session.update_containers([update("c")], timeout=deadline))
        message, request = await peer.read_request(2)
        assert request.method == "UpdateContainers"
        if kind is not None:
            peer.send(2, message.stream_id, kind, body)
        with pytest.raises(RpcError) as info:
            await call
        assert info.value.code == code
        assert session.state.configured  # the session goes on
        peer.close()
        await task

    run(scenario())


def test_update_containers_has_a_deadline_by_default() -> None:
    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "10")
        peer, task = await registered_raw(session)
        call = asyncio.create_task(session.update_containers([update("c")]))
        _, request = await peer.read_request(2)
        assert request.timeout_nano == 10_000_000_000
        call.cancel()
        peer.close()
        await task

    run(scenario())


# ---------------------------------------------------------------------------
# The lifecycle: requests illegal in the current phase get a status
# ---------------------------------------------------------------------------


def test_event_before_configure_and_second_configure_are_refused() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        peer, sock = await RawPeer.pair()
        session = Session(plugin, "midbatch", "10", registration_timeout=STEP_TIMEOUT)
        task = asyncio.create_task(session.run(sock))
        await peer.read_request(2)
        create = api.CreateContainerRequest(pod=pod("p"), container=container("c", "p"))
        peer.send_request(1, 1, PLUGIN_SERVICE, "CreateContainer", create)
        _, response = await peer.read_response(1)
        assert response.status.code == Code.FAILED_PRECONDITION
        assert response.status.message == (
            "CreateContainer is not allowed while the plugin is connecting"
        )
        assert plugin.created == []
        peer.send_request(1, 3, PLUGIN_SERVICE, "Configure", configure())
        _, response = await peer.read_response(1)
        assert not response.HasField("status")
        peer.send_request(1, 5, PLUGIN_SERVICE, "Configure", configure())
        _, response = await peer.read_response(1)
        assert response.status.code == Code.FAILED_PRECONDITION
        assert "Configure is not allowed while the plugin is configured" in response.status.message
        assert len(plugin.configs) == 1
        peer.close()
        with pytest.raises(RegistrationError):  # RegisterPlugin was never answered
            await task

    run(scenario())


def test_create_container_between_split_synchronize_chunks_is_served() -> None:
    """Issue 24: it was refused with status 9; NRI's Go stub serves it, and so do we."""
    plugin = RecordingPlugin()

    async def scenario() -> None:
        session = Session(plugin, "midbatch", "10")
        peer, task = await registered_raw(session)
        chunk = api.SynchronizeRequest(pods=[pod("p")], more=True)
        peer.send_request(1, 3, PLUGIN_SERVICE, "Synchronize", chunk)
        _, response = await peer.read_response(1)
        assert api.SynchronizeResponse.FromString(response.payload).more
        phases = [session.state.phase]
        create = api.CreateContainerRequest(pod=pod("q"), container=container("c", "q"))
        peer.send_request(1, 5, PLUGIN_SERVICE, "CreateContainer", create)
        _, response = await peer.read_response(1)
        assert not response.HasField("status")
        assert plugin.created == [("q", "c")]
        phases.append(session.state.phase)  # the sync goes on
        last = api.SynchronizeRequest(pods=[pod("r")])
        peer.send_request(1, 7, PLUGIN_SERVICE, "Synchronize", last)
        _, response = await peer.read_response(1)
        assert not response.HasField("status")
        phases.append(session.state.phase)
        assert phases == [Phase.SYNCHRONIZING, Phase.SYNCHRONIZING, Phase.READY]
        # Both chunks made one Synchronize; the event was no part of it.
        assert [[p.id for p in pods] for pods, _ in plugin.syncs] == [["p", "r"]]
        peer.close()
        await task

    run(scenario())


def test_each_chunk_goes_to_the_plugin_as_it_arrives() -> None:
    """The session keeps no chunk: a node's Synchronize is never held as protobuf at once."""
    plugin = RecordingPlugin()

    async def scenario() -> None:
        session = Session(plugin, "midbatch", "10")
        peer, task = await registered_raw(session)
        chunk = api.SynchronizeRequest(pods=[pod("p0"), pod("q0")], more=True)
        peer.send_request(1, 3, PLUGIN_SERVICE, "Synchronize", chunk)
        await peer.read_response(1)
        # Taken in before the last chunk comes.
        assert [p.id for p in plugin.parts[0]] == ["p0", "q0"]
        last = api.SynchronizeRequest(pods=[pod("p1")])
        peer.send_request(1, 5, PLUGIN_SERVICE, "Synchronize", last)
        await peer.read_response(1)
        ((pods, _),) = plugin.syncs
        assert [p.id for p in pods] == ["p0", "q0", "p1"]
        assert (session.state.sync_pods, session.state.sync_containers) == (3, 0)
        peer.close()
        await task

    run(scenario())


def test_split_synchronize_is_bounded() -> None:
    """Chunks with more=true are buffered up to a bound, then refused, and the buffer dropped."""
    plugin = RecordingPlugin()

    async def scenario() -> None:
        session = Session(plugin, "midbatch", "10", sync_limits=SyncLimits(objects=5))
        peer, task = await registered_raw(session)
        stream = 3
        for i in range(2):
            chunk = api.SynchronizeRequest(pods=[pod(f"p{i}"), pod(f"q{i}")], more=True)
            peer.send_request(1, stream, PLUGIN_SERVICE, "Synchronize", chunk)
            stream += 2
            _, response = await peer.read_response(1)
            assert not response.HasField("status")
        chunk = api.SynchronizeRequest(pods=[pod("p3"), pod("q3")], more=True)
        peer.send_request(1, stream, PLUGIN_SERVICE, "Synchronize", chunk)
        _, response = await peer.read_response(1)
        assert response.status.code == Code.RESOURCE_EXHAUSTED
        assert "6 pods and containers" in response.status.message
        assert session.state.sync_receiving == 0
        assert plugin.parts == ([], [])  # nothing kept
        assert session.state.phase.value == "configured"
        assert plugin.syncs == []
        peer.close()
        await task

    run(scenario())


def test_split_synchronize_is_bounded_in_bytes() -> None:
    plugin = RecordingPlugin()

    async def scenario() -> None:
        session = Session(plugin, "midbatch", "10", sync_limits=SyncLimits(bytes=10_000))
        peer, task = await registered_raw(session)
        big = pod("p")
        big.annotations["a"] = "x" * 6_000
        for stream, code in ((3, Code.OK), (5, Code.RESOURCE_EXHAUSTED)):
            chunk = api.SynchronizeRequest(pods=[big], more=True)
            peer.send_request(1, stream, PLUGIN_SERVICE, "Synchronize", chunk)
            _, response = await peer.read_response(1)
            assert response.status.code == code
        peer.close()
        await task

    run(scenario())


def test_protocol_violations_are_counted_across_connections() -> None:
    """What the wire layer refuses or drops is counted, live and after the connection ends."""

    async def scenario() -> None:
        session = Session(RecordingPlugin(), "midbatch", "10")
        peer, task = await registered_raw(session)
        assert session.protocol_violations() == (0, 0)
        peer.send_request(1, 7, "no.such.Service", "Nothing", api.Empty())
        _, response = await peer.read_response(1)
        assert response.status.code != Code.OK
        peer.send(1, 99, 2, ttrpc_pb2.Response().SerializeToString())  # a reply to no call
        peer.send_request(1, 9, PLUGIN_SERVICE, "Synchronize", api.SynchronizeRequest())
        await peer.read_response(1)  # the stray reply was read before this request
        assert session.protocol_violations() == (1, 1)
        peer.close()
        await task
        assert session.protocol_violations() == (1, 1)

    run(scenario())
