"""Protocol errors, split by blame as in h11."""

from __future__ import annotations


class ProtocolError(Exception):
    """Root of all errors raised by the protocol core."""


class LocalProtocolError(ProtocolError):
    """Our caller misused the API (e.g. answered a stream that is not open)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the mux or ttrpc framing."""


class FrameTooLargeError(RemoteProtocolError):
    """A frame header announced more data than the protocol allows.

    Raised as soon as the header parses, before any of the data is buffered.
    """


class MessageTooLargeError(LocalProtocolError):
    """We were asked to send a ttrpc message above the 4 MiB limit; raised before anything is
    queued, so the caller can answer RESOURCE_EXHAUSTED instead (docs/developer/nri-protocol.md
    §1.1)."""
