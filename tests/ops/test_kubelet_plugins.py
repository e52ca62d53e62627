"""doctor knows a DRA driver by its registration with the kubelet, whoever wrote it (issue 52,
item 7): the registration sockets in the kubelet's plugin registry are asked
``pluginregistration.Registration/GetInfo`` as the kubelet asks them.

The registration servers here are real grpcio servers on real Unix sockets. Their replies
are made with protobuf's own encoder from a PluginInfo message declared in this file (type
= 1, name = 2, endpoint = 3, supported_versions = 4, as Kubernetes' pluginregistration v1
numbers them), not with the decoder under test.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nri_plugin.ops import doctor
from nri_plugin.ops.containerd_config import ContainerdConfig
from nri_plugin.ops.doctor import DRA_CHECK, check_dra, run_checks
from nri_plugin.ops.inpod import ON_NODE, Place
from nri_plugin.ops.kubelet_plugins import (
    DEFAULT_REGISTRY,
    Registry,
    read_registry,
)
from nri_plugin.ops.settings import Settings

grpc = pytest.importorskip("grpc")

V2_OFF = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {"enable_cdi": False}}}
V2_ON = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {
    "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"]}}}
C17_OFF = ContainerdConfig(path="/etc/containerd/config.toml", data=V2_OFF, major=1)
# The name Kubernetes' own DRA test driver (test/e2e/dra/test-driver) registers under.
TEST_DRIVER = "test-driver.cdi.k8s.io"


def _plugin_info_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="kp_test_registration.proto",
                                               package="kptest", syntax="proto3")
    message = proto.message_type.add(name="PluginInfo")
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    for number, name, label in ((1, "type", optional), (2, "name", optional),
                                (3, "endpoint", optional),
                                (4, "supported_versions", repeated)):
        message.field.add(name=name, number=number, type=string, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kptest.PluginInfo"))


PluginInfo = _plugin_info_class()


def plugin_info(kind: str, name: str, endpoint: str = "", *versions: str) -> bytes:
    return bytes(PluginInfo(type=kind, name=name, endpoint=endpoint,
                            supported_versions=list(versions)).SerializeToString())


@pytest.fixture
def folder() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: a short folder, not pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def serve() -> Iterator[Callable[[Path, bytes], None]]:
    """Serves GetInfo on a Unix socket, answering ``reply``, as a kubelet plugin does."""
    servers: list[Any] = []

    def start(path: Path, reply: bytes) -> None:
        asked: list[bytes] = []

        def get_info(request: bytes, context: Any) -> bytes:
            asked.append(request)
            return reply

        server = grpc.server(ThreadPoolExecutor(2))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "pluginregistration.Registration",
            {"GetInfo": grpc.unary_unary_rpc_method_handler(get_info)}),))
        assert server.add_insecure_port(f"unix://{path}")
        server.start()
        servers.append(server)

    yield start
    for server in servers:
        server.stop(None)


@pytest.fixture
def silent() -> Iterator[Callable[[Path], None]]:
    """A socket that accepts connections and never answers."""
    listeners: list[socket.socket] = []

    def start(path: Path) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(8)
        listeners.append(listener)

    yield start
    for listener in listeners:
        listener.close()


def test_the_default_folder_is_the_kubelets() -> None:
    assert DEFAULT_REGISTRY == "/var/lib/kubelet/plugins_registry"
    assert Settings().doctor.plugin_registry == DEFAULT_REGISTRY


def test_a_reply_that_is_no_plugin_info_is_said(folder: Path, serve: Any) -> None:
    serve(folder / "odd-reg.sock", b"\x0a\x05ab")  # a field longer than the bytes
    (odd,) = read_registry(str(folder)).plugins
    assert (odd.type, odd.problem) == ("", "not a PluginInfo reply")


def test_a_dra_and_a_csi_plugin_are_told_apart(folder: Path, serve: Any) -> None:
    serve(folder / f"{TEST_DRIVER}-reg.sock", plugin_info("DRAPlugin", TEST_DRIVER, "",
                                                           "v1.DRAPlugin"))
    (folder / "csi").mkdir()  # the kubelet walks subfolders too
    serve(folder / "csi" / "ebs.csi.aws.com-reg.sock",
          plugin_info("CSIPlugin", "ebs.csi.aws.com", "/var/lib/kubelet/plugins/ebs/csi.sock",
                      "1.0.0"))
    registry = read_registry(str(folder))
    assert registry.problem == ""
    kinds = {p.name: p.type for p in registry.plugins}
    assert kinds == {TEST_DRIVER: "DRAPlugin", "ebs.csi.aws.com": "CSIPlugin"}
    (dra,) = registry.dra
    assert dra.name == TEST_DRIVER


def test_a_silent_socket_counts_as_a_plugin_of_unknown_type(folder: Path, silent: Any) -> None:
    silent(folder / "quiet.sock")
    (folder / ".hidden.sock").write_text("")  # the kubelet ignores dot names
    registry = read_registry(str(folder), timeout=0.5)
    (plugin,) = registry.plugins
    assert plugin.type == "" and plugin.problem == "no answer in time"
    assert "type unknown" in plugin.describe()


def test_without_grpcio_every_socket_is_of_unknown_type(folder: Path, serve: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    serve(folder / "dra.sock", plugin_info("DRAPlugin", TEST_DRIVER))
    monkeypatch.setitem(sys.modules, "grpc", None)  # its import fails
    (plugin,) = read_registry(str(folder)).plugins
    assert plugin.type == "" and "grpcio is not installed" in plugin.problem


def test_an_empty_and_a_missing_folder(folder: Path) -> None:
    assert read_registry(str(folder)) == Registry(folder=str(folder))
    assert read_registry(str(folder / "none")).problem == f"no {folder / 'none'}"


# --- doctor's verdict ----------------------------------------------------------------------


def test_a_registered_dra_driver_with_containerd_cdi_off_fails(folder: Path,
                                                               serve: Any) -> None:
    """Kubernetes' own DRA test driver: no NVIDIA claim file names, yet it fails."""
    serve(folder / "dra.sock", plugin_info("DRAPlugin", TEST_DRIVER, "", "v1.DRAPlugin"))
    specs = folder / "cdi"
    specs.mkdir()
    (specs / f"{TEST_DRIVER}-5b1f.json").write_text("{}")  # the test driver's claim spec
    check = check_dra(C17_OFF, [str(specs)], read_registry(str(folder)),
                      version=(1, 7, 24))
    assert check.status == "fail"
    assert f"DRA driver(s) registered with the kubelet: {TEST_DRIVER}" in check.detail
    assert "start without those devices and without an error" in check.detail
    assert "enable_cdi = true" in check.fix and "\n" not in check.detail + check.fix
    # containerd 2.3 refuses such containers instead
    check = check_dra(C17_OFF, [str(specs)], read_registry(str(folder)), version=(2, 3, 4))
    assert check.status == "fail" and "fail to be created" in check.detail
    # with containerd's CDI on the driver's claims are served
    on = ContainerdConfig(path="/x", data=V2_ON, major=1)
    check = check_dra(on, [str(specs)], read_registry(str(folder)))
    assert check.status == "ok" and TEST_DRIVER in check.detail


