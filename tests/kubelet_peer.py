"""A stand-in for the kubelet's pod-resources API: a real gRPC server on a Unix socket that
answers ``v1.PodResourcesLister/List`` with given bytes, such as what a real kubelet
answered (``recorded``: tests/data/kubelet-1.35.6/pod-resources/)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).resolve().parent / "data" / "kubelet-1.35.6" / "pod-resources"


def recorded(name: str) -> bytes:
    """The raw answer of a recording (``List``, ``dra-List``)."""
    doc = json.loads((RECORDINGS / f"{name}.json").read_text())
    assert doc["code"] == "OK", f"{name}: the kubelet answered {doc['code']}"
    return base64.b64decode(doc["response_b64"])


class PodResourcesServer:
    """Answers List with ``answer()`` (raw protobuf bytes) on ``socket_path``."""

    def __init__(self, socket_path: Path, answer: Callable[[], bytes]) -> None:
        self.path = socket_path
        self.answer = answer
        self.server: Any = None

    def start(self) -> PodResourcesServer:
        import grpc

        def list_pods(request: bytes, context: Any) -> bytes:
            return self.answer()

        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(list_pods)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(None).wait()
