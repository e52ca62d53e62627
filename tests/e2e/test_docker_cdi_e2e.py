"""Docker as a third CDI consumer: Debian sid's docker.io 28.5 (scripts/install-nvidia-debian.sh
unpacks it under .cache/, nothing system-wide), a private dockerd on the private containerd
2.1 (its own data-root, exec-root, pidfile and socket; no iptables, no bridge), reading the
spec generated for NVIDIA's real Debian driver (tests/nvidia_debian.py) from its
``--cdi-spec-dir``.  ``docker run --device nvidia.com/gpu=0`` in both link modes, every case
a test of its own.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import require_prerequisites
from tests.e2e.containerd import Containerd
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.test_real_driver_e2e import (
    GLIBC_LIBS,
    PROBE_C,
    SMI_MESSAGE,
    _paths_the_spec_makes,
)
from tests.helpers import generate_link_modes
from tests.hooks.conftest import _cc, host_loader
from tests.nvidia_debian import docker_root, driver_root, kernel_side

IMAGE = "localhost/gpu/debian-real-docker:e2e"
MODES = ("hooks", "mounts")
START_TIMEOUT = 120.0


def docker_archive(oci_archive: Path, name: str) -> Path:
    """The OCI archive with the ``manifest.json`` docker's loader reads (its graph-driver
    store loads docker archives, which list the config and layer files by path)."""
    with tarfile.open(oci_archive) as tar:
        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return member.read()

        members = {m.name: (m, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                   for m in tar.getmembers()}
        index = json.loads(members["index.json"][1])
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
    entry = [{"Config": f"blobs/sha256/{manifest['config']['digest'].split(':', 1)[1]}",
              "RepoTags": [name],
              "Layers": [f"blobs/sha256/{layer['digest'].split(':', 1)[1]}"
                         for layer in manifest["layers"]]}]
    out = oci_archive.with_suffix(".docker.tar")
    with tarfile.open(out, "w") as tar:
        for member, data in members.values():
            tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
        data = json.dumps(entry).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return out


class Dockerd:
    """A private dockerd on ``ctrd``; ``docker(...)`` runs the CLI against it."""

    def __init__(self, ctrd: Containerd, spec_dir: Path, work: Path) -> None:
        self.work = work
        self.socket = work / "docker.sock"
        root = docker_root()
        self.cli = root / "usr/bin/docker"
        self.env = {**os.environ, "PATH": f"{ctrd.bin_dir}:{root}/usr/bin:{root}/usr/sbin:"
                    f"{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
                    "DOCKER_CONFIG": str(work / "cli")}
        self.log = work / "dockerd.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(root / "usr/sbin/dockerd"), f"--containerd={ctrd.address}",
                 f"--data-root={work / 'data'}", f"--exec-root={work / 'exec'}",
                 f"--pidfile={work / 'dockerd.pid'}", f"--host=unix://{self.socket}",
                 "--iptables=false", "--ip6tables=false", "--bridge=none",
                 f"--cdi-spec-dir={spec_dir}", "--storage-driver=vfs"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while self.docker("info", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"dockerd did not answer: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def docker(self, *args: str, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.cli), "-H", f"unix://{self.socket}", *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()}")
        return done

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def docker_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    require_prerequisites()
    root = driver_root()
    docker_root()
    out = tmp_path_factory.mktemp("docker")
    kernel = kernel_side(out / "kernel")
    generate_link_modes(out, root, kernel.dev_root, modes=MODES)
    _cc(["-o", str(out / "probe")], PROBE_C)
    tree = out / "tree"
    ld, _ = host_loader()
    (tree / "lib64").mkdir(parents=True)
    shutil.copy2(ld, tree / "lib64" / "ld-linux-x86-64.so.2")
    (tree / "lib/x86_64-linux-gnu").mkdir(parents=True)
    for name in GLIBC_LIBS:
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"),
                     tree / "lib/x86_64-linux-gnu" / name)
    shutil.copy2(out / "probe", tree / "probe")
    archive = docker_archive(image_from_tree(
        IMAGE, tree, out / "image.tar",
        config=ImageConfig(cmd=("sleep", "600"), env=(DEFAULT_PATH,))), IMAGE)
    ctrd = Containerd(version="2.1").start()
    daemons: list[Dockerd] = []
    try:
        world: dict[str, object] = {"out": out, "kernel": kernel, "ctrd": ctrd}
        for mode in MODES:
            # Short socket paths: a unix socket path has at most 107 bytes.
            work = Path(f"/tmp/nri-cdi-docker-{mode}-{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            daemon = Dockerd(ctrd, out / mode, work)
            daemons.append(daemon)
            daemon.docker("load", "-i", str(archive))
            cid = daemon.docker("run", "-d", "--network=none", "--device", "nvidia.com/gpu=0",
                                IMAGE, "sleep", "600").stdout.strip()
            world[mode] = (daemon, cid)
        yield world
    finally:
        for daemon in daemons:
            daemon.docker("rm", "-f", "-v", *[c for c in daemon.docker(
                "ps", "-aq", check=False).stdout.split()], check=False)
            daemon.close()
            shutil.rmtree(daemon.work, ignore_errors=True)
        ctrd.close()


def _exec(world: dict[str, object], mode: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    daemon, cid = world[mode]  # type: ignore[misc]
    return daemon.docker("exec", cid, *cmd, check=False)


@pytest.mark.parametrize("mode", MODES)
def test_gpu_nodes(docker_world: dict[str, object], mode: str) -> None:
    done = _exec(docker_world, mode, "sh", "-c", "ls /dev | grep nvidia | sort | tr '\\n' ' '")
    assert done.stdout.split() == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
                                   "nvidia0", "nvidiactl"]


@pytest.mark.parametrize("mode", MODES)
def test_drm_nodes_and_by_path(docker_world: dict[str, object], mode: str) -> None:
    done = _exec(docker_world, mode, "sh", "-c",
                 "for p in /dev/dri/card0 /dev/dri/renderD128 /dev/dri/by-path/*; do "
                 "[ -c \"$p\" ] && echo \"$p\"; done")
    names = done.stdout.split()
    assert names[:2] == ["/dev/dri/card0", "/dev/dri/renderD128"]
    # The by-path names, how applications pick a GPU by PCI address: links made by the
    # hook in hooks mode, the nodes themselves mounted at those names in mounts mode.
    assert sorted(n.rsplit("-", 1)[1] for n in names[2:]) == ["card", "render"], names


@pytest.mark.parametrize("mode", MODES)
def test_device_cgroup_lets_the_gpu_open(docker_world: dict[str, object], mode: str) -> None:
    # The node has no kernel driver behind it: the open fails with ENXIO, not with the
    # EPERM of a device cgroup that was not widened.
    done = _exec(docker_world, mode, "sh", "-c", "cat /dev/nvidia0")
    assert "No such device" in done.stderr, done.stderr
    # Opened for writing through its by-path name, a DRM node passes the same rule (a
    # mount in mounts mode: neither read-only nor nodev).
    done = _exec(docker_world, mode, "sh", "-c", ': > "$(echo /dev/dri/by-path/*-render)"')
    assert "No such device" in done.stderr, done.stderr
    # One device-cgroup rule per node, as the runtime was given them: the by-path names
    # bring none of their own.
    ctrd, (_, cid) = docker_world["ctrd"], docker_world[mode]
    assert isinstance(ctrd, Containerd)
    config = json.loads((ctrd.workdir / "state/io.containerd.runtime.v2.task/moby" / cid
                         / "config.json").read_text())
    rules = [(r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"]
             if r.get("allow") and r.get("type") == "c" and r.get("major") is not None
             and r.get("minor") is not None]
    nodes = {(d["major"], d["minor"]) for d in config["linux"]["devices"]}
    assert sorted(r for r in rules if r in nodes) == sorted(nodes), rules


@pytest.mark.parametrize("mode", MODES)
def test_real_libcuda_loads(docker_world: dict[str, object], mode: str) -> None:
    done = _exec(docker_world, mode, "/probe")
    assert (done.returncode, done.stdout.strip()) == (0, "cuInit=100"), done


@pytest.mark.parametrize("mode", MODES)
def test_real_nvidia_smi_reaches_its_driver_message(
        docker_world: dict[str, object], mode: str) -> None:
    done = _exec(docker_world, mode, "/usr/bin/nvidia-smi")
    assert done.returncode == 9 and SMI_MESSAGE in done.stdout + done.stderr, done


@pytest.mark.parametrize("mode", MODES)
def test_no_path_of_the_spec_is_missing_or_dangles(
        docker_world: dict[str, object], mode: str) -> None:
    out = docker_world["out"]
    assert isinstance(out, Path)
    paths = _paths_the_spec_makes(out / mode / "nvidia.yaml")
    script = ('for p in "$@"; do [ -e "$p" ] && continue; '
              '[ -L "$p" ] && echo "dangling: $p" || echo "missing: $p"; done')
    done = _exec(docker_world, mode, "sh", "-c", script, "sh", *paths)
    assert done.returncode == 0 and done.stdout == "", done.stdout


@pytest.mark.parametrize("mode", MODES)
def test_spec_env(docker_world: dict[str, object], mode: str) -> None:
    # In the container's own process: docker exec starts from docker's record of the
    # container's env, which CDI's edits (made to the OCI spec) never reach.
    done = _exec(docker_world, mode, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ")
    assert "NVIDIA_VISIBLE_DEVICES=void" in done.stdout.split(), done.stdout


@pytest.mark.parametrize("mode", MODES)
def test_all_device_and_unknown_device(docker_world: dict[str, object], mode: str) -> None:
    daemon, _ = docker_world[mode]  # type: ignore[misc]
    assert isinstance(daemon, Dockerd)
    ok = daemon.docker("run", "--rm", "--network=none", "--device", "nvidia.com/gpu=all",
                       IMAGE, "/probe", check=False)
    assert ok.stdout.strip() == "cuInit=100", ok.stderr
    bad = daemon.docker("run", "--rm", "--network=none", "--device", "nvidia.com/gpu=7",
                        IMAGE, "true", check=False)
    assert bad.returncode != 0 and "nvidia.com/gpu=7" in bad.stderr, bad.stderr
