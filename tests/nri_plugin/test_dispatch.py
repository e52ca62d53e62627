"""``dispatch``: protobuf in, protobuf out, no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from nri_plugin.nri.api import Event, EventMask, nri_pb2
from nri_plugin.nri.dispatch import (
    METHODS,
    Dispatcher,
    RpcError,
    implemented_events,
    subscription,
)
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.wire import Code

POD = nri_pb2.PodSandbox(id="pod1", name="p", annotations={"a": "b"})
CTR = nri_pb2.Container(id="ctr1", pod_sandbox_id="pod1", name="c")


class Recorder(Plugin):
    """Implements every handler and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        self.calls.append(("configure", config, runtime_name, runtime_version))

    def synchronize(self, pods, containers):  # type: ignore[no-untyped-def]
        self.calls.append(("synchronize", [p.id for p in pods], [c.id for c in containers]))
        return [nri_pb2.ContainerUpdate(container_id="ctr1")]

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))

    def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        self.calls.append(("create_container", pod.id, container.id))
        adj = nri_pb2.ContainerAdjustment()
        adj.linux.devices.add(path="/dev/x", type="c", major=1, minor=2)
        adj.CDI_devices.add(name="vendor.com/gpu=0")
        return adj

    def update_container(self, pod, container, resources):  # type: ignore[no-untyped-def]
        self.calls.append(("update_container", container.id, resources.cpu.cpus))
        return [nri_pb2.ContainerUpdate(container_id="other")]

    def stop_container(self, pod, container):  # type: ignore[no-untyped-def]
        self.calls.append(("stop_container", container.id))

    def update_pod_sandbox(self, pod, overhead, resources):  # type: ignore[no-untyped-def]
        self.calls.append(("update_pod_sandbox", pod.id))


for _name in (
    "run_pod_sandbox",
    "stop_pod_sandbox",
    "remove_pod_sandbox",
    "post_update_pod_sandbox",
):
    setattr(Recorder, _name, lambda self, pod, _n=_name: self.calls.append((_n, pod.id)))
for _name in (
    "post_create_container",
    "start_container",
    "post_start_container",
    "post_update_container",
    "remove_container",
):
    setattr(
        Recorder,
        _name,
        lambda self, pod, ctr, _n=_name: self.calls.append((_n, pod.id, ctr.id)),
    )


class OnlyCreate(Plugin):
    def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        return None


class Failing(Plugin):
    def create_container(self, pod, container):  # type: ignore[no-untyped-def]
        if container.name == "bad":
            raise KeyError("no such device")
        if container.name == "rpc":
            raise RpcError(Code.NOT_FOUND, "unresolved: vendor.com/gpu=9")
        return nri_pb2.ContainerAdjustment(annotations={"ok": "1"})


def ctr_req(**kw: Any) -> bytes:
    return nri_pb2.ContainerEventRequest(pod=POD, container=CTR, **kw).SerializeToString()


def pod_req() -> bytes:
    return nri_pb2.PodSandboxEventRequest(pod=POD).SerializeToString()


def state_change(event: Event, with_ctr: bool = True) -> bytes:
    msg = nri_pb2.StateChangeEvent(event=event.value, pod=POD)
    if with_ctr:
        msg.container.CopyFrom(CTR)
    return msg.SerializeToString()


