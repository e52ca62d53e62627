"""The runtime's public API: the documented example plugin (docs/developer/writing-a-plugin.md)
runs as a process against the test runtime peer, the adjustment builders fill the fields
NRI's Go helpers fill, and importing ``nri_plugin.nri`` stays cheap."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import nri_plugin.nri as nri
from nri_plugin.nri import adjustment as adj
from nri_plugin.nri.api import EventMask, nri_pb2
from tests.nri_runtime_peer import RuntimePeer

ROOT = Path(__file__).resolve().parents[2]


def documented_plugin() -> str:
    page = (ROOT / "docs/developer/writing-a-plugin.md").read_text()
    section = page.split("# Writing your own NRI plugin", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/developer/writing-a-plugin.md: no python block"
    return match.group(1)


def create(pod_annotations: dict[str, str]) -> nri_pb2.CreateContainerRequest:
    return nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(id="p", name="pod", annotations=pod_annotations),
        container=nri_pb2.Container(id="c", name="c"),
    )


def test_documented_plugin_runs_against_the_runtime_peer(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text(documented_plugin())
    assert len(script.read_text().splitlines()) <= 25  # "a plugin in about 20 lines"
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NRI_PLUGIN_SOCKET": str(ours.fileno())}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, pass_fds=[ours.fileno()],
                            stderr=subprocess.PIPE, text=True)
    ours.close()

    async def runtime() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=theirs)
        peer = RuntimePeer(reader, writer)
        reg, conf = await peer.handshake()
        assert (reg.plugin_name, reg.plugin_idx) == ("hello", "50")
        assert conf.events == EventMask.CREATE_CONTAINER  # the one overridden method

        reply = await peer.call("CreateContainer", create({"example.com/hello": "hi"}),
                                nri_pb2.CreateContainerResponse)
        got = reply.adjust
        assert [(e.key, e.value) for e in got.env] == [("HELLO", "hi")]
        assert [(m.destination, m.source, m.type, list(m.options)) for m in got.mounts] == [
            ("/etc/hello", "/srv/hello", "bind", ["rbind", "ro"])]
        (device,) = got.linux.devices
        assert (device.path, device.type, device.major, device.minor) == ("/dev/fuse", "c", 10, 229)
        assert device.file_mode.value == 0o666
        (rule,) = got.linux.resources.devices
        assert (rule.allow, rule.type, rule.major.value, rule.minor.value, rule.access) == (
            True, "c", 10, 229, "rwm")

        reply = await peer.call("CreateContainer", create({}), nri_pb2.CreateContainerResponse)
        assert reply.adjust == nri_pb2.ContainerAdjustment()
        assert peer.parser.violations == []
        peer.close()

    try:
        asyncio.run(asyncio.wait_for(runtime(), 120))
        _, stderr = proc.communicate(timeout=60)  # launched by the runtime: exits with it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr


def test_builders_fill_the_fields_like_nris_go_helpers() -> None:
    a = nri.ContainerAdjustment()
    nri.add_env(a, "A", "1")
    nri.remove_env(a, "B")
    nri.add_mount(a, "/m", "/src", type="tmpfs", options=["nosuid"])
    nri.remove_mount(a, "/old")
    nri.add_device(a, nri.OciDevice("/dev/x", type="b", major=8, minor=1, uid=5, gid=6),
                   access="r")
    nri.add_device(a, nri.OciDevice("/dev/fifo", type="p", major=0, minor=0))
    nri.add_device(a, nri.OciDevice("/dev/y", type="c", major=1, minor=3), access=None)
    nri.remove_device(a, "/dev/z")
    nri.add_hook(a, "create_runtime",
                 nri.OciHook("/bin/hook", args=["hook", "x"], env=["E=1"], timeout=5))
    nri.add_cdi_device(a, "example.com/dev=0")
    nri.add_annotation(a, "k", "v")
    nri.remove_annotation(a, "gone")

    assert [(e.key, e.value) for e in a.env] == [("A", "1"), ("-B", "")]
    assert [(m.destination, m.type) for m in a.mounts] == [("/m", "tmpfs"), ("-/old", "")]
    devices = [(d.path, d.type, d.uid.value, d.gid.value) for d in a.linux.devices]
    assert devices == [("/dev/x", "b", 5, 6), ("/dev/fifo", "p", 0, 0), ("/dev/y", "c", 0, 0),
                       ("-/dev/z", "", 0, 0)]
    # Only /dev/x is allowed: a FIFO has no device number, access=None asks for no rule.
    assert [(r.type, r.major.value, r.access) for r in a.linux.resources.devices] == [
        ("b", 8, "r")]
    (hook,) = a.hooks.create_runtime
    assert (hook.path, list(hook.args), list(hook.env), hook.timeout.value) == (
        "/bin/hook", ["hook", "x"], ["E=1"], 5)
    assert [d.name for d in a.CDI_devices] == ["example.com/dev=0"]
    assert dict(a.annotations) == {"k": "v", "-gone": ""}


@pytest.mark.parametrize(("call", "message"), [
    (lambda a: adj.add_env(a, "A=B", "1"), "environment variable name 'A=B'"),
    (lambda a: adj.add_mount(a, "rel", "/s"), "mount destination 'rel' is not absolute"),
    (lambda a: adj.add_device(a, adj.OciDevice("/dev/q", type="x", major=1, minor=1)),
     "type 'x'"),
    (lambda a: adj.add_hook(a, "later", adj.OciHook("/bin/h")), "hook stage 'later'"),
    (lambda a: adj.add_hook(a, "poststop", adj.OciHook("h")), "hook path 'h' is not absolute"),
    (lambda a: adj.add_cdi_device(a, "gpu0"), "CDI device 'gpu0': want vendor/class=device"),
])
def test_builders_refuse_what_the_runtime_would_reject(call, message: str) -> None:  # type: ignore[no-untyped-def]
    a = nri_pb2.ContainerAdjustment()
    with pytest.raises(ValueError, match=re.escape(message)):
        call(a)
    assert a == nri_pb2.ContainerAdjustment()  # nothing half-added


def test_every_public_name_resolves_and_import_stays_cheap() -> None:
    for name in nri.__all__:
        assert getattr(nri, name) is not None, name
    code = ("import sys, json, nri_plugin.nri; print(json.dumps(sorted(m for m in "
            "('google.protobuf', 'asyncio', 'socket', 'nri_plugin.nri.api') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == []
