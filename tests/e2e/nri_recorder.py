"""An NRI wire recorder: a proxy socket between a runtime's NRI socket and a plugin that
writes down every message of both logical connections.

The plugin is pointed at ``listen`` instead of the runtime's socket; each connection it
makes is joined to a new connection to ``upstream`` and every byte goes through unchanged,
in both directions, as it arrives. Alongside, the byte streams are parsed as the runtime and
the plugin parse them (mux frames, then ttrpc messages per logical connection:
docs/developer/nri-protocol.md §1, §2), and each whole ttrpc message becomes one JSON line::

    {"seq": 12, "elapsed": 0.41, "session": 1, "from": "runtime", "conn": 1,
     "stream": 5, "kind": "request", "method": "CreateContainer",
     "service": "nri.pkg.api.v1alpha1.Plugin", "message": {...}}

``session`` numbers the plugin's connections in the order they were made (the plugin's
start guard and its injector each hold one); ``from`` says who wrote the message,
``conn`` the mux connection (1: the plugin's service, 2: the runtime's); a response is
``"kind": "response"`` with the method of the request it answers and its ``status``
(``{"code": 0, "message": ""}`` when the reply carries none). ``message`` is the payload
decoded with our nri.proto (protobuf JSON, proto field names); ``unknown_fields`` lists the
field paths our proto does not declare (a newer runtime's), and a method our proto lacks
keeps only ``bytes``. ``mark()`` adds a line of the harness's own (``"kind": "mark"``):
what it did between two messages, such as the plugin killed, or the OCI spec the runtime
made of a container. ``#connect`` and ``#close`` lines bound each session.

``read_wire`` reads a recording back (``tests/test_nri_wire_replay.py`` replays them).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from google.protobuf import json_format
from google.protobuf.message import Message

from nri_plugin.nri.api import nri_pb2, ttrpc_pb2
from tests.e2e.cri_recorder import substitute, unknown_field_paths

MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
REQUEST, RESPONSE = 1, 2
MARK = "mark"


def _nri_methods() -> dict[str, tuple[type[Message], type[Message]]]:
    """Bare method name -> (request type, reply type), from our nri.proto's services."""
    out = {}
    for service in nri_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            out[method.name] = (getattr(nri_pb2, method.input_type.name),
                                getattr(nri_pb2, method.output_type.name))
    return out


METHODS = _nri_methods()


def decoded(kind: type[Message] | None, data: bytes) -> tuple[dict[str, Any], list[str]]:
    if kind is None:
        return {"bytes": len(data)}, []
    try:
        message = kind.FromString(data)
    except Exception as error:  # a record must never stop the bytes it watches
        return {"bytes": len(data), "decode_error": str(error)}, []
    return (json_format.MessageToDict(message, preserving_proto_field_name=True),
            unknown_field_paths(message))


class _Stream:
    """One direction of one session: mux frames in, whole ttrpc messages out."""

    def __init__(self) -> None:
        self.trunk = bytearray()
        self.conns: dict[int, bytearray] = {}

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """(conn, stream id, message type, data) of each message completed by ``data``."""
        self.trunk += data
        out = []
        while len(self.trunk) >= MUX.size:
            conn, size = MUX.unpack_from(self.trunk)
            if len(self.trunk) < MUX.size + size:
                break
            buf = self.conns.setdefault(conn, bytearray())
            buf += self.trunk[MUX.size:MUX.size + size]
            del self.trunk[:MUX.size + size]
            while len(buf) >= TTRPC.size:
                length, stream, mtype, _flags = TTRPC.unpack_from(buf)
                if len(buf) < TTRPC.size + length:
                    break
                out.append((conn, stream, mtype, bytes(buf[TTRPC.size:TTRPC.size + length])))
                del buf[:TTRPC.size + length]
        return out


