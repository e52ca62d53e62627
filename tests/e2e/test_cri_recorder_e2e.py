"""The CRI recorder (tests/e2e/cri_recorder.py) between a CRI client and a real containerd:
every call answered as containerd answers it, and written down in request order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.cri_recorder import MARK, POLLING, CriRecorder, read_recording
from tests.e2e.images import BUSYBOX_IMAGE

SLEEP = ["sleep", "600"]


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


@pytest.fixture
def recorded(ctrd: Containerd, tmp_path: Path) -> Iterator[tuple[CriRecorder, CriClient]]:
    socket = tmp_path / "cri.sock"
    with CriRecorder(socket, ctrd.address, tmp_path / "cri.jsonl") as recorder, \
            CriClient(str(socket)) as client, client.cleanup():
        yield recorder, client


def test_calls_pass_through_and_are_written_in_order(recorded: tuple[CriRecorder, CriClient],
                                                     ctrd: Containerd) -> None:
    recorder, cri = recorded
    pod = cri.run_pod("rec", annotations={"example.com/a": "1"})
    cid = cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                               env={"GREETING": "hello"},
                               annotations={"cdi.k8s.io/x": "vendor.example/dev=d0"})
    cri.start_container(cid)
    recorder.mark("plugin killed", signal="KILL")
    through = cri.exec_sync(cid, ["sh", "-c", "echo $GREETING; echo err >&2; exit 3"])
    with ctrd.cri() as direct:
        assert direct.exec_sync(cid, ["sh", "-c", "echo $GREETING; echo err >&2; exit 3"]) \
            == through
        assert direct.container_status(cid).status.state == cri.pb.CONTAINER_RUNNING
    assert (through.exit_code, through.stdout, through.stderr) == (3, "hello\n", "err\n")
    with pytest.raises(cri.grpc.RpcError) as missing:
        cri.container_status("no-such-container")
    cri.stop_container(cid)
    cri.remove_container(cid)
    # each call's line is written before its reply leaves the recorder

    calls = read_recording(recorder.out)
    methods = [c.short for c in calls]
    assert methods == ["RunPodSandbox", "CreateContainer", "StartContainer", "#mark",
                       "ExecSync", "ContainerStatus", "StopContainer", "RemoveContainer"], methods
    assert [c.seq for c in calls] == sorted({c.seq for c in calls})
    run, create, start, mark, exec_, status = calls[:6]
    assert mark.method == MARK
    assert mark.request == {"event": "plugin killed", "signal": "KILL"}
    assert run.request["config"]["annotations"] == {"example.com/a": "1"}
    assert run.response["pod_sandbox_id"] == pod
    assert create.request["pod_sandbox_id"] == pod
    config = create.request["config"]
    assert config["envs"] == [{"key": "GREETING", "value": "hello"}]
    assert config["annotations"] == {"cdi.k8s.io/x": "vendor.example/dev=d0"}
    assert create.response["container_id"] == cid
    assert start.request == {"container_id": cid} and start.code == "OK"
    assert exec_.response["exit_code"] == 3
    assert (status.code, status.message) == (missing.value.code().name,
                                             missing.value.details())
    assert status.code == "NOT_FOUND"


def test_a_refused_call_keeps_containerds_status(recorded: tuple[CriRecorder, CriClient]
                                                 ) -> None:
    recorder, cri = recorded
    pod = cri.run_pod("refused")
    with pytest.raises(cri.grpc.RpcError) as error:
        cri.create_container(pod, "app", "localhost/nri-cdi/no-such-image:e2e",
                             command=SLEEP)
    (create,) = [c for c in read_recording(recorder.out) if c.short == "CreateContainer"]
    assert (create.code, create.message) == (error.value.code().name, error.value.details())
    assert "no-such-image" in create.message
    assert create.response == {}


def test_skipped_methods_are_forwarded_not_written(ctrd: Containerd, tmp_path: Path) -> None:
    socket = tmp_path / "cri.sock"
    with CriRecorder(socket, ctrd.address, tmp_path / "cri.jsonl", skip=POLLING) as recorder, \
            CriClient(str(socket)) as cri, cri.cleanup():
        version = cri.version()
        pod = cri.run_pod("quiet")
        assert [p.id for p in cri.list_pods() if p.id == pod] == [pod]
    assert version.runtime_name == "containerd"
    lines = [json.loads(line) for line in recorder.out.read_text().splitlines()]
    assert [line["method"] for line in lines] == ["RuntimeService/RunPodSandbox",
                                                  "RuntimeService/StopPodSandbox",
                                                  "RuntimeService/RemovePodSandbox"]
    # the skipped calls still took their sequence numbers
    assert lines[0]["seq"] == 2


def test_a_streaming_call_is_forwarded(recorded: tuple[CriRecorder, CriClient]) -> None:
    """GetContainerEvents (server streaming, the kubelet's evented PLEG) through the proxy:
    the event of a container started meanwhile arrives, and the stream is written when it
    ends."""
    recorder, cri = recorded
    # CriClient makes no stub for the streaming method: a plain grpc one, on the recorder
    channel = cri.grpc.insecure_channel(f"unix://{recorder.listen}",
                                        options=[("grpc.enable_http_proxy", 0)])
    events = channel.unary_stream("/runtime.v1.RuntimeService/GetContainerEvents",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=cri.pb.ContainerEventResponse.FromString)
    stream = events(cri.pb.GetEventsRequest(), timeout=60)
    seen: list[str] = []
    ended = threading.Event()

    def read() -> None:
        try:
            for event in stream:
                seen.append(event.container_id)
        except cri.grpc.RpcError:
            pass
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pod = cri.run_pod("events")
    deadline = time.monotonic() + 30
    while pod not in seen:  # events of earlier tests' pods may come first
        assert not ended.is_set() and time.monotonic() < deadline, \
            f"the pod's event never came through the recorder: {seen}"
        time.sleep(0.02)
    stream.cancel()
    reader.join(10)
    channel.close()
    # a stream's line is written when it ends, after the client's cancel reached it
    deadline = time.monotonic() + 30
    while not (streams := [c for c in read_recording(recorder.out)
                           if c.short == "GetContainerEvents"]):
        assert time.monotonic() < deadline, "the cancelled stream was never written"
        time.sleep(0.05)
    (events,) = streams
    assert events.code == "CANCELLED"
    assert any(r.get("container_id") == pod for r in events.responses), events


def test_a_call_held_before_it_is_forwarded(ctrd: Containerd, tmp_path: Path) -> None:
    """``before`` sees each call first and may hold it: a held StartContainer leaves the
    container created until it is let go, and is numbered when it goes on."""
    gate = threading.Event()
    seen: list[str] = []

    def before(method: str, request: Mapping[str, Any]) -> None:
        seen.append(method)
        if method == "StartContainer":
            assert gate.wait(30)

    socket = tmp_path / "cri.sock"
    with CriRecorder(socket, ctrd.address, tmp_path / "cri.jsonl", before=before) as rec, \
            CriClient(str(socket)) as cri, cri.cleanup():
        pod = cri.run_pod("held")
        cid = cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP)
        starting = threading.Thread(target=cri.start_container, args=(cid,))
        starting.start()
        deadline = time.monotonic() + 30
        while "StartContainer" not in seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        rec.mark("while held")
        assert cri.container_status(cid).status.state == cri.pb.CONTAINER_CREATED
        gate.set()
        starting.join(30)
        assert cri.container_status(cid).status.state == cri.pb.CONTAINER_RUNNING
        methods = [c.short for c in read_recording(rec.out)]
    assert methods.index("#mark") < methods.index("StartContainer"), methods
