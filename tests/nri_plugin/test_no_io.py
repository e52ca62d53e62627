"""The CreateContainer path does no file I/O, starts no process, opens no socket and
imports nothing: it runs for every container on a node, inside the runtime's 2 s budget.

The path is driven from raw request bytes through ``dispatch``, and from raw wire bytes on
a socket through the Stub and the policy-enforcing injector, with metrics, with the NVIDIA rules
and their node facts, while an audit hook (armed by a flag, since audit hooks cannot be
removed) fails on the events that mean I/O.
``os.stat``/``os.lstat`` raise no audit event, so they are patched to fail as well.
Logging is the daemon's handler (``NonBlockingHandler``, writing to /dev/null here): it
only queues a record, its writer thread formats and writes it; pytest's own log capture is
switched off here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.dispatch import Dispatcher, RpcError
from nri_plugin.nri.stub import Stub, StubOptions
from nri_plugin.ops.logwriter import NonBlockingHandler
from nri_plugin.ops.metrics import Metrics
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Counters, Wiring
from nri_plugin.plugins.cdi_injector.vendor import Registry, RegistryHolder
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.helpers import annotations_policy, make_char_device, write_specs
from tests.nri_runtime_peer import RuntimePeer

FORBIDDEN = ("open", "os.scandir", "os.listdir", "socket.__new__", "subprocess.Popen",
             "os.system", "os.exec", "os.posix_spawn", "import")
_armed: contextvars.ContextVar[bool] = contextvars.ContextVar("no_io_armed", default=False)
# Armed for the whole process (the wire test: the stub's callbacks run in the event loop's
# context, not the test's); only while the test waits for replies on the loop.
_armed_everywhere = False
_seen: list[str] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if (_armed.get() or _armed_everywhere) and event in FORBIDDEN:
        _seen.append(f"{event}{args!r:.120}")
        raise RuntimeError(f"I/O on the CreateContainer path: {event} {args!r:.120}")


sys.addaudithook(_audit)


@contextlib.contextmanager
def no_io() -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"stat on the CreateContainer path: {args!r:.120}")

    _seen.clear()
    patch = pytest.MonkeyPatch()
    patch.setattr(os, "stat", refuse)
    patch.setattr(os, "lstat", refuse)
    logger = logging.getLogger()
    saved = logger.handlers[:]
    with _daemon_handler() as handler:
        logger.handlers[:] = [handler]
        token = _armed.set(True)
        try:
            yield
        finally:
            _armed.reset(token)
            logger.handlers[:] = saved
            patch.undo()
    assert _seen == []


def test_create_container_from_bytes_does_no_io(tmp_path: Path, need_root: None) -> None:
    node = make_char_device(tmp_path / "gpu0", major=241, minor=0)
    folder = write_specs(tmp_path / "cdi", {"gpu.yaml": f"""\
        cdiVersion: 0.5.0
        kind: example.com/gpu
        containerEdits:
          env: [NRI_CDI_LD_LIBRARY_PATH=/usr/lib64]
          mounts: [{{hostPath: {tmp_path}, containerPath: /usr/lib64/drv, options: [ro, bind]}}]
        devices:
        - name: "0"
          containerEdits:
            deviceNodes: [{{path: /dev/gpu0, hostPath: {node}}}]
        """})
    snapshot = SpecCache([str(folder)]).refresh()  # the I/O happens here, ahead of use
    plugin = CdiInjector(lambda: Registry(snapshot),
                         policy=annotations_policy(nvidia=False))
    plugin.configure("", "containerd", "v1.7.24")
    good = nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="ns",
                               annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"}),
        container=nri_pb2.Container(name="c", env=["LD_LIBRARY_PATH=/opt/own",
                                                   "NVIDIA_DRIVER_CAPABILITIES=all"]),
    ).SerializeToString()
    bad = nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(annotations={"cdi.k8s.io/gpu": "example.com/gpu=9"}),
        container=nri_pb2.Container(name="c"),
    ).SerializeToString()
    expected = None
    with no_io():
        for _ in range(2):  # the first call fills the caches, the second reads them
            reply = nri_pb2.CreateContainerResponse.FromString(
                Dispatcher(plugin).dispatch("CreateContainer", good))
            expected = expected or reply
            assert reply == expected
            with pytest.raises(RpcError, match=re.escape("example.com/gpu=9 (from pod")):
                Dispatcher(plugin).dispatch("CreateContainer", bad)
    assert [d.path for d in expected.adjust.linux.devices] == ["/dev/gpu0"]
    assert ("LD_LIBRARY_PATH", "/opt/own:/usr/lib64") in [
        (kv.key, kv.value) for kv in expected.adjust.env]



def test_the_guard_catches_io(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="I/O on the CreateContainer path: open"), no_io():
        open(tmp_path / "x", "w").close()
    _seen.clear()


NVIDIA_SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  env: [NRI_CDI_LD_LIBRARY_PATH=/usr/lib64]
  mounts:
  - {{hostPath: {root}, containerPath: /usr/lib64/libcuda.so.1, options: [ro, bind]}}
  - {{hostPath: {root}, containerPath: /usr/lib64/libGLX_nvidia.so.0, options: [ro, bind]}}
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{{path: /dev/nvidia0, hostPath: {gpu0}}}]
- name: "1"
  containerEdits:
    deviceNodes: [{{path: /dev/nvidia1, hostPath: {gpu1}}}]
"""


