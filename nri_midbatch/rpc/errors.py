"""Errors of the asyncio ttrpc layer."""

from __future__ import annotations

from nri_midbatch.wire.status import Code


class RpcError(Exception):
    """A call failed with a status; handlers raise it to reply with that status."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class ConnectionClosed(Exception):
    """The socket closed; calls in flight and later calls fail with this."""