NOTIFICATIONS = [
    ("RunPodSandbox", pod_req(), ("run_pod_sandbox", "pod1")),
    ("StopPodSandbox", pod_req(), ("stop_pod_sandbox", "pod1")),
    ("RemovePodSandbox", pod_req(), ("remove_pod_sandbox", "pod1")),
    ("PostUpdatePodSandbox", pod_req(), ("post_update_pod_sandbox", "pod1")),
    ("PostCreateContainer", ctr_req(), ("post_create_container", "pod1", "ctr1")),
    ("StartContainer", ctr_req(), ("start_container", "pod1", "ctr1")),
    ("PostStartContainer", ctr_req(), ("post_start_container", "pod1", "ctr1")),
    ("PostUpdateContainer", ctr_req(), ("post_update_container", "pod1", "ctr1")),
    ("RemoveContainer", ctr_req(), ("remove_container", "pod1", "ctr1")),
    ("StateChange", state_change(Event.RUN_POD_SANDBOX, False), ("run_pod_sandbox", "pod1")),
    ("StateChange", state_change(Event.STOP_POD_SANDBOX, False), ("stop_pod_sandbox", "pod1")),
    (
        "StateChange",
        state_change(Event.POST_START_CONTAINER),
        ("post_start_container", "pod1", "ctr1"),
    ),
    ("StateChange", state_change(Event.REMOVE_CONTAINER), ("remove_container", "pod1", "ctr1")),
    (
        "StateChange",
        state_change(Event.POST_UPDATE_POD_SANDBOX, False),
        ("post_update_pod_sandbox", "pod1"),
    ),
    ("Shutdown", b"", ("shutdown",)),
]


@pytest.mark.parametrize(
    ("method", "payload", "call"), NOTIFICATIONS, ids=[f"{m}-{c[0]}" for m, _, c in NOTIFICATIONS]
)
def test_notifications_reach_their_handler_and_reply_empty(
    method: str, payload: bytes, call: tuple[Any, ...]
) -> None:
    plugin = Recorder()
    assert Dispatcher(plugin).dispatch(method, payload) == b""
    assert plugin.calls == [call]


def test_create_container_returns_the_adjustment() -> None:
    plugin = Recorder()
    req = nri_pb2.CreateContainerRequest(pod=POD, container=CTR).SerializeToString()
    reply = Dispatcher(plugin).dispatch("CreateContainer", req)
    resp = nri_pb2.CreateContainerResponse.FromString(reply)
    assert [d.path for d in resp.adjust.linux.devices] == ["/dev/x"]
    assert [d.name for d in resp.adjust.CDI_devices] == ["vendor.com/gpu=0"]
    assert plugin.calls == [("create_container", "pod1", "ctr1")]


def test_an_adjustment_changed_after_an_answer_is_answered_as_it_is_now() -> None:
    """Every reply is encoded from the adjustment as it is (nothing kept between
    replies)."""
    adjustment = nri_pb2.ContainerAdjustment(env=[nri_pb2.KeyValue(key="NAME", value="a")])

    class Same(Plugin):
        def create_container(self, pod, container):  # type: ignore[no-untyped-def]
            return adjustment

    dispatcher = Dispatcher(Same())
    payload = nri_pb2.CreateContainerRequest(pod=POD, container=CTR).SerializeToString()
    dispatcher.dispatch("CreateContainer", payload)
    adjustment.env[0].value = "changed"
    reply = nri_pb2.CreateContainerResponse.FromString(
        dispatcher.dispatch("CreateContainer", payload))
    assert reply.adjust.env[0].value == "changed"


def test_create_container_may_return_a_full_response() -> None:
    class WithUpdates(Plugin):
        def create_container(self, pod, container):  # type: ignore[no-untyped-def]
            return nri_pb2.CreateContainerResponse(
                update=[nri_pb2.ContainerUpdate(container_id="x")]
            )

    req = nri_pb2.CreateContainerRequest(pod=POD, container=CTR).SerializeToString()
    resp = nri_pb2.CreateContainerResponse.FromString(
        Dispatcher(WithUpdates()).dispatch("CreateContainer", req)
    )
    assert [u.container_id for u in resp.update] == ["x"]


def test_update_and_stop_container_return_updates() -> None:
    plugin = Recorder()
    req = nri_pb2.UpdateContainerRequest(pod=POD, container=CTR)
    req.linux_resources.cpu.cpus = "0-3"
    out = nri_pb2.UpdateContainerResponse.FromString(
        Dispatcher(plugin).dispatch("UpdateContainer", req.SerializeToString())
    )
    assert [u.container_id for u in out.update] == ["other"]
    stop = nri_pb2.StopContainerRequest(pod=POD, container=CTR).SerializeToString()
    reply = Dispatcher(plugin).dispatch("StopContainer", stop)
    assert nri_pb2.StopContainerResponse.FromString(reply) == nri_pb2.StopContainerResponse()
    pod = nri_pb2.UpdatePodSandboxRequest(pod=POD).SerializeToString()
    assert Dispatcher(plugin).dispatch("UpdatePodSandbox", pod) == b""
    assert plugin.calls == [
        ("update_container", "ctr1", "0-3"),
        ("stop_container", "ctr1"),
        ("update_pod_sandbox", "pod1"),
    ]


