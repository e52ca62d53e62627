"""A test-only NRI runtime: raw mux/ttrpc frames built with ``struct`` here.

Deliberately independent of ``nri_plugin.nri.wire``, so a framing bug in production
code cannot hide behind the same bug in the peer. It plays the Go runtime's
part (docs/developer/nri-protocol.md §2.2): it serves the Runtime service on conn 2,
calls the Plugin service on conn 1, and checks the frame-size rule
(docs/developer/nri-protocol.md §2.4) on every frame the plugin writes, as the Go reader
would.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

from nri_plugin.nri.api import nri_pb2, ttrpc_pb2
from tests.nri_apply import CdiInjector, apply_adjustment

_Reply = TypeVar("_Reply", bound=Message)  # what a call's reply parses as

MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
PLUGIN_CONN, RUNTIME_CONN = 1, 2
REQUEST, RESPONSE = 1, 2
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
GO_READ_BUFFER = 4096
# A bound on any one wait for the plugin: only a hang gets there (the plugin may be a process
# of its own on a loaded machine).
HANG = 60.0


def mux_frame(conn_id: int, payload: bytes) -> bytes:
    return MUX.pack(conn_id, len(payload)) + payload


def ttrpc_frame(stream_id: int, mtype: int, data: bytes, flags: int = 0) -> bytes:
    return TTRPC.pack(len(data), stream_id, mtype, flags) + data


def request_bytes(
    service: str, method: str, payload: bytes = b"", *, timeout_nano: int = 0
) -> bytes:
    req = ttrpc_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout_nano
    )
    return req.SerializeToString()


def plugin_call_frame(stream_id: int, method: str, payload: bytes) -> bytes:
    """One whole Plugin-service call as the runtime writes it: a mux frame on the plugin's
    connection around one ttrpc request frame."""
    return mux_frame(PLUGIN_CONN, ttrpc_frame(
        stream_id, REQUEST, request_bytes(PLUGIN_SERVICE, method, payload)))


class RecordingTransport:
    """A transport a plugin's session writes to in process (no socket): keeps what is
    written, with the time of the first write since ``clear`` (what a runtime waits for)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.first_write = 0

    def clear(self) -> None:
        self.written.clear()
        self.first_write = 0

    def write(self, data: bytes) -> None:
        if not self.first_write:
            self.first_write = time.perf_counter_ns()
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int) -> None:
        pass


def response_bytes(payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
    resp = ttrpc_pb2.Response(payload=payload)
    if code:
        resp.status.code = code
        resp.status.message = message
    return resp.SerializeToString()


@dataclass
class PeerMessage:
    conn_id: int
    stream_id: int
    type: int
    flags: int
    data: bytes

    def request(self) -> ttrpc_pb2.Request:
        assert self.type == REQUEST, self
        return ttrpc_pb2.Request.FromString(self.data)

    def response(self) -> ttrpc_pb2.Response:
        assert self.type == RESPONSE, self
        return ttrpc_pb2.Response.FromString(self.data)


@dataclass
class RawParser:
    """Parses the plugin's byte stream; records violations of docs/developer/nri-protocol.md §2.4
    instead of dying."""

    trunk: bytearray = field(default_factory=bytearray)
    streams: dict[int, bytearray] = field(
        default_factory=lambda: {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
    )
    frames_in_message: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0})
    violations: list[str] = field(default_factory=list)
    mux_frames: list[tuple[int, int]] = field(default_factory=list)  # (conn, size)

    def feed(self, data: bytes) -> list[PeerMessage]:
        self.trunk += data
        out: list[PeerMessage] = []
        while len(self.trunk) >= MUX.size:
            conn_id, size = MUX.unpack_from(self.trunk)
            if len(self.trunk) < MUX.size + size:
                break
            payload = bytes(self.trunk[MUX.size : MUX.size + size])
            del self.trunk[: MUX.size + size]
            self._check_frame(conn_id, payload)
            self.streams[conn_id] += payload
            out.extend(self._messages(conn_id))
        return out

    def _check_frame(self, conn_id: int, payload: bytes) -> None:
        self.mux_frames.append((conn_id, len(payload)))
        if conn_id not in self.streams:
            self.violations.append(f"unknown conn id {conn_id}")
            self.streams[conn_id] = bytearray()
            self.frames_in_message[conn_id] = 0
        starts_message = not self.streams[conn_id]
        if starts_message and len(payload) > GO_READ_BUFFER:
            self.violations.append(f"{len(payload)}-byte frame starts a message on conn {conn_id}")
        self.frames_in_message[conn_id] += 1
        if self.frames_in_message[conn_id] > 2:
            self.violations.append(f"message on conn {conn_id} split over more than 2 frames")

    def _messages(self, conn_id: int) -> list[PeerMessage]:
        buf = self.streams[conn_id]
        out = []
        while len(buf) >= TTRPC.size:
            length, stream_id, mtype, flags = TTRPC.unpack_from(buf)
            if len(buf) < TTRPC.size + length:
                break
            data = bytes(buf[TTRPC.size : TTRPC.size + length])
            del buf[: TTRPC.size + length]
            out.append(PeerMessage(conn_id, stream_id, mtype, flags, data))
            self.frames_in_message[conn_id] = 0
        return out


