"""Errors raised by the sans-IO codecs and the ttrpc connection.

As in h11, a protocol error says whose fault it is: `RemoteProtocolError` is
the peer's (it sent something no valid stream contains), `LocalProtocolError`
ours (we were asked to send something the peer would reject). Each carries the
status a reply or a failed call should have, so no caller has to guess one.
"""

from __future__ import annotations

from nri_midbatch.wire.status import Code


class ProtocolError(Exception):
    """Something that cannot be part of a valid mux or ttrpc stream."""

    def __init__(self, message: str, *, status_hint: Code = Code.INTERNAL) -> None:
        super().__init__(message)
        self.status_hint = status_hint


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol.

    Raised for framing errors, after which we no longer know where the next
    message starts: the only sane reaction is to drop the connection.
    """


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol (or a stated bound) forbids."""


class OversizedMessageError(LocalProtocolError):
    """We were asked to send a ttrpc message larger than the peer accepts."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_hint=Code.RESOURCE_EXHAUSTED)
