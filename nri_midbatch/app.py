"""The running process: configuration, plugin and session, kept connected."""

from __future__ import annotations

import asyncio

import structlog

from nri_midbatch.config import Config, ConfigError, load_config_file
from nri_midbatch.nri.runner import run_external, run_prelaunched
from nri_midbatch.nri.session import Session
from nri_midbatch.plugin import MidBatchPlugin
from nri_midbatch.record import Recorder, note_decision

__all__ = ["App", "ConfigError", "load_startup_config"]

log = structlog.get_logger(__name__)


def load_startup_config(path: str | None) -> Config:
    return load_config_file(path) if path else Config()


class App:
    def __init__(
        self,
        config: Config,
        *,
        name: str,
        idx: str,
        config_path: str | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.plugin = MidBatchPlugin(
            config, on_decision=None if recorder is None else note_decision
        )
        self.session = Session(self.plugin, name, idx, recorder=recorder)
        self.config_path = config_path
        self._stop = asyncio.Event()

    def stop(self) -> None:
        log.info("stopping")
        self._stop.set()
        self.session.close()

    async def run_external(self, socket_path: str) -> int:
        log.info("starting", mode="external", socket=socket_path)
        await run_external(self.session, socket_path, self._stop)
        return 0

    async def run_prelaunched(self, fd: int) -> int:
        log.info("starting", mode="pre-launched", fd=fd)
        reason = await run_prelaunched(self.session, fd)
        log.info("runtime connection ended", reason=reason)
        return 0