def _nvidia_registry(tmp_path: Path) -> RegistryHolder:
    """An NVIDIA spec with its sidecar, loaded ahead (all the I/O happens here)."""
    gpus = [make_char_device(tmp_path / f"gpu{i}", major=241, minor=i) for i in range(2)]
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = folder / "nvidia.yaml"
    spec.write_text(NVIDIA_SPEC.format(root=tmp_path, gpu0=gpus[0], gpu1=gpus[1]))
    (folder / "nvidia.yaml.meta").write_text(json.dumps({
        "spec": {"sha256": hashlib.sha256(spec.read_bytes()).hexdigest()},
        "driver": {"version": "550.54.15", "cudaVersion": "12.4"},
        "capabilities": {"compute": ["/usr/lib64/libcuda.so.1"],
                         "graphics": ["/usr/lib64/libGLX_nvidia.so.0"]},
        "devices": {str(i): {"type": "gpu", "gpuIndex": i, "gpuUuid": f"GPU-{i}",
                             "arch": "8.0", "brand": "tesla"} for i in range(2)}}))
    holder = RegistryHolder([NvidiaRules()])
    holder.update(SpecCache([str(folder)]).refresh())
    assert holder.get().facts[0].specs, "sidecar facts not loaded"
    return holder


def _request(env: list[str], **annotations: str) -> nri_pb2.CreateContainerRequest:
    return nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="ml", annotations=annotations),
        container=nri_pb2.Container(name="c", env=env))


def test_create_container_over_the_wire_with_nvidia_rules_does_no_io(
        tmp_path: Path, need_root: None) -> None:
    """The real path: raw mux + ttrpc bytes on a socket, the Stub, the dispatcher, the
    injector with metrics under a policy, the NVIDIA rules with node facts (NVIDIA_REQUIRE_*,
    NVIDIA_DRIVER_CAPABILITIES, NVIDIA_VISIBLE_DEVICES), the reply bytes back."""
    global _armed_everywhere
    registry = _nvidia_registry(tmp_path)
    policy = annotations_policy({"sources": {"visibleDevicesEnv": {"enabled": True,
                                                             "privilegedOnly": False}}})
    plugin = CdiInjector(registry.get, vendors=registry.vendors, policy=policy,
                         wiring=Wiring(metrics=Metrics(Counters())))
    gpu = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    requests = {
        "annotation": _request(["NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla",
                                "NVIDIA_DRIVER_CAPABILITIES=compute"], **gpu),
        "env": _request(["NVIDIA_VISIBLE_DEVICES=GPU-1", "NVIDIA_DRIVER_CAPABILITIES=all"]),
        "requirement": _request(["NVIDIA_REQUIRE_CUDA=cuda>=12.8"], **gpu),
        "capability": _request(["NVIDIA_DRIVER_CAPABILITIES=bogus"], **gpu),
        "unknown": _request([], **{"cdi.k8s.io/gpu": "nvidia.com/gpu=7"}),
    }

    async def main() -> dict[str, tuple[int, str, bytes]]:
        global _armed_everywhere
        ours, theirs = socket.socketpair()
        stub = Stub(plugin, StubOptions(sock=ours, name="nri-cdi", idx="10", env={}))
        runner = asyncio.create_task(stub.run())
        peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
        await peer.handshake()
        answers = {}
        _seen.clear()
        _armed_everywhere = True
        try:
            for _ in range(2):  # the first round fills the caches, the second reads them
                for name, request in requests.items():
                    reply = await peer.response_to(peer.send_request("CreateContainer",
                                                                     request))
                    answers[name] = (reply.status.code, reply.status.message, reply.payload)
        finally:
            _armed_everywhere = False
        peer.close()
        await asyncio.wait_for(runner, 60)
        return answers

    with _deferred_logging():
        answers = asyncio.run(asyncio.wait_for(main(), 20))
    assert _seen == []
    injected = nri_pb2.CreateContainerResponse.FromString(answers["annotation"][2]).adjust
    assert [d.path for d in injected.linux.devices] == ["/dev/nvidia0"]
    assert [m.destination for m in injected.mounts] == ["/usr/lib64/libcuda.so.1"]
    by_env = nri_pb2.CreateContainerResponse.FromString(answers["env"][2]).adjust
    assert [d.path for d in by_env.linux.devices] == ["/dev/nvidia1"]
    assert len(by_env.mounts) == 2
    assert answers["requirement"][0] != 0 and "cuda>=12.8" in answers["requirement"][1]
    assert answers["capability"][0] != 0 and "bogus" in answers["capability"][1]
    assert answers["unknown"][0] != 0 and "nvidia.com/gpu=7" in answers["unknown"][1]


