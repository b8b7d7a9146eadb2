"""Errors of the asyncio ttrpc layer, and the one place an exception becomes a status."""

from __future__ import annotations

import asyncio

from nri_midbatch.wire.status import Code


class RpcError(Exception):
    """A call failed with a status; handlers raise it to reply with that status."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class ConnectionClosed(Exception):
    """The socket closed; calls in flight and later calls fail with this."""


def error_status(error: BaseException) -> tuple[Code, str]:
    """The status a handler's exception is answered with (and recorded as)."""
    if isinstance(error, RpcError):
        return error.code, error.message
    if isinstance(error, TimeoutError):
        return Code.DEADLINE_EXCEEDED, "context deadline exceeded"
    if isinstance(error, asyncio.CancelledError):
        return Code.CANCELLED, "cancelled before replying"
    return Code.UNKNOWN, f"{type(error).__name__}: {error}"
