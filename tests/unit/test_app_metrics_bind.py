"""A metrics address taken at start: the plugin runs on, says so, and binds once it is free.

NRI comes first: a plugin that exits over a port leaves the node's pods without values.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest
from structlog.testing import capture_logs

from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config
from nri_midbatch.process.app import App

from .app_node import until
from .nri_fixtures import STEP_TIMEOUT, run


def test_a_taken_metrics_address_is_logged_counted_and_bound_once_free() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]

    async def scenario() -> str:
        with capture_logs() as logs:
            app = App(
                settings_of(Config()),
                name="midbatch",
                idx="10",
                config_path=None,
                metrics_address=f"127.0.0.1:{port}",
                metrics_retry_seconds=0.01,
            )
        assert app.health is None
        (error,) = [line for line in logs if line["log_level"] == "error"]
        assert error["event"] == "cannot serve metrics, retrying"
        assert error["address"] == f"127.0.0.1:{port}"
        async with app._services():
            # Retried while the port is taken, and still not serving. The App retries on its
            # own timer and tells nothing but these counts: asked again until they show.
            await until(lambda: app.metrics_bind_failures >= 2, "retried")
            assert app.health is None
            holder.close()
            await until(lambda: app.health is not None, "serving once the port is free")
            url = f"http://127.0.0.1:{port}/metrics"
            return await asyncio.to_thread(
                lambda: urllib.request.urlopen(url, timeout=STEP_TIMEOUT).read().decode()
            )

    text = run(scenario())
    failures = [
        line for line in text.splitlines() if line.startswith("nri_midbatch_metrics_bind_failures")
    ]
    assert failures and float(failures[0].split()[-1]) >= 2, failures


def test_an_address_that_cannot_be_bound_for_good_still_raises() -> None:
    """A typo is the operator's to fix at once: the caller reports it (exit 2)."""
    with pytest.raises(OSError):
        App(
            settings_of(Config()),
            name="midbatch",
            idx="10",
            config_path=None,
            metrics_address="no-such-host.invalid:9464",
        )