class NriRecorder:
    """The proxy: ``start()`` listens on ``listen``, ``close()`` stops it and every session.
    ``roots`` maps host paths to the names written instead (longest first), so a recording
    holds no temp folder of the machine that made it."""

    def __init__(self, listen: str | Path, upstream: str | Path, out: Path, *,
                 roots: Mapping[str, str] | None = None) -> None:
        self.listen = str(listen)
        self.upstream = str(upstream)
        self.out = out
        self.roots = dict(sorted((roots or {}).items(), key=lambda kv: -len(kv[0])))
        self._lock = threading.Lock()
        self._seq = 0
        self._sessions = 0
        self._start = time.monotonic()
        self._file: IO[str] | None = None
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> NriRecorder:
        self._file = self.out.open("a", buffering=1)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Path(self.listen).unlink(missing_ok=True)
        server.bind(self.listen)
        server.listen(8)
        self._server = server
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> NriRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- lines ------------------------------------------------------------------------------

    def mark(self, event: str, **details: Any) -> None:
        """A line of the harness's own between the messages."""
        self._write({"kind": MARK, "method": event, "message": details})

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._seq += 1
            line = {"seq": self._seq, "elapsed": round(time.monotonic() - self._start, 6),
                    **substitute(record, self.roots)}
            if self._file is not None:
                self._file.write(json.dumps(line) + "\n")

    # --- the proxy ----------------------------------------------------------------------------

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while self._server is not None:
            try:
                plugin, _ = self._server.accept()
            except OSError:
                return
            runtime = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                runtime.connect(self.upstream)
            except OSError as error:
                plugin.close()
                self.mark("#refused", error=str(error))
                continue
            with self._lock:
                self._sessions += 1
                session = self._sessions
                self._sockets += [plugin, runtime]
            self._write({"kind": MARK, "method": "#connect", "session": session,
                         "message": {}})
            # Each session's requests by (conn, stream id), for naming their responses.
            pending: dict[tuple[int, int], str] = {}
            done = threading.Event()
            self._spawn(self._pump, plugin, runtime, "plugin", session, pending, done)
            self._spawn(self._pump, runtime, plugin, "runtime", session, pending, done)

    def _pump(self, src: socket.socket, dst: socket.socket, side: str, session: int,
              pending: dict[tuple[int, int], str], done: threading.Event) -> None:
        parser = _Stream()
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                # Written down before it goes on, so that a request's line always comes
                # before its response's (the peer cannot answer what it has not got).
                for conn, stream, mtype, body in parser.feed(data):
                    self._message(session, side, conn, stream, mtype, body, pending)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)
            _shut(src)
        if not done.is_set():  # the first side to end closed the session
            done.set()
            self._write({"kind": MARK, "method": "#close", "session": session,
                         "message": {"closed_by": side}})

    def _message(self, session: int, side: str, conn: int, stream: int, mtype: int,
                 body: bytes, pending: dict[tuple[int, int], str]) -> None:
        record: dict[str, Any] = {"session": session, "from": side, "conn": conn,
                                  "stream": stream}
        if mtype == REQUEST:
            request = ttrpc_pb2.Request.FromString(body)
            pending[(conn, stream)] = request.method
            kinds = METHODS.get(request.method)
            message, unknown = decoded(kinds[0] if kinds else None, request.payload)
            record |= {"kind": "request", "service": request.service,
                       "method": request.method, "message": message}
            if request.timeout_nano:
                record["timeout_nano"] = request.timeout_nano
        elif mtype == RESPONSE:
            response = ttrpc_pb2.Response.FromString(body)
            method = pending.pop((conn, stream), "")
            kinds = METHODS.get(method)
            message, unknown = decoded(kinds[1] if kinds else None, response.payload)
            record |= {"kind": "response", "method": method, "message": message,
                       "status": {"code": response.status.code,
                                  "message": response.status.message}}
        else:
            record |= {"kind": f"type-{mtype}", "method": "", "message": {"bytes": len(body)}}
            unknown = []
        if unknown:
            record["unknown_fields"] = unknown
        self._write(record)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# --- reading a recording back ---------------------------------------------------------------


def read_wire(path: Path) -> list[dict[str, Any]]:
    """A recording's lines in the order they were written (``seq``)."""
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            int(record["seq"])
            str(record["kind"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not an NRI wire recording line: "
                             f"{error}") from None
        lines.append(record)
    return sorted(lines, key=lambda r: int(r["seq"]))


def requests_of(lines: Iterable[Mapping[str, Any]], method: str) -> list[Mapping[str, Any]]:
    return [r for r in lines if r["kind"] == "request" and r["method"] == method]
