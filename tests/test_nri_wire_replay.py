"""The NRI wire recordings of real runtimes (tests/data/nri-wire/) replayed against the
plugin: what each runtime really sent, and what the plugin really answered.

Each recording (tests/e2e/nri_recorder.py; how it was made: tests/nri_wire.py and the
folder's README) holds every message between a runtime and ``nri-cdi plugin`` on a fixed
set of scenarios. Here our side plays the runtime through a real unix socket: the node is
built again (tests/nri_wire.py), the plugin is started with the same settings file, each
connection it makes is taken as the recorded session it registers as, the runtime's
requests are sent in the recorded order (the recorded Configure, runtime name and versions
included), the plugin's own requests (RegisterPlugin) are checked and answered as the
runtime answered them, and the plugin is killed and started again where the recording
says so. Every answer of the plugin must equal the recorded one. A change that alters an
answer on any recorded runtime, including those CI cannot run (containerd 2.2 and 2.3
built from source, CRI-O), fails here.

What is normalised, each by name: ``{node}`` (the root the node was built under) and
``{runtime}`` (the runtime's temp folder) in every string, both ways; and ``pid`` in the
runtime's requests, set to 0, so that a start guard replayed here never signals a process
of this machine (with pid 0 and the recorded cgroup, which does not exist here, it finds
nothing to stop, and says so the same way). Nothing else: ids, names and messages are
compared as recorded.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from nri_cdi_testbed.node_check.plugin import PluginProcess
from tests import prerequisites
from tests.e2e.cri_recorder import substitute
from tests.e2e.nri_recorder import METHODS, read_wire
from tests.nri_runtime_peer import RUNTIME_CONN, RuntimePeer
from tests.nri_wire import ROOT_NAME, build_world

DATA = Path(__file__).parent / "data" / "nri-wire"
# Every runtime a recording must exist for: a missing one fails, never skips.
RUNTIMES = ("containerd-1.7.24", "containerd-2.1.9", "containerd-2.2.1", "containerd-2.3.4",
            "cri-o-1.35.6")
RUNTIME_NAME = "{runtime}"
# A bound on one wait for the plugin: only a hang gets there (a process on a loaded machine).
HANG = 60.0


def _zero_pids(value: Any) -> Any:
    if isinstance(value, list):
        return [_zero_pids(v) for v in value]
    if isinstance(value, dict):
        return {k: (0 if k == "pid" else _zero_pids(v)) for k, v in value.items()}
    return value


class Replay:
    def __init__(self, lines: list[dict[str, Any]], names: Mapping[str, str],
                 plugin: PluginProcess) -> None:
        self.lines = lines
        self.names = dict(names)  # placeholder -> path here
        self.back = {path: name for name, path in names.items()}
        self.plugin = plugin
        self.accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue())
        self.peers: dict[int, RuntimePeer] = {}
        self.compared = 0
        self.case = "(start)"  # the scenario the recording is in, for messages

    def responses(self) -> dict[tuple[int, int, int], dict[str, Any]]:
        return {(r["session"], r["conn"], r["stream"]): r for r in self.lines
                if r["kind"] == "response"}

    async def run(self, socket_path: str) -> None:
        server = await asyncio.start_unix_server(
            lambda r, w: self.accepted.put_nowait((r, w)), socket_path)
        recorded = self.responses()
        try:
            self.plugin.spawn()
            for line in self.lines:
                await self.step(line, recorded)
        finally:
            for peer in self.peers.values():
                peer.close()
            server.close()

    async def step(self, line: dict[str, Any],
                   recorded: dict[tuple[int, int, int], dict[str, Any]]) -> None:
        kind, method = line["kind"], line["method"]
        where = (f"{self.case}: seq {line['seq']} ({method}, session {line.get('session')}): "
                 "the plugin's answer differs from the recorded one")
        if kind == "mark":
            if method == "#case":
                self.case = line["message"]["label"]
            elif method == "#connect":
                reader, writer = await asyncio.wait_for(self.accepted.get(), HANG)
                self.peers[line["session"]] = RuntimePeer(reader, writer)
            elif method == "#plugin" and line["message"]["action"] == "killed":
                self.plugin.kill()
            elif method == "#plugin" and line["message"]["action"] == "started":
                self.plugin.spawn()
            elif method == "#close" and line["message"]["closed_by"] == "runtime":
                self.peers[line["session"]].close()
            return
        if kind != "request":
            return
        peer = self.peers[line["session"]]
        kinds = METHODS.get(method)
        assert kinds is not None, f"{where}: a method our nri.proto lacks; cannot replay it"
        answer = recorded.get((line["session"], line["conn"], line["stream"]))
        if line["from"] == "plugin":
            stream, got_method, payload = await peer.next_runtime_call()
            assert got_method == method, f"{where}: the plugin called {got_method}"
            got = json_format.MessageToDict(kinds[0].FromString(payload),
                                            preserving_proto_field_name=True)
            assert substitute(got, self.back) == line["message"], where
            assert answer is not None, f"{where}: the runtime's answer was not recorded"
            reply = json_format.ParseDict(substitute(answer["message"], self.names), kinds[1]())
            peer.reply(stream, reply, answer["status"]["code"], answer["status"]["message"])
            self.compared += 1
            return
        assert answer is not None, f"{where}: the plugin's answer was not recorded"
        message = json_format.ParseDict(
            _zero_pids(substitute(line["message"], self.names)), kinds[0]())
        assert line["conn"] != RUNTIME_CONN, where
        response = await asyncio.wait_for(
            peer.response_to(peer.send_request(method, message)), HANG)
        got_status = {"code": response.status.code, "message": response.status.message}
        got = json_format.MessageToDict(kinds[1].FromString(response.payload),
                                        preserving_proto_field_name=True)
        assert substitute(got_status, self.back) == answer["status"], where
        assert substitute(got, self.back) == answer["message"], where
        self.compared += 1


@pytest.fixture
def replay_ready() -> None:
    if os.geteuid() != 0:
        prerequisites.missing("the NRI wire replay", "the replayed node's device nodes need "
                              "root (mknod): run the tests as root")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_plugin_answers_as_recorded(runtime: str, replay_ready: None,
                                        tmp_path: Path) -> None:
    path = DATA / f"{runtime}.jsonl"
    assert path.is_file(), f"no recording of {runtime} ({path}): tests/data/nri-wire/README.md"
    lines = read_wire(path)
    world = build_world(tmp_path / "node")
    (tmp_path / "runtime").mkdir()
    names = {ROOT_NAME: str(world.root), RUNTIME_NAME: str(tmp_path / "runtime")}
    socket_path = tmp_path / "nri.sock"
    plugin = PluginProcess(str(socket_path), [], tmp_path / "plugin.log",
                           extra_args=["--config", str(world.config)])
    replay = Replay(lines, names, plugin)
    try:
        asyncio.run(asyncio.wait_for(replay.run(str(socket_path)), HANG * 5))
    except BaseException:
        print(plugin.log()[-6000:])
        raise
    finally:
        plugin.kill()
    creates = sum(1 for r in lines if r["kind"] == "request" and r["method"] == "CreateContainer")
    assert creates >= 10 and replay.compared > creates, (creates, replay.compared)


def test_every_recording_is_replayed() -> None:
    found = {p.stem for p in DATA.glob("*.jsonl")}
    assert found == set(RUNTIMES), found ^ set(RUNTIMES)
    for name in RUNTIMES:
        runtime = next(r for r in read_wire(DATA / f"{name}.jsonl") if r["method"] == "#runtime")
        assert runtime["message"]["label"] == name
