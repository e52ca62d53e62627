"""Proves the e2e harness: a real containerd runs pods and containers through CRI, and its
native CDI injection works with a spec made here (the baseline the NRI plugin is compared to).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import BUSYBOX_IMAGE, DEFAULT_PATH, ImageConfig, image_from_tree
from tests.helpers import make_char_device

pytestmark = pytest.mark.e2e

CDI_KIND = "vendor.example/dev"
CDI_DEVICE = f"{CDI_KIND}=d0"
CONTAINER_DEV = "/dev/vendor-d0"
SLEEP = ["sleep", "600"]


@pytest.fixture(scope="module")
def plain(containerd: ContainerdFactory) -> Containerd:
    return containerd()


@pytest.fixture(scope="module")
def cdi_dir(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CDI spec folder with one device: a char node equal to /dev/null, plus an env var."""
    root = tmp_path_factory.mktemp("cdi")
    node = make_char_device(root / "d0")
    spec = {
        "cdiVersion": "0.5.0",
        "kind": CDI_KIND,
        "devices": [{
            "name": "d0",
            "containerEdits": {
                "deviceNodes": [{"path": CONTAINER_DEV, "hostPath": str(node), "type": "c",
                                 "major": 1, "minor": 3}],
                "env": ["VENDOR_DEV=d0"],
            },
        }],
    }
    specs = root / "specs"
    specs.mkdir()
    (specs / "vendor.json").write_text(json.dumps(spec))
    return specs


@pytest.fixture(scope="module")
def with_cdi(containerd: ContainerdFactory, cdi_dir: Path) -> Containerd:
    return containerd(enable_cdi=True, cdi_spec_dirs=[cdi_dir])


def test_runs_the_containerd_version_it_says(plain: Containerd) -> None:
    # The fixture's parameter really picks another binary, and CRI reports it.
    with plain.cri() as cri:
        reported = cri.version().runtime_version
    assert reported.lstrip("v").startswith(plain.version + "."), (plain.version, reported)


def test_pod_and_container_lifecycle(plain: Containerd) -> None:
    with plain.cri() as cri, cri.pod("smoke", annotations={"example.com/a": "1"}) as pod:
        cid = cri.run_container(pod, "sleeper", BUSYBOX_IMAGE, command=SLEEP,
                                env={"GREETING": "hello"})
        result = cri.exec_sync(cid, ["cat", "/etc/passwd"])
        assert result.exit_code == 0
        assert result.stdout.startswith("root:x:0:0:")
        assert cri.exec_sync(cid, ["sh", "-c", "echo $GREETING"]).stdout == "hello\n"
        assert cri.exec_sync(cid, ["false"]).exit_code == 1

        spec = cri.runtime_spec(cid)
        assert isinstance(spec, dict)
        assert {"process", "mounts", "linux"} <= spec.keys()
        assert "GREETING=hello" in spec["process"]["env"]
        cri.stop_container(cid)
        cri.remove_container(cid)
        assert cri.list_containers() == []


def test_a_hung_call_can_be_told(plain: Containerd) -> None:
    # What a failing test's report adds after a deadline: each process of this containerd
    # with its wait channel, and the goroutines of containerd and its shims.
    with plain.cri() as cri, cri.pod("diagnosed") as pod:
        cri.run_container(pod, "sleeper", BUSYBOX_IMAGE, command=SLEEP)
        # Started, its process may still be between runc's exec and sleep's.
        def with_sleeper() -> str:
            text = plain.processes()
            return text if "sleep 600" in text else ""

        listing = wait_until(with_sleeper, "the container's process in the listing",
                             seen=plain.processes)
        shims = [s for s in plain.shim_pids() if f"\n{s} ppid=" in f"\n{listing}"]
        dump = plain.dump_goroutines()
    lines = [line.split() for line in listing.splitlines() if line[:1].isdigit()]
    assert plain.pid in {int(line[0]) for line in lines} and shims, listing
    assert any(line[3].startswith("wchan=") and line[4:] == ["sleep", "600"]
               for line in lines), listing
    assert "goroutine 1 [" in dump, dump[-2000:]
    # containerd's dump and at least the pod's shim's.
    assert dump.count("END goroutine stack dump") >= 2, dump[-2000:]