def test_only_a_csi_plugin_registered_is_a_warning(folder: Path, serve: Any) -> None:
    serve(folder / "csi.sock", plugin_info("CSIPlugin", "ebs.csi.aws.com"))
    check = check_dra(C17_OFF, [str(folder)], read_registry(str(folder)))
    assert check.status == "warn"
    assert "no DRA driver is registered with the kubelet" in check.detail
    assert "other kubelet plugins: CSIPlugin" in check.detail


def test_a_plugin_that_does_not_answer_is_named_as_of_unknown_type(folder: Path,
                                                                   silent: Any) -> None:
    silent(folder / "quiet.sock")
    check = check_dra(C17_OFF, [str(folder)], read_registry(str(folder), timeout=0.5))
    assert check.status == "warn"
    assert "1 kubelet plugin(s) of unknown type" in check.detail
    assert f"{folder}/quiet.sock" in check.detail


def test_an_empty_registry_is_a_warning_that_says_so(folder: Path) -> None:
    check = check_dra(C17_OFF, [str(folder)], read_registry(str(folder)))
    assert check.status == "warn"
    assert f"{folder} holds no registration socket" in check.detail


def test_doctor_asks_the_folder_its_settings_name(folder: Path, serve: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """run_checks reads doctor.plugin_registry (the flag --plugin-registry)."""
    registry = folder / "registry"
    registry.mkdir()
    serve(registry / "dra.sock", plugin_info("DRAPlugin", TEST_DRIVER))
    config = folder / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
                      "  enable_cdi = false\n")
    settings = Settings().with_values({
        "runtime_cdi.containerd_config": str(config), "plugin.socket": str(folder / "nri.sock"),
        "plugin.spec_dirs": [str(folder / "cdi")], "plugin.status_dir": "",
        "doctor.plugin_registry": str(registry)})
    monkeypatch.setattr(doctor, "running_containerd_version", lambda *_: (1, 7, 0))
    checks = run_checks(settings, check_generated=False, place=ON_NODE)
    (dra,) = [c for c in checks if c.name == DRA_CHECK]
    assert dra.status == "fail" and TEST_DRIVER in dra.detail


def test_in_a_pod_without_the_registry_mounted_it_says_so(folder: Path) -> None:
    check = check_dra(C17_OFF, [str(folder)], read_registry(str(folder / "absent")),
                      place=Place(True, "test"))
    assert check.status == "warn"
    assert f"{folder / 'absent'} is not visible from the pod" in check.detail
