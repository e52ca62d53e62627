"""Applying resolved edits to OCI runtime specs, compared whole against hand-checked results."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from cdi.cache import SpecCache
from cdi.edits import apply, merge
from cdi.errors import CDIError, UnresolvedDevicesError
from cdi.model import ContainerEdits, Hook, IntelRdt, Mount, NetDevice
from tests.helpers import make_char_device, write_specs

BASE_OCI: dict[str, Any] = {
    "ociVersion": "1.1.0",
    "process": {
        "user": {"uid": 0, "gid": 0},
        "env": ["PATH=/bin", "KEEP=1", "GPU=none"],
        "args": ["sh"],
    },
    "root": {"path": "rootfs"},
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/usr/lib/x/libold.so", "type": "bind", "source": "/old"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
    ],
    "linux": {"devices": [{"path": "/dev/gpu0", "type": "c", "major": 9, "minor": 9}]},
}


@pytest.fixture
def gpu_node_dir(tmp_path: Path, need_root: None) -> Path:
    host = tmp_path / "host"
    host.mkdir()
    make_char_device(host / "gpu0", major=1, minor=3, mode=0o666)
    make_char_device(host / "ctl", major=1, minor=5, mode=0o660)
    os.chown(host / "ctl", 0, 44)
    os.mkfifo(host / "pipe", 0o600)
    return host


def _spec(host: Path) -> str:
    return f"""\
        cdiVersion: 0.7.0
        kind: example.com/gpu
        containerEdits:
          env: [GPU=example, LIBDIR=/usr/lib/x]
          deviceNodes:
          - {{path: /dev/ctl, hostPath: {host}/ctl, permissions: rw}}
          mounts:
          - {{hostPath: /host/lib/libx.so.1, containerPath: /usr/lib/x/libx.so.1,
              options: [ro, nosuid, nodev, bind]}}
          - {{hostPath: /host/lib, containerPath: /usr/lib/x}}
          hooks:
          - {{hookName: createContainer, path: /usr/bin/nri-cdi,
              args: [nri-cdi, hook, update-ldcache, --folder, /usr/lib/x]}}
        devices:
        - name: "0"
          containerEdits:
            deviceNodes:
            - {{path: /dev/gpu0, hostPath: {host}/gpu0}}
            - {{path: /dev/pipe, hostPath: {host}/pipe}}
            mounts:
            - {{hostPath: /host/lib/libold.so, containerPath: /usr/lib/x/libold.so, type: bind,
                options: [ro, bind]}}
            hooks:
            - {{hookName: startContainer, path: /bin/true, timeout: 5}}
            additionalGids: [44, 0]
        - name: "1"
          containerEdits:
            deviceNodes:
            - {{path: /dev/gpu1, type: c, major: 1, minor: 7, fileMode: 384, uid: 7, gid: 8,
                permissions: none}}
            additionalGids: [44, 45]
        """


def test_two_devices_applied_as_hand_checked(gpu_node_dir: Path, tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "cdi", {"gpu.yaml": _spec(gpu_node_dir)})
    snapshot = SpecCache([str(folder)]).refresh()
    assert not snapshot.errors
    original = copy.deepcopy(BASE_OCI)
    result = apply(BASE_OCI, snapshot.resolve(["example.com/gpu=0", "example.com/gpu=1"]))
    assert original == BASE_OCI  # the input is never mutated
    assert result == {
        "ociVersion": "1.1.0",
        "process": {
            "user": {"uid": 0, "gid": 0, "additionalGids": [44, 45]},
            # replaced in place by name, new names appended in order
            "env": ["PATH=/bin", "KEEP=1", "GPU=example", "LIBDIR=/usr/lib/x"],
            "args": ["sh"],
        },
        "root": {"path": "rootfs"},
        "mounts": [  # replaced by destination, then stably sorted by depth
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/usr/lib/x", "source": "/host/lib"},
            {
                "destination": "/usr/lib/x/libx.so.1",
                "source": "/host/lib/libx.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "destination": "/usr/lib/x/libold.so",
                "source": "/host/lib/libold.so",
                "type": "bind",
                "options": ["ro", "bind"],
            },
        ],
        "linux": {
            "devices": [  # /dev/gpu0 replaced, the rest appended
                {"path": "/dev/ctl", "type": "c", "major": 1, "minor": 5, "fileMode": 0o660},
                {"path": "/dev/gpu0", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666},
                {"path": "/dev/pipe", "type": "p", "major": 0, "minor": 0, "fileMode": 0o600},
                {
                    "path": "/dev/gpu1",
                    "type": "c",
                    "major": 1,
                    "minor": 7,
                    "fileMode": 384,
                    "uid": 7,
                    "gid": 8,
                },
            ],
            "resources": {
                "devices": [
                    {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rw"},
                    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
                    {"allow": True, "type": "c", "major": 1, "minor": 7, "access": ""},
                ]
            },
        },
        "hooks": {
            "createContainer": [
                {
                    "path": "/usr/bin/nri-cdi",
                    "args": ["nri-cdi", "hook", "update-ldcache", "--folder", "/usr/lib/x"],
                }
            ],
            "startContainer": [{"path": "/bin/true", "timeout": 5}],
        },
    }


def test_device_nodes_take_the_process_user_when_not_root(
    gpu_node_dir: Path, tmp_path: Path
) -> None:
    folder = write_specs(tmp_path / "cdi", {"gpu.yaml": _spec(gpu_node_dir)})
    snapshot = SpecCache([str(folder)]).refresh()
    oci = {"process": {"user": {"uid": 1000, "gid": 100}}}
    result = apply(oci, snapshot.resolve(["example.com/gpu=1", "example.com/gpu=0"]))
    owners = {d["path"]: (d.get("uid"), d.get("gid")) for d in result["linux"]["devices"]}
    assert owners == {
        "/dev/ctl": (1000, 100),
        "/dev/gpu1": (7, 8),
        "/dev/gpu0": (1000, 100),
        "/dev/pipe": (1000, 100),
    }


def test_host_type_mismatch_uses_the_reference_message(gpu_node_dir: Path, tmp_path: Path) -> None:
    folder = write_specs(
        tmp_path / "cdi",
        {
            "gpu.yaml": f"""\
        cdiVersion: 0.5.0
        kind: example.com/gpu
        devices:
        - name: blk
          containerEdits:
            deviceNodes: [{{path: /dev/b, hostPath: {gpu_node_dir}/gpu0, type: b}}]
        - name: file
          containerEdits:
            deviceNodes: [{{path: /dev/f, hostPath: {tmp_path}/cdi/gpu.yaml}}]
        """
        },
    )
    snapshot = SpecCache([str(folder)]).refresh()
    with pytest.raises(UnresolvedDevicesError) as info:
        snapshot.resolve(["example.com/gpu=blk", "example.com/gpu=file"])
    assert info.value.reasons == {
        "example.com/gpu=blk": (
            f"CDI device ('/dev/b', '{gpu_node_dir}/gpu0'), host type mismatch (b, c)"
        ),
        "example.com/gpu=file": (
            f"failed to stat CDI host device '{tmp_path}/cdi/gpu.yaml': not a device node"
        ),
    }


def test_net_devices_intel_rdt_and_gids() -> None:
    edits = merge(
        [
            ContainerEdits(intel_rdt=IntelRdt(clos_id="old"), additional_gids=(5,)),
            ContainerEdits(
                net_devices=(NetDevice(host_interface_name="eth1", name="net0"),),
                intel_rdt=IntelRdt(clos_id="gold", schemata=("L3:0=ff",), enable_monitoring=True),
                additional_gids=(5, 6),
            ),
        ]
    )
    result = apply({"process": {"user": {"uid": 0, "gid": 0, "additionalGids": [6]}}}, edits)
    assert result == {
        "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [6, 5]}},
        "linux": {
            "netDevices": {"eth1": {"name": "net0"}},
            "intelRdt": {"closID": "gold", "schemata": ["L3:0=ff"], "enableMonitoring": True},
        },
    }


def test_mount_sort_is_stable_and_by_depth() -> None:
    mounts = tuple(
        Mount(host_path=f"/h{i}", container_path=p)
        for i, p in enumerate(["/a/b/c", "/z", "/a//b/", "/a/./b/d/..", "/y"])
    )
    result = apply(
        {"mounts": [{"destination": "/y/q", "source": "s"}]}, ContainerEdits(mounts=mounts)
    )
    assert [m["destination"] for m in result["mounts"]] == [
        "/z",
        "/y",
        "/y/q",
        "/a//b/",
        "/a/./b/d/..",
        "/a/b/c",
    ]


def test_unknown_hook_type_is_an_error_and_input_untouched() -> None:
    oci: dict[str, Any] = {}
    with pytest.raises(CDIError, match="unknown hook name 'preStart'"):
        apply(oci, ContainerEdits(env=("A=1",), hooks=(Hook(hook_name="preStart", path="/bin/x"),)))
    assert oci == {}
