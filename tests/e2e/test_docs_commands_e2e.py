"""The quick start for a host with systemd and the troubleshooting page, run as an operator
would type them, on a simulated GPU node (tests/doc_blocks.py says how blocks are marked).

The node: a private mount namespace in which a private containerd runs and every block is
run, whose ``/usr`` and ``/etc`` are the simulated node's driver files laid over the host's
(so the driver is at ``/``, as on a host install), whose ``/dev`` and ``/proc/driver`` are the
node's, and whose ``/run`` and ``/opt`` are folders of the test: ``/var/run/nri/nri.sock`` is
that containerd's NRI socket and ``/etc/containerd/config.toml`` its configuration. Nothing
the blocks write reaches the host. ``pip`` installs from the wheels scripts/install-image-root.sh
cached (no index), and the wheel is built from a copy of the checkout.

Blocks marked for a real node are not run; where one starts the systemd units, the test
does what systemd would: it runs the installed units' ExecStart lines. The expected output
of ``nvidia-smi -L`` is checked in a container asking for ``nvidia.com/gpu=0`` through CRI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node
from tests import prerequisites
from tests.doc_blocks import Block, blocks, expected_pattern
from tests.e2e import daemonset
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.paths import REPO

PAGES = ("docs/get-started/systemd.md", "docs/operations/troubleshooting.md")
NRI_SOCKET = "/var/run/nri/nri.sock"
UNITS = "etc/systemd/system"  # under the /etc overlay's upper folder

# $1 node root, $2 the test's folder for the upper layers, $3 containerd's NRI folder,
# $4 its config; then containerd's command line.
NODE_SCRIPT = r"""set -e
node=$1 up=$2 nri=$3 config=$4; shift 4
for d in usr etc opt; do mkdir -p "$up/$d" "$up/$d-work"; done
mount -t overlay nri-cdi-usr -o "lowerdir=$node/usr:/usr,upperdir=$up/usr,workdir=$up/usr-work" /usr
mount -t overlay nri-cdi-etc -o "lowerdir=$node/etc:/etc,upperdir=$up/etc,workdir=$up/etc-work" /etc
mount -t overlay nri-cdi-opt -o "lowerdir=/opt,upperdir=$up/opt,workdir=$up/opt-work" /opt
mkdir -p "$up/run" && mount --bind "$up/run" /run
mkdir -p /run/nri && mount --bind "$nri" /run/nri
mount -t tmpfs -o mode=0755 nri-cdi-dev /dev
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  name=${d%%:*} nums=${d#*:}; mknod -m 666 /dev/$name c ${nums%%:*} ${nums#*:}
done
mkdir -p /dev/pts /dev/shm
cp -a "$node/dev/." /dev/
mount -t tmpfs -o mode=0755 nri-cdi-proc /proc/driver
for d in nvidia nvidia-caps; do
  mkdir /proc/driver/$d && mount --bind "$node/proc/driver/$d" /proc/driver/$d
done
mkdir -p /etc/containerd
sed "s#$nri/nri.sock#/var/run/nri/nri.sock#" "$config" > /etc/containerd/config.toml
exec "$@"
"""


class Node:
    """The simulated node's namespace, entered through containerd's process."""

    def __init__(self, ctrd: Containerd, node: BuiltNode, upper: Path, checkout: Path) -> None:
        self.ctrd, self.node, self.upper, self.checkout = ctrd, node, upper, checkout
        wheels = daemonset.image_cache() / "wheels"
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:"
                    "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8",
            # pip as the operator runs it, offline: the dependency wheels the image is built
            # from, and the build tools already installed (no isolated build environment)
            "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
            # the simulated libnvidia-ml finds its node's description here
            "SIMNODE_NVML_NODE": str(node.root / "simnode-nvml.txt"),
        }

    def enter(self, cwd: Path | str) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.ctrd.pid}/ns/mnt", f"--wd={cwd}", "--"]

    def run(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``script`` in the checkout's folder, as an operator at a shell would."""
        return subprocess.run([*self.enter(self.checkout), "bash", "-euo", "pipefail", "-c",
                               script], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen([*self.enter("/"), *argv], env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)

    def unit_lines(self, unit: str, key: str) -> list[str]:
        text = (self.upper / "etc" / "systemd" / "system" / unit).read_text()
        return [line.split("=", 1)[1] for line in text.splitlines()
                if line.startswith(key + "=")]


def _checkout(into: Path) -> Path:
    """The repository's files (tracked, or new and not ignored), as a clone would have them."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.fixture(scope="module")
def node(containerd: ContainerdFactory,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    missing = daemonset.missing_image_parts()
    if missing:
        prerequisites.missing("e2e tests", f"no wheels to install from: {'; '.join(missing)}")
    work = tmp_path_factory.mktemp("docs-node")
    built = build_node(work / "node", NodeLayout())
    ctrd_dir = Path(tempfile.mkdtemp(prefix="nri-cdi-docs-"))  # socket paths stay short
    wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c", NODE_SCRIPT, "sh",
               str(built.root), str(work / "upper"), str(ctrd_dir / "nri"),
               str(ctrd_dir / "config.toml")]
    ctrd = containerd(workdir=ctrd_dir, wrapper=wrapper, enable_cdi=True,
                      cdi_spec_dirs=["/etc/cdi", "/var/run/cdi"])
    checkout = _checkout(work / "checkout")
    yield Node(ctrd, built, work / "upper", checkout)


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0,
              log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log else ""
            raise TimeoutError(f"never: {what}\n{tail}")
        time.sleep(0.1)


def _play_systemd(node: Node, tmp: Path) -> subprocess.Popen[bytes]:
    """What ``systemctl enable --now`` of the quick start does, from the installed units:
    the generate service's ExecStartPre (``-``: failures ignored) and ExecStart, then the
    plugin's ExecStart, kept running."""
    for line in node.unit_lines("nri-cdi-generate.service", "ExecStartPre"):
        node.run(line.removeprefix("-"))
    for line in node.unit_lines("nri-cdi-generate.service", "ExecStart"):
        done = node.run(line)
        assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr}"
    (argv,) = [shlex.split(line) for line in node.unit_lines("nri-cdi-plugin.service",
                                                               "ExecStart")]
    log = tmp / "plugin.log"
    plugin = node.start(argv, log)
    _wait_for("the plugin connects", lambda: "connected to" in log.read_text(), log=log)
    return plugin


def _check_nvidia_smi(node: Node, block: Block) -> None:
    pattern = expected_pattern(block.text)
    with node.ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("gpu-check", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        cid = cri.run_container(pod, "cuda", BUSYBOX_IMAGE, command=["sleep", "600"])
        result = cri.exec_sync(cid, ["nvidia-smi", "-L"])
    lines = result.stdout.strip().splitlines()
    assert result.exit_code == 0 and len(lines) == 1 and pattern.match(lines[0]), (
        f"{block.where}: nvidia-smi -L printed {result.stdout!r}, expected {block.text!r}")


HOST_PATHS = ("/opt/nri-cdi", "/usr/local/bin/nri-cdi", "/etc/nri-cdi",
              "/etc/systemd/system/nri-cdi-plugin.service", "/var/run/cdi/nvidia.yaml")


def test_the_quick_start_and_troubleshooting_commands_run(node: Node, tmp_path: Path) -> None:
    host_before = {path: os.path.lexists(path) for path in HOST_PATHS}
    plugin = None
    ran: list[str] = []
    try:
        for page in PAGES:
            for block in blocks(page):
                if block.kind == "sim":
                    done = node.run(block.text)
                    assert done.returncode == 0, (
                        f"{block.where} exited {done.returncode}:\n{block.text}\n"
                        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")
                    ran.append(block.where)
                elif block.kind == "real-node" and "systemctl enable --now" in block.text:
                    plugin = _play_systemd(node, tmp_path)
                elif block.kind == "nvidia-smi":
                    assert plugin is not None, f"{block.where}: the plugin is not running"
                    _check_nvidia_smi(node, block)
                    ran.append(block.where)
    finally:
        if plugin is not None:
            plugin.terminate()
            plugin.wait(timeout=30)
    assert len(ran) >= 8, ran
    # What the blocks installed is where the pages say, inside the node, not on the host.
    assert (node.upper / "opt" / "nri-cdi" / "bin" / "nri-cdi").is_file()
    assert (node.upper / "etc" / "nri-cdi" / "config.yaml").is_file()
    assert "nvidia.com" in (node.upper / "run" / "cdi" / "nvidia.yaml").read_text()
    assert {path: os.path.lexists(path) for path in HOST_PATHS} == host_before
