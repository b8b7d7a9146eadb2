"""Which events a plugin handles: derived from the handlers it defines, as NRI's Go stub does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.nri.events import Event, handled_events, handles, mask
from nri_midbatch.nri.session import Session


class Creates:
    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        return api.CreateContainerResponse()


class CreatesAndForgets(Creates):
    @handles(Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX)
    async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
        pass

    @handles(Event.REMOVE_CONTAINER)
    async def container_event(
        self, event: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        pass

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        return []


def test_the_mask_is_the_handlers_defined() -> None:
    assert handled_events(Creates()) == {Event.CREATE_CONTAINER}
    assert handled_events(CreatesAndForgets()) == {
        Event.CREATE_CONTAINER,
        Event.STOP_CONTAINER,
        Event.RUN_POD_SANDBOX,
        Event.REMOVE_POD_SANDBOX,
        Event.REMOVE_CONTAINER,
    }
    assert mask(handled_events(CreatesAndForgets())) == 0x8 | 0x200 | 0x1 | 0x4 | 0x400


def test_an_unmarked_event_handler_handles_nothing() -> None:
    class Unmarked(Creates):
        async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
            pass

    assert handled_events(Unmarked()) == {Event.CREATE_CONTAINER}


def test_a_plugin_with_no_handler_is_refused() -> None:
    """As the Go stub's New refuses it: a mask of 0 would subscribe to everything."""

    class Idle:
        async def configure(self, config: str, runtime: object) -> None:
            pass

    with pytest.raises(TypeError, match="Idle handles no NRI event"):
        handled_events(Idle())
    with pytest.raises(TypeError, match="handles no NRI event"):
        Session(Idle(), "midbatch", "10")  # type: ignore[arg-type]


def test_a_mark_naming_the_wrong_kind_of_event_is_refused() -> None:
    class Confused:
        @handles(Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER)
        async def container_event(
            self, event: Event, pod: api.PodSandbox, container: api.Container
        ) -> None:
            pass

    with pytest.raises(TypeError, match=r"Confused.container_event cannot handle CREATE_CONTAINER"):
        handled_events(Confused())
