"""A CRI recorder: a gRPC proxy between a kubelet and containerd that writes down every call.

The kubelet is pointed at ``listen`` instead of containerd's socket; every call, whatever its
method, is forwarded as the same bytes to ``upstream`` and its reply (or error status) goes
back unchanged. Each call becomes one JSON line in ``out``::

    {"seq": 7, "elapsed": 1.93, "method": "RuntimeService/CreateContainer",
     "request": {...}, "code": "OK", "message": "", "response": {...}}

``seq`` numbers the calls in the order they were forwarded (lines are written as calls end,
so a slow call's line may come after a later one's: sort by ``seq``); ``elapsed`` is seconds
since the recorder started (monotonic clock); ``request`` and ``response`` are the messages
decoded with the CRI v1 stubs the e2e set-up compiles (protobuf JSON, proto field names),
``unknown_fields`` lists the field paths the stubs do not know (a newer kubelet's), and
``code``/``message`` are the reply's gRPC status. A streaming reply is recorded as
``responses`` (a list) when it ends. Methods the stubs do not know are forwarded all the
same and recorded with the request's size only. ``mark()`` adds a line of the harness's own
(method ``#mark``): what it did between two calls, such as killing the NRI plugin.

``Recording`` reads such a file back (``tests/e2e/test_kubelet_replay_e2e.py`` replays the
kubelet's calls against a private containerd).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from nri_cdi_testbed.node_check.cri import load_messages

# Calls the kubelet makes every second or so to learn the state; leaving them out of a
# recording (``skip``) keeps it to the calls that change something.
POLLING = frozenset({
    "RuntimeService/Version", "RuntimeService/Status", "RuntimeService/ListPodSandbox",
    "RuntimeService/ListContainers", "RuntimeService/PodSandboxStatus",
    "RuntimeService/ContainerStatus", "RuntimeService/ContainerStats",
    "RuntimeService/ListContainerStats", "RuntimeService/PodSandboxStats",
    "RuntimeService/ListPodSandboxStats", "RuntimeService/ListMetricDescriptors",
    "RuntimeService/ListPodSandboxMetrics", "RuntimeService/RuntimeConfig",
    "ImageService/ImageStatus", "ImageService/ListImages", "ImageService/ImageFsInfo",
})


# The method of a line the harness wrote itself (CriRecorder.mark).
MARK = "#mark"


@dataclass(frozen=True, slots=True)
class _Method:
    name: str  # "RuntimeService/CreateContainer"
    request: type[Message] | None
    response: type[Message] | None
    streaming: bool


def _cri_methods() -> dict[str, _Method]:
    """Full gRPC path ("/runtime.v1.RuntimeService/CreateContainer") -> what it carries."""
    pb = load_messages()
    out = {}
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            out[f"/{service.full_name}/{method.name}"] = _Method(
                f"{service.name}/{method.name}",
                getattr(pb, method.input_type.name), getattr(pb, method.output_type.name),
                method.server_streaming)
    return out


def unknown_field_paths(message: Message, prefix: str = "") -> list[str]:
    """Dotted paths of the fields present in ``message`` that its type does not declare
    (numbers for the unknown ones, names on the way to them)."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    unknown: Iterable[Any] = UnknownFieldSet(message)  # type: ignore[assignment]
    found = [f"{prefix}{field.field_number}" for field in unknown]
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items: Sequence[Any] = [v for v in value.values() if isinstance(v, Message)]
        else:
            items = value if field.is_repeated else [value]
        for item in items:
            found += unknown_field_paths(item, f"{prefix}{field.name}.")
    return found


def _decoded(kind: type[Message] | None, data: bytes) -> tuple[dict[str, Any], list[str]]:
    if kind is None:
        return {"bytes": len(data)}, []
    try:
        message = kind.FromString(data)
        return (json_format.MessageToDict(message, preserving_proto_field_name=True),
                unknown_field_paths(message))
    except Exception as error:  # a record must never fail the call it forwards
        return {"bytes": len(data), "decode_error": str(error)}, []


