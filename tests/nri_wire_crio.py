"""A private CRI-O for the NRI wire recordings and the CRI-O checks (test-only; CRI-O itself
is built from source outside the repository: docs/developer/nri-wire.md).

Everything lives in one temp folder: config, storage (vfs), run state, sockets, runc state,
NRI folders and the log. CRI-O runs with ``--config`` of ours and an empty ``--config-dir``
(so that no host drop-in applies), cgroupfs, bookworm's conmon and runc, NRI on with a
private socket, its own CDI reading the folders it is given, and no CNI (host-network
pods only). Images are loaded into its storage with CRI-O's ``copyimg`` test tool.

Two things this machine needs that a node does not: runc is called through a wrapper that
raises a container's ``oomScoreAdj`` to our own (this VM lacks CAP_SYS_RESOURCE and
CRI-O gives the pause container -998, with no setting like containerd's
``restrict_oom_score_adj``); and the signature policy accepts anything (the images are
local archives).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nri_cdi_testbed.node_check.cri import CriClient
from nri_cdi_testbed.node_check.images import PAUSE_IMAGE
from nri_cdi_testbed.node_check.paths import RUNC
from nri_cdi_testbed.waiting import wait_until

# CRI-O's binaries (crio, pinns, copyimg): $NRI_CDI_CRIO, else where the build notes put them.
BIN_ENV = "NRI_CDI_CRIO"
DEFAULT_BIN = Path("/opt/builds/crio-1.35.6/bin")
CONMON = Path("/usr/bin/conmon")
_WRAPPER = """#!{python}
# runc with each created container's oomScoreAdj raised to this process's own (the VM
# lacks CAP_SYS_RESOURCE to lower it), and hugepage limits left out where no hugetlb
# controller is mounted. Everything else goes to runc unchanged.
import json, os, sys
args = sys.argv[1:]
if "create" in args and "--bundle" in args:
    bundle = args[args.index("--bundle") + 1]
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    own = int(open("/proc/self/oom_score_adj").read())
    process = spec.get("process") or {{}}
    changed = process.get("oomScoreAdj", own) < own
    if changed:
        process["oomScoreAdj"] = own
    # a kubelet's pods carry hugepage limits, which runc cannot set on a cgroup v1 machine
    # without the hugetlb controller
    resources = (spec.get("linux") or {{}}).get("resources") or {{}}
    if resources.get("hugepageLimits") and not os.path.isdir("/sys/fs/cgroup/hugetlb") \
            and not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        del resources["hugepageLimits"]
        changed = True
    if changed:
        with open(path, "w") as f:
            json.dump(spec, f)