def test_a_slow_call_is_looked_at_while_it_waits(plain: Containerd) -> None:
    # A call still waiting after slow_after: the processes are listed while it waits (at
    # its deadline containerd would kill a hung child), each shim thread with what it is in.
    plain.slow_calls.clear()
    with plain.cri(slow_after=0.5) as cri, cri.pod("slow") as pod:
        cid = cri.run_container(pod, "sleeper", BUSYBOX_IMAGE, command=SLEEP)
        assert cri.exec_sync(cid, ["sleep", "5"]).exit_code == 0
    execs = [s for s in plain.slow_calls if s.startswith("ExecSync still waiting")]
    assert execs, [s[:200] for s in plain.slow_calls]
    assert "sleep 5" in execs[0] and "    thread " in execs[0], execs[0][:3000]
    assert "goroutine 1 [" in execs[0], execs[0][-2000:]
    plain.slow_calls.clear()  # looked at: not a hang to warn of (tests/e2e/conftest.py)


def test_cleanup_removes_pods(plain: Containerd) -> None:
    with plain.cri() as cri:
        with cri.cleanup():
            pod = cri.run_pod("tracked")
            cri.run_container(pod, "c", BUSYBOX_IMAGE, command=SLEEP)
        assert cri.list_pods() == []


def test_image_from_tree(plain: Containerd, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "opt" / "app").mkdir(parents=True)
    (tree / "opt" / "app" / "marker").write_text("from the tree\n")
    config = ImageConfig(cmd=("sleep", "600"), env=(DEFAULT_PATH, "FROM_IMAGE=yes"))
    name = "localhost/nri-cdi/custom:e2e"
    plain.import_images(image_from_tree(name, tree, tmp_path / "custom.tar", config=config))
    with plain.cri() as cri, cri.pod("custom") as pod:
        cid = cri.run_container(pod, "c", name)
        out = cri.exec_sync(cid, ["sh", "-c", "cat /opt/app/marker; echo $FROM_IMAGE"])
        assert out.stdout == "from the tree\nyes\n"


def test_nri_socket_and_plugin_path(plain: Containerd) -> None:
    assert stat.S_ISSOCK(os.stat(plain.nri_socket).st_mode)
    assert plain.plugin_path.is_dir()


def test_restart_keeps_running_containers(containerd: ContainerdFactory) -> None:
    ctrd = containerd()
    with ctrd.cri() as cri:
        pod = cri.run_pod("survivor")
        cid = cri.run_container(pod, "c", BUSYBOX_IMAGE, command=SLEEP)
    shims = ctrd.shim_pids()
    ctrd.restart()
    with ctrd.cri() as cri:
        # The new daemon reconnected to the running shim rather than starting another.
        assert cri.exec_sync(cid, ["true"]).exit_code == 0
        assert ctrd.shim_pids() == shims
        cri.delete_pod(pod)


def _assert_cdi_device(cri: Any, cid: str) -> None:
    listing = cri.exec_sync(cid, ["ls", "-l", CONTAINER_DEV])
    assert listing.exit_code == 0, listing.stderr
    assert listing.stdout.startswith("c") and "1,   3" in listing.stdout
    assert cri.exec_sync(cid, ["sh", "-c", "echo $VENDOR_DEV"]).stdout == "d0\n"

    linux = cri.runtime_spec(cid)["linux"]
    assert {"path": CONTAINER_DEV, "type": "c", "major": 1, "minor": 3} in [
        {k: d.get(k) for k in ("path", "type", "major", "minor")} for d in linux["devices"]
    ]
    rule = {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
    assert rule in linux["resources"]["devices"]


def test_native_cdi_by_annotation(with_cdi: Containerd) -> None:
    with with_cdi.cri() as cri, cri.pod("cdi") as pod:
        cid = cri.run_container(pod, "gpu", BUSYBOX_IMAGE, command=SLEEP,
                                annotations={"cdi.k8s.io/test": CDI_DEVICE})
        _assert_cdi_device(cri, cid)


def test_native_cdi_by_cri_field(with_cdi: Containerd) -> None:
    with with_cdi.cri() as cri, cri.pod("cdi-field") as pod:
        if not cri.has_cdi_devices_field:
            pytest.skip("this CRI api.proto has no CDI_devices field")
        cid = cri.run_container(pod, "gpu", BUSYBOX_IMAGE, command=SLEEP,
                                cdi_devices=[CDI_DEVICE])
        _assert_cdi_device(cri, cid)


def test_native_cdi_unknown_device_fails(with_cdi: Containerd) -> None:
    import grpc

    bad = {"cdi.k8s.io/test": f"{CDI_KIND}=nope"}
    with with_cdi.cri() as cri, cri.pod("cdi-bad") as pod, \
            pytest.raises(grpc.RpcError, match="unresolvable CDI devices"):
        cri.create_container(pod, "gpu", BUSYBOX_IMAGE, command=SLEEP, annotations=bad)