@pytest.mark.parametrize(
    ("method", "payload"),
    [("StartContainer", ctr_req()), ("StateChange", state_change(Event.RUN_POD_SANDBOX))],
)
def test_no_handler_gives_an_empty_reply(method: str, payload: bytes) -> None:
    assert Dispatcher(OnlyCreate()).dispatch(method, payload) == b""


def test_handler_exception_fails_only_its_request() -> None:
    d = Dispatcher(Failing())

    def create(name: str) -> bytes:
        ctr = nri_pb2.Container(id=name, name=name)
        return d.dispatch(
            "CreateContainer",
            nri_pb2.CreateContainerRequest(pod=POD, container=ctr).SerializeToString(),
        )

    with pytest.raises(RpcError) as err:
        create("bad")
    assert err.value.code == Code.UNKNOWN
    assert "KeyError" in err.value.message
    with pytest.raises(RpcError) as err:
        create("rpc")
    assert (err.value.code, err.value.message) == (Code.NOT_FOUND, "unresolved: vendor.com/gpu=9")
    ok = nri_pb2.CreateContainerResponse.FromString(create("good"))
    assert dict(ok.adjust.annotations) == {"ok": "1"}


@pytest.mark.parametrize(
    ("method", "payload", "code"),
    [
        ("CreateContainer", b"\xff\xff", Code.INVALID_ARGUMENT),
        ("ValidateContainerAdjustment", b"", Code.UNIMPLEMENTED),
        ("StateChange", state_change(Event.CREATE_CONTAINER), Code.INVALID_ARGUMENT),
        (
            "StateChange",
            nri_pb2.StateChangeEvent(event=99).SerializeToString(),
            Code.INVALID_ARGUMENT,
        ),
    ],
    ids=["undecodable", "unknown-method", "statechange-create", "statechange-unknown"],
)
def test_bad_requests_are_error_statuses(method: str, payload: bytes, code: Code) -> None:
    with pytest.raises(RpcError) as err:
        Dispatcher(Recorder()).dispatch(method, payload)
    assert err.value.code == code


def configure(d: Dispatcher, *, nri_version: str = "", timeout: int = 0) -> int:
    req = nri_pb2.ConfigureRequest(
        config="cfg",
        runtime_name="containerd",
        runtime_version="2.1",
        request_timeout=timeout,
        NRI_version=nri_version,
    )
    return nri_pb2.ConfigureResponse.FromString(
        d.dispatch("Configure", req.SerializeToString())
    ).events


def test_configure_subscribes_to_implemented_events_within_legacy_bits() -> None:
    plugin = Recorder()
    d = Dispatcher(plugin)
    assert configure(d, timeout=1500) == 0x7FF  # events 12/13 dropped for old runtimes
    assert plugin.calls == [("configure", "cfg", "containerd", "2.1")]
    assert d.configuration is not None
    assert d.configuration.request_timeout == 1.5
    assert d.configuration.events == EventMask(0x7FF)


def test_configure_uses_newer_bits_when_the_runtime_is_v0_12() -> None:
    assert configure(Dispatcher(Recorder()), nri_version="v0.12.0") == 0x1FFF


def test_configure_mask_for_a_create_only_plugin() -> None:
    d = Dispatcher(OnlyCreate())
    assert configure(d) == 0x8
    assert d.configuration is not None
    assert d.configuration.request_timeout == 2.0  # runtime default when unset