class CriRecorder:
    """The proxy: ``start()`` serves ``listen`` (a unix socket path), ``close()`` stops it.

    ``skip``: methods ("RuntimeService/ListContainers", ...) forwarded but not written;
    ``POLLING`` names the kubelet's periodic reads. ``before(method, request)`` is called
    with each call's method ("StartContainer") and decoded request before it is forwarded,
    in the call's own thread: a harness may hold a call there (e.g. a container's start
    until the plugin is back), which the kubelet sees as a slow runtime."""

    def __init__(self, listen: str | Path, upstream: str | Path, out: Path, *,
                 skip: Collection[str] = (), workers: int = 32,
                 before: Callable[[str, Mapping[str, Any]], None] | None = None) -> None:
        self.listen = str(listen)
        self.upstream = str(upstream)
        self.out = out
        self.skip = frozenset(skip)
        self.before = before
        self._methods = _cri_methods()
        self._lock = threading.Lock()
        self._seq = 0
        self._start = time.monotonic()
        self._file: IO[str] | None = None
        self._channel = grpc.insecure_channel(f"unix://{self.upstream}",
                                              options=[("grpc.enable_http_proxy", 0)])
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                   handlers=[_Forwarding(self)])
        if self._server.add_insecure_port(f"unix://{self.listen}") == 0:
            raise OSError(f"CRI recorder: cannot listen on {self.listen}")

    def start(self) -> CriRecorder:
        self._file = self.out.open("a", buffering=1)
        self._server.start()
        return self

    def close(self) -> None:
        self._server.stop(grace=1).wait()
        self._channel.close()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> CriRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what a call does -----------------------------------------------------------------

    def method(self, path: str) -> _Method:
        return self._methods.get(path) or _Method(path.lstrip("/"), None, None, False)

    def next_seq(self) -> tuple[int, float]:
        with self._lock:
            self._seq += 1
            return self._seq, round(time.monotonic() - self._start, 6)

    def upstream_call(self, path: str, streaming: bool) -> Callable[..., Any]:
        # No serializers: grpc hands the bytes through as they are.
        make = self._channel.unary_stream if streaming else self._channel.unary_unary
        call: Callable[..., Any] = make(path)
        return call

    def mark(self, event: str, **details: Any) -> None:
        """A line of the harness's own between the calls (``"method": "#mark"``), such as
        the plugin killed or started again, so that a replay can do the same there."""
        seq, elapsed = self.next_seq()
        self.write({"seq": seq, "elapsed": elapsed, "method": MARK,
                    "request": {"event": event, **details}, "code": "OK", "message": ""})

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=False)
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")