os.execv({runc!r}, [{runc!r}, *args])
"""


class KubeletLikeCri(CriClient):
    """The e2e CRI client, naming each container's image as the kubelet does
    (``user_specified_image``, which CRI-O's signature check requires)."""

    def container_config(self, name: str, image: str, **kwargs: Any) -> Any:
        config = super().container_config(name, image, **kwargs)
        config.image.user_specified_image = image
        return config


def bin_dir() -> Path:
    return Path(os.environ.get(BIN_ENV) or DEFAULT_BIN)


def _q(value: str | Path) -> str:
    return json.dumps(str(value))


class Crio:
    """One private CRI-O daemon. ``cdi_spec_dirs``: the folders its own CDI reads;
    ``nri``: NRI on; ``drop_ins``: file name -> text for its --config-dir."""

    def __init__(self, *, cdi_spec_dirs: Sequence[str | Path] = (), nri: bool = True,
                 bin_path: Path | None = None, workdir: Path | None = None,
                 drop_ins: dict[str, str] | None = None,
                 request_timeout: str = "2s") -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="nri-cdi-crio-"))
        self.bin = bin_path or bin_dir()
        self.cdi_spec_dirs = [str(d) for d in cdi_spec_dirs]
        self.nri = nri
        self.request_timeout = request_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        for sub in ("root", "runroot", "logs", "run", "runc", "ns", "exits", "attach",
                    "cni/net.d", "cni/bin", "nri/plugins", "nri/conf.d", "conf.d", "hooks"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        for name, text in (drop_ins or {}).items():
            (self.workdir / "conf.d" / name).write_text(text)
        (self.workdir / "policy.json").write_text(
            '{"default": [{"type": "insecureAcceptAnything"}]}\n')
        wrapper = self.workdir / "runc-wrapper"
        wrapper.write_text(_WRAPPER.format(python=sys.executable, runc=str(RUNC)))
        wrapper.chmod(0o755)
        self.config_path.write_text(self.render_config())

    @property
    def address(self) -> str:
        return str(self.workdir / "run" / "crio.sock")

    @property
    def nri_socket(self) -> str:
        return str(self.workdir / "nri" / "nri.sock")

    @property
    def config_path(self) -> Path:
        return self.workdir / "crio.conf"

    @property
    def config_dir(self) -> Path:
        return self.workdir / "conf.d"

    @property
    def log_path(self) -> Path:
        return self.workdir / "crio.log"

    def render_config(self) -> str:
        w = self.workdir
        lines = [
            "[crio]",
            f"root = {_q(w / 'root')}",
            f"runroot = {_q(w / 'runroot')}",
            'storage_driver = "vfs"',
            f"log_dir = {_q(w / 'logs')}",
            f"version_file = {_q(w / 'run' / 'version')}",
            f"version_file_persist = {_q(w / 'version')}",
            f"clean_shutdown_file = {_q(w / 'clean.shutdown')}",
            "[crio.api]",
            f"listen = {_q(self.address)}",
            "[crio.runtime]",
            'cgroup_manager = "cgroupfs"',
            'default_runtime = "runc"',
            f"namespaces_dir = {_q(w / 'ns')}",
            f"pinns_path = {_q(self.bin / 'pinns')}",
            f"container_exits_dir = {_q(w / 'exits')}",
            f"container_attach_socket_dir = {_q(w / 'attach')}",
            f"hooks_dir = [{_q(w / 'hooks')}]",
            f"cdi_spec_dirs = {json.dumps(self.cdi_spec_dirs)}",
            "[crio.runtime.runtimes.runc]",
            f"runtime_path = {_q(w / 'runc-wrapper')}",
            f"runtime_root = {_q(w / 'runc')}",
            'runtime_type = "oci"',
            f"monitor_path = {_q(CONMON)}",
            'monitor_cgroup = "pod"',
            "[crio.image]",
            f"pause_image = {_q(PAUSE_IMAGE)}",
            # our pause image: its entrypoint (a shell loop), not /pause
            'pause_command = ""',
            f"signature_policy = {_q(w / 'policy.json')}",
            # both default to folders under /etc/crio, which CRI-O would create
            f"signature_policy_dir = {_q(w / 'policies')}",
            f"namespaced_auth_dir = {_q(w / 'auth')}",
            "[crio.network]",
            f"network_dir = {_q(w / 'cni' / 'net.d')}",
            f"plugin_dirs = [{_q(w / 'cni' / 'bin')}]",
            "[crio.metrics]",
            "enable_metrics = false",
            "[crio.nri]",
            f"enable_nri = {str(self.nri).lower()}",
            f"nri_listen = {_q(self.nri_socket)}",
            f"nri_plugin_dir = {_q(w / 'nri' / 'plugins')}",
            f"nri_plugin_config_dir = {_q(w / 'nri' / 'conf.d')}",
            'nri_plugin_registration_timeout = "5s"',
            f"nri_plugin_request_timeout = {_q(self.request_timeout)}",
        ]
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        return [str(self.bin / "crio"), "--config", str(self.config_path),
                "--config-dir", str(self.config_dir), "--log-level", "info"]

    def start(self, timeout: float = 60.0) -> Crio:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"crio exited ({self.proc.returncode}):\n"
                                   f"{self.log_tail()}")
            if not os.path.exists(self.address):
                return False
            with contextlib.suppress(Exception), CriClient(self.address, 5) as cri:
                cri.version()
                return True
            return False

        wait_until(ready, "CRI-O to answer CRI", timeout=timeout, seen=self.log_tail)
        return self

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def import_image(self, archive: Path, name: str) -> None:
        w = self.workdir
        subprocess.run([str(self.bin / "copyimg"), "--root", str(w / "root"),
                        "--runroot", str(w / "runroot"), "--storage-driver", "vfs",
                        "--signature-policy", str(w / "policy.json"),
                        "--import-from", f"oci-archive:{archive}", "--image-name", name],
                       check=True, capture_output=True)

    @contextlib.contextmanager
    def cri(self, timeout: float = 60.0) -> Iterator[CriClient]:
        with KubeletLikeCri(self.address, timeout) as client:
            yield client

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop CRI-O and every conmon and container of its own, then remove the folder."""
        self.stop()
        self._kill_leftovers()
        for line in Path("/proc/self/mountinfo").read_text().splitlines()[::-1]:
            point = line.split()[4]
            if point.startswith(str(self.workdir)):
                subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        mine = str(self.workdir)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if mine in cmdline and int(name) != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(int(name), signal.SIGKILL)
        root = str(self.workdir / "runc")
        listed = subprocess.run([str(RUNC), "--root", root, "list", "-q"],
                                capture_output=True, text=True)
        for cid in listed.stdout.split():
            subprocess.run([str(RUNC), "--root", root, "delete", "-f", cid],
                           capture_output=True)