def test_configure_can_narrow_but_not_widen() -> None:
    class Narrow(Recorder):
        def configure(self, config, runtime_name, runtime_version):  # type: ignore[no-untyped-def]
            return EventMask.CREATE_CONTAINER | EventMask.REMOVE_CONTAINER

    assert configure(Dispatcher(Narrow())) == 0x408

    class Wide(OnlyCreate):
        def configure(self, config, runtime_name, runtime_version):  # type: ignore[no-untyped-def]
            return EventMask.CREATE_CONTAINER | EventMask.START_CONTAINER

    with pytest.raises(RpcError) as err:
        configure(Dispatcher(Wide()))
    assert err.value.code == Code.INVALID_ARGUMENT


def test_subscription_is_never_zero() -> None:
    class PodUpdateOnly(Plugin):
        def update_pod_sandbox(self, pod, overhead, resources):  # type: ignore[no-untyped-def]
            pass

    assert implemented_events(PodUpdateOnly()) == EventMask.UPDATE_POD_SANDBOX
    with pytest.raises(RpcError):
        subscription(PodUpdateOnly())


def test_a_plugin_without_handlers_is_refused() -> None:
    with pytest.raises(ValueError, match="no event handler"):
        Dispatcher(Plugin())


def test_synchronize_pages_are_collected() -> None:
    plugin = Recorder()
    d = Dispatcher(plugin)
    pages = [
        nri_pb2.SynchronizeRequest(pods=[nri_pb2.PodSandbox(id="p1")], more=True),
        nri_pb2.SynchronizeRequest(containers=[nri_pb2.Container(id="c1")], more=True),
        nri_pb2.SynchronizeRequest(
            pods=[nri_pb2.PodSandbox(id="p2")], containers=[nri_pb2.Container(id="c2")]
        ),
    ]
    replies = [
        nri_pb2.SynchronizeResponse.FromString(d.dispatch("Synchronize", p.SerializeToString()))
        for p in pages
    ]
    assert [(r.more, len(r.update)) for r in replies] == [(True, 0), (True, 0), (False, 1)]
    assert plugin.calls == [("synchronize", ["p1", "p2"], ["c1", "c2"])]


def test_synchronize_pages_are_echoed_even_without_a_handler() -> None:
    d = Dispatcher(OnlyCreate())
    more = nri_pb2.SynchronizeRequest(more=True, pods=[nri_pb2.PodSandbox(id="p")])
    assert nri_pb2.SynchronizeResponse.FromString(
        d.dispatch("Synchronize", more.SerializeToString())).more
    last = nri_pb2.SynchronizeResponse.FromString(d.dispatch("Synchronize", b""))
    assert not last.more
    assert not last.update


def test_an_empty_page_with_more_is_a_stalled_synchronize() -> None:
    # NRI 0.7-0.12 round one over-4-MiB pod to zero objects per page and then send empty
    # more=true pages until their timeout: refuse the first, saying why.
    d = Dispatcher(OnlyCreate())
    page = nri_pb2.SynchronizeRequest(more=True, containers=[nri_pb2.Container(id="c")] * 3)
    assert nri_pb2.SynchronizeResponse.FromString(
        d.dispatch("Synchronize", page.SerializeToString())).more
    empty = nri_pb2.SynchronizeRequest(more=True).SerializeToString()
    with pytest.raises(RpcError) as info:
        d.dispatch("Synchronize", empty)
    assert info.value.code == Code.FAILED_PRECONDITION
    assert "after 0 pods and 3 containers" in info.value.message
    assert "one pod or container alone is over 4 MiB" in info.value.message
    assert not d.synchronized


def test_methods_cover_the_plugin_service() -> None:
    served = {m.name for m in nri_pb2.DESCRIPTOR.services_by_name["Plugin"].methods}
    assert served == METHODS
    # Each is handled, not answered UNIMPLEMENTED (StateChange, empty, names no event).
    for method in sorted(METHODS - {"StateChange"}):
        Dispatcher(Recorder()).dispatch(method, b"")
    with pytest.raises(RpcError) as info:
        Dispatcher(Recorder()).dispatch("ValidateContainerAdjustment", b"")
    assert info.value.code == Code.UNIMPLEMENTED