@contextlib.contextmanager
def _deferred_logging() -> Iterator[None]:
    logger = logging.getLogger()
    saved = logger.handlers[:]
    with _daemon_handler() as handler:
        logger.handlers[:] = [handler]
        try:
            yield
        finally:
            logger.handlers[:] = saved


@contextlib.contextmanager
def _daemon_handler() -> Iterator[NonBlockingHandler]:
    """The daemon's log handler, on /dev/null (opened here, before anything is armed)."""
    null = os.open(os.devnull, os.O_WRONLY)
    handler = NonBlockingHandler(null)
    try:
        yield handler
    finally:
        handler.close()
        os.close(null)


def test_only_a_device_the_registry_does_not_know_reads(tmp_path: Path, need_root: None) -> None:
    """With the daemon's miss reader wired: known devices cost no I/O; a name the registry
    does not know (a DRA claim spec written a moment ago) reads the folders once and
    resolves; one still unknown after that is refused saying the folders were read again."""
    from cdi.watch import AutoRefresh, Timing
    from nri_plugin.ops.daemon import miss_reader

    node = make_char_device(tmp_path / "gpu0", major=241, minor=0)
    folder = write_specs(tmp_path / "cdi", {"gpu.yaml": f"""\
        cdiVersion: 0.5.0
        kind: example.com/gpu
        devices:
        - name: "0"
          containerEdits:
            deviceNodes: [{{path: /dev/gpu0, hostPath: {node}}}]
        """})
    holder = RegistryHolder([])
    # settle/rescan long: only the miss reader can see the new file within this test
    refresher = AutoRefresh(SpecCache([str(folder)]),
                            Timing(rescan_interval=3600, settle=3600, max_delay=3600),
                            on_refresh=holder.update)
    refresher._publish(refresher.cache.refresh)  # the start-up read, without the thread
    reads: list[tuple[str, ...]] = []
    reader = miss_reader(refresher, holder)

    def on_miss(names: object) -> object:
        reads.append(tuple(names))  # type: ignore[call-overload]
        return reader(names)

    plugin = CdiInjector(holder.get, wiring=Wiring(on_miss=on_miss),
                         policy=annotations_policy(nvidia=False))
    plugin.configure("", "containerd", "v1.7.24")

    def request(name: str) -> bytes:
        return nri_pb2.CreateContainerRequest(
            pod=nri_pb2.PodSandbox(name="p", namespace="ns",
                                   annotations={"cdi.k8s.io/gpu": name}),
            container=nri_pb2.Container(name="c")).SerializeToString()

    with no_io():
        for _ in range(2):
            Dispatcher(plugin).dispatch("CreateContainer", request("example.com/gpu=0"))
    assert reads == []
    claim = "k8s.gpu.nvidia.com/claim=1234-gpu-0"
    (folder / "k8s.gpu.nvidia.com-claim_1234.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: 1234-gpu-0\n"
        f"  containerEdits:\n    deviceNodes: [{{path: /dev/gpu0, hostPath: {node}}}]\n")
    reply = nri_pb2.CreateContainerResponse.FromString(
        Dispatcher(plugin).dispatch("CreateContainer", request(claim)))
    assert [d.path for d in reply.adjust.linux.devices] == ["/dev/gpu0"]
    assert reads == [(claim,)]
    with pytest.raises(RpcError, match=r"example\.com/gpu=9 \(from pod.*read again just now"):
        Dispatcher(plugin).dispatch("CreateContainer", request("example.com/gpu=9"))
    assert len(reads) == 2