class RuntimePeer:
    """The runtime end of one connection, driven step by step by a test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = RawParser()
        self.inbox: list[PeerMessage] = []
        self.next_stream = 1
        self.calls_served: list[str] = []

    # --- raw I/O ---

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = HANG) -> PeerMessage:
        """The next whole ttrpc message from the plugin, in arrival order."""
        while not self.inbox:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("plugin closed the connection")
            self.inbox.extend(self.parser.feed(data))
        return self.inbox.pop(0)

    async def at_eof(self, timeout: float = HANG) -> bool:
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        self.inbox.extend(self.parser.feed(data))
        return data == b""

    def close(self) -> None:
        self.writer.close()

    # --- runtime as ttrpc client on conn 1 ---

    def send_request(self, method: str, msg: Message | bytes, *, split: int = 0) -> int:
        """Send a Plugin-service call; ``split`` > 0 cuts the frame bytes in pieces."""
        stream_id = self.next_stream
        self.next_stream += 2
        payload = msg if isinstance(msg, bytes) else msg.SerializeToString()
        frame = ttrpc_frame(stream_id, REQUEST, request_bytes(PLUGIN_SERVICE, method, payload))
        if split:
            for i in range(0, len(frame), split):
                self.write(mux_frame(PLUGIN_CONN, frame[i : i + split]))
        else:
            self.write(mux_frame(PLUGIN_CONN, frame))
        return stream_id

    async def response_to(self, stream_id: int) -> ttrpc_pb2.Response:
        """Wait for the reply on conn 1 ``stream_id``; other messages stay queued."""
        while True:
            for i, msg in enumerate(self.inbox):
                if msg.conn_id == PLUGIN_CONN and msg.stream_id == stream_id:
                    del self.inbox[i]
                    return msg.response()
            data = await asyncio.wait_for(self.reader.read(65536), HANG)
            if not data:
                raise EOFError("plugin closed the connection")
            self.inbox.extend(self.parser.feed(data))

    async def call(self, method: str, msg: Message, reply_type: type[_Reply]) -> _Reply:
        resp = await self.response_to(self.send_request(method, msg))
        assert resp.status.code == 0, (method, resp.status)
        return reply_type.FromString(resp.payload)

    # --- runtime as ttrpc server on conn 2 ---

    async def next_runtime_call(self) -> tuple[int, str, bytes]:
        while True:
            for i, msg in enumerate(self.inbox):
                if msg.conn_id == RUNTIME_CONN:
                    del self.inbox[i]
                    req = msg.request()
                    assert req.service == RUNTIME_SERVICE, req.service
                    self.calls_served.append(req.method)
                    return msg.stream_id, req.method, req.payload
            data = await asyncio.wait_for(self.reader.read(65536), HANG)
            if not data:
                raise EOFError("plugin closed the connection")
            self.inbox.extend(self.parser.feed(data))

    def reply(
        self, stream_id: int, msg: Message | bytes = b"", code: int = 0, text: str = ""
    ) -> None:
        payload = msg if isinstance(msg, bytes) else msg.SerializeToString()
        frame = ttrpc_frame(stream_id, RESPONSE, response_bytes(payload, code, text))
        self.write(mux_frame(RUNTIME_CONN, frame))

    async def expect_register(self) -> tuple[int, nri_pb2.RegisterPluginRequest]:
        stream_id, method, payload = await self.next_runtime_call()
        assert method == "RegisterPlugin", method
        return stream_id, nri_pb2.RegisterPluginRequest.FromString(payload)

    async def handshake(
        self,
        *,
        config: str = "",
        nri_version: str = "",
        request_timeout_ms: int = 2000,
        configure_first: bool = True,
        pages: list[nri_pb2.SynchronizeRequest] | None = None,
        runtime_name: str = "peer",
        runtime_version: str = "0.0",
    ) -> tuple[nri_pb2.RegisterPluginRequest, nri_pb2.ConfigureResponse]:
        """Register -> Configure -> Synchronize, like docs/developer/nri-protocol.md §3.2.

        ``configure_first`` sends Configure before the RegisterPlugin reply,
        reproducing the race the runtime really has.
        """
        reg_stream, reg = await self.expect_register()
        configure = nri_pb2.ConfigureRequest(
            config=config,
            runtime_name=runtime_name,
            runtime_version=runtime_version,
            registration_timeout=5000,
            request_timeout=request_timeout_ms,
            NRI_version=nri_version,
        )
        if configure_first:
            stream = self.send_request("Configure", configure)
            self.reply(reg_stream)
            resp = await self.response_to(stream)
        else:
            self.reply(reg_stream)
            resp = await self.response_to(self.send_request("Configure", configure))
        assert resp.status.code == 0, resp.status
        conf = nri_pb2.ConfigureResponse.FromString(resp.payload)
        for page in pages or [nri_pb2.SynchronizeRequest()]:
            sync = await self.call("Synchronize", page, nri_pb2.SynchronizeResponse)
            assert sync.more == page.more
        return reg, conf

    async def create_and_apply(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                               spec: dict[str, Any], nri_version: tuple[int, int, int],
                               cdi: CdiInjector | None) -> dict[str, Any]:
        """CreateContainer, then the plugin's adjustment applied to ``spec`` as the runtime
        of that NRI version does (tests/nri_apply.py)."""
        reply = await self.call("CreateContainer", nri_pb2.CreateContainerRequest(
            pod=pod, container=container), nri_pb2.CreateContainerResponse)
        assert isinstance(reply, nri_pb2.CreateContainerResponse)
        return apply_adjustment(spec, reply.adjust, nri_version, cdi)
