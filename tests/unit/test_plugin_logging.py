"""What the plugin logs about its decisions, and at which level."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.obs.logging import configure_logging, set_level
from nri_midbatch.plugin.handlers import MidBatchPlugin
from tests.factory import pod

PROD = pod("p", qos="LS", name="prod", namespace="ns")
APP = api.Container(id="c", name="app", pod_sandbox_id="p")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    sink = io.StringIO()
    configure_logging("info", "json", sink)
    try:
        yield sink
    finally:
        structlog.reset_defaults()


def records(sink: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sink.getvalue().splitlines()]


def test_untouched_workloads_are_logged_at_debug_only(lines: io.StringIO) -> None:
    plugin = MidBatchPlugin(settings_of(Config()), dry_run=True)
    asyncio.run(plugin.create_container(PROD, APP))
    assert [r for r in records(lines) if r["event"] == "untouched"] == []

    set_level("debug")  # what SIGUSR1 does
    asyncio.run(plugin.create_container(PROD, APP))
    (untouched,) = [r for r in records(lines) if r["event"] == "untouched"]
    assert untouched["level"] == "debug"
    assert (untouched["namespace"], untouched["pod"], untouched["container"]) == (
        "ns",
        "prod",
        "app",
    )
    assert untouched["why"] == "no tier matched: pod left alone"
