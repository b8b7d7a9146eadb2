"""The lifecycle table read as the reference's registration and Synchronize rules (§4.1, §4.2)."""

from __future__ import annotations

import pytest

from nri_midbatch.nri.events import Event, mask
from nri_midbatch.nri.lifecycle import TRANSITIONS, Phase, Step, transition
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code


def legal(phase: Phase, step: Step) -> bool:
    return (phase, step) in TRANSITIONS


def test_configure_may_overtake_the_register_plugin_reply() -> None:
    assert transition(Phase.CONNECTING, Step.CONFIGURE) is Phase.CONFIGURED
    assert transition(Phase.CONFIGURED, Step.REGISTER_REPLY) is Phase.CONFIGURED


def test_configure_comes_once_per_registration() -> None:
    assert [p for p in Phase if legal(p, Step.CONFIGURE)] == [Phase.CONNECTING, Phase.REGISTERED]


def test_events_flow_once_configured_and_between_the_chunks_of_a_split_synchronize() -> None:
    # Runtimes before NRI v0.7 never synchronize pre-launched plugins; the Go stub
    # serves an event between sync chunks, so we do too, and the sync goes on.
    assert [p for p in Phase if legal(p, Step.EVENT)] == [
        Phase.CONFIGURED,
        Phase.SYNCHRONIZING,
        Phase.READY,
    ]
    assert transition(Phase.SYNCHRONIZING, Step.EVENT) is Phase.SYNCHRONIZING


def test_synchronize_follows_configure_and_a_failed_one_leaves_the_plugin_not_ready() -> None:
    assert not legal(Phase.CONNECTING, Step.SYNC_DONE)
    assert not legal(Phase.REGISTERED, Step.SYNC_CHUNK)
    assert transition(Phase.CONFIGURED, Step.SYNC_CHUNK) is Phase.SYNCHRONIZING
    assert transition(Phase.SYNCHRONIZING, Step.SYNC_DONE) is Phase.READY
    assert transition(Phase.SYNCHRONIZING, Step.SYNC_FAILED) is Phase.CONFIGURED


def test_every_phase_can_close_and_only_closed_can_connect() -> None:
    assert all(transition(p, Step.CLOSE) is Phase.CLOSED for p in Phase)
    assert [p for p in Phase if legal(p, Step.CONNECT)] == [Phase.CLOSED]


def test_an_illegal_step_is_failed_precondition_naming_the_request() -> None:
    with pytest.raises(RpcError) as info:
        transition(Phase.REGISTERED, Step.EVENT, "CreateContainer")
    assert info.value.code == Code.FAILED_PRECONDITION
    assert info.value.message == "CreateContainer is not allowed while the plugin is registered"


def test_mask_is_one_bit_per_event() -> None:
    assert mask(frozenset({Event.CREATE_CONTAINER, Event.START_CONTAINER})) == 0x28
    assert mask(frozenset(Event)) == 0x3FFF
