"""A private containerd 1.7 or 2.1 (CRI + NRI), the one `nri-cdi doctor --e2e` can start.

Everything lives in one temp folder: config, root, state, sockets, runc state, NRI folders and
the log. Nothing host-wide is used except /usr/sbin/runc and the kernel, and ``close()`` leaves
no process (containerd, shim, container) and no mount behind. docs/developer/private-containerd.md
says why each setting is there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from nri_cdi_testbed.node_check import paths
from nri_cdi_testbed.node_check.cri import CriClient, SlowCallWatch
from nri_cdi_testbed.node_check.images import PAUSE_IMAGE, import_image
from nri_cdi_testbed.waiting import DEFAULT_TIMEOUT, WaitTimeout, wait_until
from nri_plugin.nri.errors import NRIPluginError

MNT_DETACH = 2
# The deadline of a CRI call of ``Containerd.cri``'s client: nothing asked here should
# take more than a few seconds (the kubelet's own deadline is minutes).
CRI_TIMEOUT = 30.0


def _q(value: str | Path) -> str:
    """A TOML basic string (JSON string escaping is valid TOML for these values)."""
    return json.dumps(str(value))


class ContainerdError(NRIPluginError):
    pass


class Containerd:
    """One private containerd daemon; restartable on the same state.

    ``workdir`` (default: a new short /tmp folder) holds everything and is removed by close().
    ``nri_plugins`` maps ``NN-name`` to an executable copied into the NRI plugin_path
    (containerd launches those itself, and exits if one fails to register);
    ``nri_plugin_configs`` maps file names to text for plugin_config_path.
    ``version`` picks the containerd (a key of ``paths.RUNTIMES``): 1.7 gets a version 2
    config, 2.x a version 3 config. ``enable_cdi`` defaults to off on both (2.x's own default
    is on); ``cdi_spec_dirs`` empty means the runtime's defaults, /etc/cdi and /var/run/cdi.
    ``wrapper`` is put before containerd's command line (e.g. ``unshare`` and a script that
    prepares a private mount namespace, then execs the rest). ``drop_ins`` maps file names
    to text for conf.d/, which the config imports (``imports = ["conf.d/*.toml"]``).
    """

    def __init__(self, workdir: Path | None = None, *, enable_cdi: bool = False,
                 cdi_spec_dirs: Sequence[str | Path] = (), nri: bool = True,
                 nri_plugins: Mapping[str, str | Path] | None = None,
                 nri_plugin_configs: Mapping[str, str] | None = None,
                 sandbox_image: str = PAUSE_IMAGE, bin_dir: Path | None = None,
                 version: str = paths.DEFAULT_RUNTIME, wrapper: Sequence[str] = (),
                 drop_ins: Mapping[str, str] | None = None) -> None:
        # Short /tmp paths: unix socket paths are limited to 107 bytes.
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="nri-cdi-ctrd-"))
        # What the processes waited on when a CRI call was slow (``cri``'s watch).
        self.slow_calls: list[str] = []
        self.version = version
        self.bin_dir = bin_dir or paths.bin_dir(version)
        self.enable_cdi = enable_cdi
        self.cdi_spec_dirs = [str(d) for d in cdi_spec_dirs]
        self.nri = nri
        self.sandbox_image = sandbox_image
        self.wrapper = list(wrapper)
        self.proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._make_dirs()
        self._install_nri_plugins(nri_plugins or {}, nri_plugin_configs or {})
        self.drop_ins = dict(drop_ins or {})
        for name, text in self.drop_ins.items():
            (self.workdir / "conf.d").mkdir(exist_ok=True)
            (self.workdir / "conf.d" / name).write_text(text)
        self.config_path.write_text(self.render_config())

    # --- layout -------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The containerd gRPC socket, which also serves CRI."""
        return str(self.workdir / "run" / "containerd.sock")

    @property
    def nri_socket(self) -> str:
        """Where external NRI plugins connect."""
        return str(self.workdir / "nri" / "nri.sock")

    @property
    def plugin_path(self) -> Path:
        """NRI plugin_path: executables named NN-name that containerd launches itself."""
        return self.workdir / "nri" / "plugins"

    @property
    def plugin_config_path(self) -> Path:
        return self.workdir / "nri" / "conf.d"

    @property
    def runc_root(self) -> Path:
        return self.workdir / "runc"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.toml"

    @property
    def log_path(self) -> Path:
        return self.workdir / "containerd.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _make_dirs(self) -> None:
        for sub in ("root", "state", "run", "runc", "cni/bin", "cni/conf", "nri/plugins",
                    "nri/conf.d"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)

    def _install_nri_plugins(self, plugins: Mapping[str, str | Path],
                             configs: Mapping[str, str]) -> None:
        for name, exe in plugins.items():
            target = self.plugin_path / name
            shutil.copy2(exe, target)
            target.chmod(0o755)
        for name, text in configs.items():
            (self.plugin_config_path / name).write_text(text)

    @property
    def major(self) -> int:
        """The containerd major version (1 or 2)."""
        return int(self.version.split(".")[0])

    def render_config(self) -> str:
        # imports first: a key after a table header belongs to that table.
        imports = 'imports = ["conf.d/*.toml"]\n' if self.drop_ins else ""
        return imports + (self._render_v3() if self.major >= 2 else self._render_v2())

    def _nri_section(self) -> list[str]:
        return [
            '[plugins."io.containerd.nri.v1.nri"]',
            f"  disable = {str(not self.nri).lower()}",
            "  disable_connections = false",
            f"  socket_path = {_q(self.nri_socket)}",
            f"  plugin_path = {_q(self.plugin_path)}",
            f"  plugin_config_path = {_q(self.plugin_config_path)}",
            '  plugin_registration_timeout = "5s"',
            '  plugin_request_timeout = "2s"',
        ]

    def _runc_section(self, runc: str) -> list[str]:
        return [
            f"[{runc}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runc}.options]",
            # bookworm's runc (the .debs' own needs a newer glibc); private Root keeps runc
            # state out of the host-wide /run/containerd/runc.
            f"  BinaryName = {_q(paths.RUNC)}",
            f"  Root = {_q(self.runc_root)}",
            "  SystemdCgroup = false",
        ]

    def _cdi_lines(self) -> list[str]:
        return [
            f"  enable_cdi = {str(self.enable_cdi).lower()}",
            # Without a list containerd uses its defaults, /etc/cdi and /var/run/cdi.
            *([f"  cdi_spec_dirs = {json.dumps(self.cdi_spec_dirs)}"] if self.cdi_spec_dirs
              else []),
        ]

    def _render_v3(self) -> str:
        """containerd 2.x: CRI is split into cri.v1.images (the pinned sandbox image) and
        cri.v1.runtime (runtimes, CNI, CDI, OOM); grpc.v1.cri keeps only the stream server."""
        d = self.workdir
        rt = 'plugins."io.containerd.cri.v1.runtime"'
        lines = [
            "version = 3",
            f"root = {_q(d / 'root')}",
            f"state = {_q(d / 'state')}",
            "[grpc]", f"  address = {_q(self.address)}",
            "[ttrpc]", f"  address = {_q(d / 'run' / 'containerd.sock.ttrpc')}",
            '[plugins."io.containerd.cri.v1.images".pinned_images]',
            f"  sandbox = {_q(self.sandbox_image)}",
            f"[{rt}]",
            # No CAP_SYS_RESOURCE here: the pause container's oom_score_adj=-998 would fail.
            "  restrict_oom_score_adj = true",
            *self._cdi_lines(),
            f"[{rt}.cni]",
            f"  bin_dirs = [{_q(d / 'cni' / 'bin')}]",
            f"  conf_dir = {_q(d / 'cni' / 'conf')}",
            f"[{rt}.containerd]",
            '  default_runtime_name = "runc"',
            *self._runc_section(f"{rt}.containerd.runtimes.runc"),
            # 2.x's opt plugin would otherwise create /opt/containerd on the host.
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_q(d / 'opt')}",
            *self._nri_section(),
        ]
        return "\n".join(lines) + "\n"

    def _render_v2(self) -> str:
        d = self.workdir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runc = f"{cri}.containerd.runtimes.runc"
        lines = [
            "version = 2",
            f"root = {_q(d / 'root')}",
            f"state = {_q(d / 'state')}",
            "[grpc]", f"  address = {_q(self.address)}",
            "[ttrpc]", f"  address = {_q(d / 'run' / 'containerd.sock.ttrpc')}",
            f"[{cri}]",
            f"  sandbox_image = {_q(self.sandbox_image)}",
            # No CAP_SYS_RESOURCE here: the pause container's oom_score_adj=-998 would fail.
            "  restrict_oom_score_adj = true",
            *self._cdi_lines(),
            f"[{cri}.cni]",
            f"  bin_dir = {_q(d / 'cni' / 'bin')}",
            f"  conf_dir = {_q(d / 'cni' / 'conf')}",
            f"[{cri}.containerd]",
            '  default_runtime_name = "runc"',
            *self._runc_section(runc),
            *self._nri_section(),
        ]
        return "\n".join(lines) + "\n"

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = DEFAULT_TIMEOUT) -> Containerd:
        """Start the daemon and wait until CRI answers. Returns self."""
        if self.running:
            raise ContainerdError("containerd is already running")
        if self._closed:
            raise ContainerdError("this Containerd was closed")
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        # The shim is found through PATH; start_new_session = setsid, so a Ctrl-C in the
        # terminal does not hit containerd before its owner stops it.
        with self.log_path.open("ab") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*self.wrapper, str(self.bin_dir / "containerd"), "--config",
                 str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )
        atexit.register(self.close)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Until the socket is there and CRI answers on it, or containerd exits; a failure
        closes this containerd and says what was awaited, with the log's tail."""
        deadline = time.monotonic() + timeout

        def socket_or_exit() -> bool:
            self._check_alive()
            return os.path.exists(self.address)

        try:
            wait_until(socket_or_exit, f"containerd's socket {self.address}", timeout=timeout,
                       seen=lambda: "no socket yet")
            with CriClient(self.address) as client:
                client.wait_ready(max(1.0, deadline - time.monotonic()))
        except ContainerdError:
            raise  # it exited: already closed, with its log's tail
        except WaitTimeout as exc:
            self._fail(str(exc))
        except Exception as exc:
            self._fail(f"CRI not ready: {exc}")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self._fail(f"containerd exited with status {self.proc.returncode}")

    def _fail(self, why: str) -> None:
        tail = self.log_tail()  # read before close() removes the folder
        self.close()
        raise ContainerdError(f"{why}\n--- containerd log (tail) ---\n{tail}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop_daemon(self, timeout: float = 10.0) -> None:
        """Stop only containerd (TERM, then KILL); shims and containers keep running."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, timeout: float = DEFAULT_TIMEOUT) -> Containerd:
        """Stop and start the daemon on the same state: pods and containers survive, and
        NRI plugins must reconnect."""
        self.stop_daemon()
        return self.start(timeout)

    def kill_daemon(self) -> None:
        """SIGKILL containerd (a crash); shims and containers keep running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Stop containerd, then every container, shim and mount it left behind."""
        self.stop_daemon()
        self._delete_runc_containers()
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._unmount_all()

    def close(self) -> None:
        """stop() and remove the temp folder. Safe to call more than once."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        atexit.unregister(self.close)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Containerd:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- leftovers ----------------------------------------------------------------------------

    def shim_pids(self) -> list[int]:
        """Pids of containerd-shim-runc-v2 processes serving this containerd."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"containerd-shim" in argv[0] and self.address.encode() in argv:
                found.append(int(entry.name))
        return found

    def processes(self) -> str:
        """This containerd's processes (it, its shims and theirs: runc, containers), one
        line each with state and kernel wait channel, and the kernel stack of any in
        uninterruptible sleep or named runc: what a hung call waits on."""
        stats: dict[int, str] = {}  # pid -> /proc/PID/stat, read once
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    stats[int(entry.name)] = (entry / "stat").read_text()
        # After the "(name)" field, which may hold spaces: state, then the parent's pid.
        fields = {pid: stat[stat.rindex(")") + 2:].split() for pid, stat in stats.items()}
        ours = {p for p in (self.pid, *self.shim_pids()) if p is not None}
        more = ours
        while more:
            more = {pid for pid, f in fields.items() if int(f[1]) in more} - ours
            ours |= more
        lines = []
        for pid in sorted(ours & fields.keys()):
            proc = Path(f"/proc/{pid}")
            try:
                argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()
                wchan = (proc / "wchan").read_text()
            except OSError:
                continue  # gone meanwhile
            state, ppid = fields[pid][:2]
            # No command line yet (a process being exec'd) or any more: its name, as ps.
            stat = stats[pid]
            shown = argv or f"[{stat[stat.index('(') + 1:stat.rindex(')')]}]"
            lines.append(f"{pid} ppid={ppid} {state} wchan={wchan or '-'} {shown[:200]}")
            program = os.path.basename(argv.split(" ", 1)[0])
            if state == "D" or program == "runc":
                with contextlib.suppress(OSError):
                    lines += ["    " + line for line in
                              (proc / "stack").read_text().splitlines()]
            if program.startswith("containerd-shim"):
                lines += thread_waits(pid)  # a Go process waits in one of its threads
        return "\n".join(lines) or "(none running)"

    def _record_slow_call(self, method: str) -> None:
        # On the watch's timer thread, while the call still waits.
        now = time.strftime("%H:%M:%S")
        self.slow_calls.append(f"{method} still waiting at {now}\n{self.processes()}\n"
                               f"--- goroutines ---\n{self.dump_goroutines()}")

    def dump_goroutines(self, timeout: float = 5.0) -> str:
        """Ask containerd and its shims for their goroutine stacks (SIGUSR1, which both
        answer in containerd's log) and return what the log got, once every dump is there
        (bounded; a process that does not answer: what the log has by then)."""
        if self.proc is None or self.proc.poll() is not None:
            return "(containerd is not running)"
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        asked = 0
        for pid in (self.proc.pid, *self.shim_pids()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
                asked += 1

        def logged() -> str:
            with self.log_path.open("rb") as log:
                log.seek(start)
                return log.read().decode(errors="replace")

        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: logged().count("END goroutine stack dump") >= asked,
                       "the goroutine dumps in containerd's log", timeout=timeout)
        return logged().replace("\\n", "\n").replace("\\t", "\t")

    def _delete_runc_containers(self) -> None:
        # The shim passes Root/<namespace> to runc; delete --force kills what is still running.
        for ns_root in self.runc_root.iterdir() if self.runc_root.exists() else ():
            listed = subprocess.run([str(paths.RUNC), "--root", str(ns_root), "list", "-q"],
                                    capture_output=True, text=True, check=False)
            for cid in listed.stdout.split():
                subprocess.run([str(paths.RUNC), "--root", str(ns_root), "delete", "--force",
                                cid], capture_output=True, check=False)

    def mounts(self) -> list[str]:
        """Mount points under this containerd's folder (rootfs overlays, pod shm)."""
        prefix = str(self.workdir) + "/"
        found = []
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                point = line.split()[4].encode().decode("unicode_escape")
                if point.startswith(prefix):
                    found.append(point)
        return found

    def _unmount_all(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        # Deepest first, so that nested mounts do not keep their parents busy.
        for point in sorted(self.mounts(), key=len, reverse=True):
            libc.umount2(point.encode(), MNT_DETACH)

    # --- helpers ------------------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def ctr(self, *args: str, namespace: str = "k8s.io",
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "-a", self.address, "-n", namespace, *args],
            capture_output=True, text=True, check=check, timeout=60,
        )

    def import_images(self, *archives: Path) -> None:
        for archive in archives:
            import_image(archive, self.address, ctr=self.bin_dir / "ctr")

    @contextlib.contextmanager
    def cri(self, timeout: float = CRI_TIMEOUT,
            slow_after: float | None = None) -> Iterator[CriClient]:
        """A CriClient on this containerd, connected and answering (a first connect that
        is slow is waited out, with a bound), closed on exit. A call still waiting after
        ``slow_after`` (default: two thirds of ``timeout``) leaves what the processes wait
        on in ``slow_calls``."""
        watch = SlowCallWatch(timeout * 2 / 3 if slow_after is None else slow_after,
                              self._record_slow_call)
        with CriClient(self.address, timeout, watch=watch) as client:
            client.wait_ready()
            yield client


# Names of the system calls a Go process's thread waits in (x86-64, aarch64); a read or
# write also says what its file descriptor is.
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 35: "nanosleep", 61: "wait4", 202: "futex",
               230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 281: "epoll_pwait"},
    "aarch64": {22: "epoll_pwait", 63: "read", 64: "write", 95: "waitid", 98: "futex",
                101: "nanosleep", 115: "clock_nanosleep", 260: "wait4"},
}


