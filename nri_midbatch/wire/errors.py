"""Errors raised by the sans-IO codecs."""


class ProtocolError(Exception):
    """The peer sent bytes that cannot be a valid mux or ttrpc stream.

    The only sane reaction is to drop the connection: after a framing error we
    no longer know where the next message starts.
    """


class OversizedMessageError(ProtocolError):
    """We were asked to send a ttrpc message larger than the peer accepts."""
