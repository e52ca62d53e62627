"""The kubelet's plugin registry: which kubelet plugins are registered on this node, and of
which type, asked as the kubelet asks them (for ``nri-cdi doctor``, never the plugin;
docs/operations/doctor.md, "Which DRA drivers are registered", says how and why).

Each registration socket is asked ``pluginregistration.Registration/GetInfo`` (Kubernetes'
``k8s.io/kubelet/pkg/apis/pluginregistration/v1``; our declaration of its messages:
``kubelet_api/registration.proto``) with grpcio, all at once, bounded by one short timeout.
Without grpcio, or when a socket does not answer in time, the socket counts as a kubelet
plugin whose type is unknown.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from nri_plugin.ops.kubelet_api import registration_pb2 as pb
from nri_plugin.ops.podresources import describe_rpc_error

DEFAULT_REGISTRY = "/var/lib/kubelet/plugins_registry"
GET_INFO = "/pluginregistration.Registration/GetInfo"
DRA_PLUGIN = "DRAPlugin"
ASK_TIMEOUT = 2.0  # seconds, for all the sockets together
MAX_SOCKETS = 64  # more than a node has; a folder of thousands is not asked socket by socket


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeletPlugin:
    """One registration socket: ``type`` "" when it could not be asked (``problem`` says
    why)."""

    socket: str
    type: str = ""
    name: str = ""
    problem: str = ""

    def describe(self) -> str:
        if not self.type:
            return f"a kubelet plugin (type unknown: {self.problem}) at {self.socket}"
        return f"{self.type} {self.name or '(no name)'} at {self.socket}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Registry:
    """What the registry folder holds; ``problem``: why it could not be read ("" when it
    was, even empty)."""

    folder: str
    plugins: tuple[KubeletPlugin, ...] = ()
    problem: str = ""

    @property
    def dra(self) -> list[KubeletPlugin]:
        return [p for p in self.plugins if p.type == DRA_PLUGIN]

    @property
    def unknown(self) -> list[KubeletPlugin]:
        return [p for p in self.plugins if not p.type]


# --- the folder and the sockets ------------------------------------------------------------


def registration_sockets(folder: str) -> Iterator[str]:
    """The Unix sockets under ``folder`` the kubelet would ask (it walks subfolders too and
    skips names starting with "."), in name order; raises OSError when ``folder`` cannot be
    listed."""
    for name in sorted(os.listdir(folder)):
        if name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            yield path
        elif stat.S_ISDIR(mode):
            try:
                yield from registration_sockets(path)
            except OSError:
                continue


def ask(sockets: list[str], timeout: float = ASK_TIMEOUT) -> list[KubeletPlugin]:
    """GetInfo of each socket, all at once, as the kubelet asks it."""
    try:
        import grpc  # the kubelet extra
    except ImportError as exc:
        return [KubeletPlugin(socket=s, problem=describe_rpc_error(exc)) for s in sockets]
    with ExitStack() as channels:
        pending = []
        for path in sockets:
            channel = channels.enter_context(
                grpc.insecure_channel(f"unix://{os.path.abspath(path)}"))
            # The reply is parsed in _answer, where a bad one is said as such.
            call = channel.unary_unary(
                GET_INFO, request_serializer=pb.InfoRequest.SerializeToString)
            pending.append((path, call.future(pb.InfoRequest(), timeout=timeout)))
        return [_answer(path, future, grpc) for path, future in pending]


def _answer(path: str, future: Any, grpc: Any) -> KubeletPlugin:
    try:
        info = pb.PluginInfo.FromString(future.result())
    except DecodeError:
        return KubeletPlugin(socket=path, problem="not a PluginInfo reply")
    except grpc.RpcError as exc:
        return KubeletPlugin(socket=path, problem=describe_rpc_error(exc))
    return KubeletPlugin(socket=path, type=info.type, name=info.name,
                         problem="" if info.type else "its reply names no type")


def read_registry(folder: str = DEFAULT_REGISTRY, timeout: float = ASK_TIMEOUT) -> Registry:
    try:
        sockets = list(registration_sockets(folder))
    except FileNotFoundError:
        return Registry(folder=folder, problem=f"no {folder}")
    except OSError as exc:
        return Registry(folder=folder, problem=f"cannot read {folder}: {exc.strerror or exc}")
    if len(sockets) > MAX_SOCKETS:
        return Registry(folder=folder, problem=f"{len(sockets)} sockets in {folder}: not "
                        f"asked (more than {MAX_SOCKETS})")
    return Registry(folder=folder, plugins=tuple(ask(sockets, timeout)) if sockets else ())