def thread_waits(pid: int) -> list[str]:
    """One line per thread of ``pid``: state, kernel wait channel and the system call it is
    in; for a read or write, what its file descriptor is and, for a pipe, which other
    processes hold that pipe (a writer that never closes keeps a reader waiting)."""
    names = _SYSCALLS.get(os.uname().machine, {})
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("[0-9]*"), key=lambda t: int(t.name)):
        try:
            status = (task / "status").read_text()
            wchan = (task / "wchan").read_text() or "-"
            call = (task / "syscall").read_text().split()
        except OSError:
            continue
        state = next((line.split()[1] for line in status.splitlines()
                      if line.startswith("State:")), "?")
        number = int(call[0]) if call and call[0].isdigit() else None
        what = names.get(number, call[0]) if number is not None else " ".join(call[:1])
        if what in ("read", "write") and len(call) > 1:
            fd = int(call[1], 16)
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                target = "?"
            what = f"{what}(fd {fd}: {target})"
            if target.startswith("pipe:"):
                others = [h for h in _holders(target) if h[0] != pid]
                what += "; also held by " + (", ".join(
                    f"{p} {argv[:80]}" for p, argv in others) or "nobody")
        lines.append(f"    thread {task.name} {state} wchan={wchan} in {what}")
    return lines


def _holders(target: str) -> list[tuple[int, str]]:
    """The processes with a file descriptor on ``target`` (e.g. ``pipe:[1234]``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(_link(fd) == target for fd in (entry / "fd").iterdir()):
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                found.append((int(entry.name), " ".join(argv.decode(errors="replace").split())))
    return found


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile (the listing's own descriptor, for one)
        return ""
