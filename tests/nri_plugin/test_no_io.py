"""The CreateContainer path does no file I/O, starts no process, opens no socket and
imports nothing: it runs for every container on a node, inside the runtime's 2 s budget.

The path is driven from raw request bytes through ``dispatch`` while an audit hook (armed
by a ContextVar, since audit hooks cannot be removed) fails on the events that mean I/O.
``os.stat``/``os.lstat`` raise no audit event, so they are patched to fail as well.
Logging is the daemon's: records go to a queue and are formatted (tracebacks too) in the
listener thread, so pytest's own in-thread log capture is switched off here.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import queue
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from nri_plugin.api import nri_pb2
from nri_plugin.dispatch import RpcError, dispatch
from nri_plugin.ops.daemon import _deferred_queue_handler
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from tests.helpers import make_char_device, write_specs

FORBIDDEN = ("open", "os.scandir", "os.listdir", "socket.__new__", "subprocess.Popen",
             "os.system", "os.exec", "os.posix_spawn", "import")
_armed: contextvars.ContextVar[bool] = contextvars.ContextVar("no_io_armed", default=False)
_seen: list[str] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _armed.get() and event in FORBIDDEN:
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
    handler = _deferred_queue_handler(queue.SimpleQueue())
    logger = logging.getLogger()
    saved = logger.handlers[:]
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
    plugin = CdiInjector(lambda: snapshot)
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
                dispatch(plugin, "CreateContainer", good))
            expected = expected or reply
            assert reply == expected
            with pytest.raises(RpcError, match=re.escape("example.com/gpu=9 (from pod")):
                dispatch(plugin, "CreateContainer", bad)
    assert [d.path for d in expected.adjust.linux.devices] == ["/dev/gpu0"]
    assert ("LD_LIBRARY_PATH", "/opt/own:/usr/lib64") in [
        (kv.key, kv.value) for kv in expected.adjust.env]



def test_the_guard_catches_io(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="I/O on the CreateContainer path: open"), no_io():
        open(tmp_path / "x", "w").close()
    _seen.clear()