def _status(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return code, details or ""


class _Forwarding(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers every method by forwarding it to the recorder's upstream."""

    def __init__(self, recorder: CriRecorder) -> None:
        self.recorder = recorder

    def service(self, handler_call_details: grpc.HandlerCallDetails
                ) -> grpc.RpcMethodHandler | None:
        path = str(handler_call_details.method)
        method = self.recorder.method(path)
        if method.streaming:
            return grpc.unary_stream_rpc_method_handler(self._streaming(path, method))
        return grpc.unary_unary_rpc_method_handler(self._unary(path, method))

    def _begin(self, method: _Method, request: bytes) -> dict[str, Any] | None:
        seq, elapsed = self.recorder.next_seq()
        if method.name in self.recorder.skip:
            return None
        decoded, unknown = _decoded(method.request, request)
        record: dict[str, Any] = {"seq": seq, "elapsed": elapsed, "method": method.name,
                                  "request": decoded}
        if unknown:
            record["unknown_fields"] = unknown
        return record

    def _before(self, method: _Method, request: bytes) -> None:
        if self.recorder.before is not None:
            self.recorder.before(method.name.rpartition("/")[2],
                                 _decoded(method.request, request)[0])

    @staticmethod
    def _timeout(context: grpc.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None or remaining > 1e9 else max(remaining, 0.001)

    def _unary(self, path: str, method: _Method) -> Callable[[bytes, grpc.ServicerContext],
                                                               bytes]:
        call = self.recorder.upstream_call(path, streaming=False)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._before(method, request)  # a held call takes its number when it goes on
            record = self._begin(method, request)
            try:
                reply = bytes(call(request, timeout=self._timeout(context)))
            except grpc.RpcError as error:
                code, details = _status(error)
                if record is not None:
                    self.recorder.write({**record, "code": code.name, "message": details})
                context.abort(code, details)
            if record is not None:
                self.recorder.write({**record, "code": "OK", "message": "",
                                     "response": _decoded(method.response, reply)[0]})
            return reply

        return forward

    def _streaming(self, path: str, method: _Method
                   ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        call = self.recorder.upstream_call(path, streaming=True)

        def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            record = self._begin(method, request)
            replies: list[dict[str, Any]] = []
            stream = call(request, timeout=self._timeout(context))
            context.add_callback(stream.cancel)
            code, details = grpc.StatusCode.OK, ""
            try:
                for reply in stream:
                    replies.append(_decoded(method.response, reply)[0])
                    yield bytes(reply)
            except grpc.RpcError as error:
                code, details = _status(error)
            except GeneratorExit:  # the client went away: grpc closes the generator
                code, details = grpc.StatusCode.CANCELLED, "cancelled by the client"
                stream.cancel()
                raise
            finally:
                if record is not None:
                    self.recorder.write({**record, "code": code.name, "message": details,
                                         "responses": replies})
            if code is not grpc.StatusCode.OK and code is not grpc.StatusCode.CANCELLED:
                context.abort(code, details)

        return forward


# --- reading a recording back ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    seq: int
    elapsed: float
    method: str  # "RuntimeService/CreateContainer"
    request: Mapping[str, Any]
    code: str
    message: str
    response: Mapping[str, Any]
    responses: tuple[Mapping[str, Any], ...] = ()  # a streaming call's replies

    @property
    def short(self) -> str:
        """The method without its service ("CreateContainer")."""
        return self.method.rpartition("/")[2]


def read_recording(path: Path) -> list[Call]:
    """A recording's calls in the order their requests arrived. A recording may be read
    while the recorder still writes it: a last line without its newline is not complete yet
    (the file's buffer flushed part of it) and is left for the next read."""
    calls = []
    complete = path.read_text().split("\n")[:-1]
    for number, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            calls.append(Call(int(raw["seq"]), float(raw.get("elapsed", 0.0)),
                              str(raw["method"]), raw.get("request", {}), str(raw["code"]),
                              str(raw.get("message", "")), raw.get("response", {}),
                              tuple(raw.get("responses", ()))))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a CRI recording line: {error}") from None
    return sorted(calls, key=lambda call: call.seq)


# --- trimming a recording into test data ----------------------------------------------------

# The calls that change something, kept in test data (with the harness's marks).
LIFECYCLE = frozenset({"RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "CreateContainer",
                       "StartContainer", "StopContainer", "RemoveContainer",
                       "UpdateContainerResources", MARK})
# Pod annotations that only repeat the pod (kubectl's copy of what was applied).
NOISE_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def substitute(value: Any, names: Mapping[str, str]) -> Any:
    """``value`` (JSON-like) with each key of ``names`` in its strings written as its value:
    host paths as placeholders when recording, back again when replaying."""
    if isinstance(value, str):
        for name, replacement in names.items():
            value = value.replace(name, replacement)
        return value
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    return value


def trimmed(lines: Iterable[Mapping[str, Any]], roots: Mapping[str, str]) -> list[dict[str, Any]]:
    """The lifecycle calls of a raw recording in request order, with each host path under a
    key of ``roots`` written as its value (``{"/srv/session": "{node}"}``) and the pod
    annotations that only repeat the pod left out."""
    out = []
    for line in sorted(lines, key=lambda raw: int(raw["seq"])):
        if str(line["method"]).rpartition("/")[2] not in LIFECYCLE:
            continue
        record = substitute(dict(line), roots)
        for holder in (record["request"].get("config"), record["request"].get("sandbox_config")):
            annotations = holder.get("annotations", {}) if isinstance(holder, dict) else {}
            for key in NOISE_ANNOTATIONS:
                annotations.pop(key, None)
        out.append(record)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.cri_recorder",
        description="Trim a raw CRI recording into test data: lifecycle calls only, host "
                    "paths replaced by names the replay fills in.")
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--root", action="append", default=[], metavar="PATH=NAME",
                        help="write PATH as NAME (repeatable; longer paths first)")
    args = parser.parse_args(argv)
    pairs = [item.split("=", 1) for item in args.root]
    roots = dict(sorted(((p, n) for p, n in pairs), key=lambda pn: -len(pn[0])))
    raw = [json.loads(line) for line in args.raw.read_text().splitlines() if line.strip()]
    args.out.write_text("".join(json.dumps(r) + "\n" for r in trimmed(raw, roots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
