"""Fail-closed, acting: the one way a container that must not run without its devices is
stopped (SIGKILL by cgroup, else by pid, never through the runtime) and told why (the
kubelet's termination-message file). File and process I/O; nothing else here decides.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal

CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 hierarchies that hold every task of a container, most likely first.
_V1_CONTROLLERS = ("pids", "freezer", "memory", "cpu,cpuacct", "cpu", "devices", "systemd")


def cgroup_relpath(cgroups_path: str) -> str:
    """The cgroup folder of ``linux.cgroups_path``, relative to a hierarchy's root.

    cgroupfs drivers give a path (``/kubepods/besteffort/pod1/ID``); the systemd driver
    gives ``slice:prefix:name``, which lives in ``a.slice/a-b.slice/prefix-name.scope``.
    """
    if ":" not in cgroups_path:
        return cgroups_path.strip("/")
    slice_name, prefix, name = [*cgroups_path.split(":"), "", ""][:3]
    parts = []
    if slice_name and slice_name != "-.slice":
        words = slice_name.removesuffix(".slice").split("-")
        parts = ["-".join(words[: i + 1]) + ".slice" for i in range(len(words))]
    parts.append(f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
    return "/".join(parts)


def cgroup_dir(cgroups_path: str, root: str = CGROUP_ROOT) -> str | None:
    """The container's cgroup folder on this host (v2, else the first v1 hierarchy that
    has it), or None."""
    if not cgroups_path:
        return None
    rel = cgroup_relpath(cgroups_path)
    if os.path.exists(f"{root}/cgroup.controllers"):
        candidates = [f"{root}/{rel}"]
    else:
        candidates = [f"{root}/{c}/{rel}" for c in _V1_CONTROLLERS]
    return next((c for c in candidates if rel and os.path.isdir(c)), None)


def cgroup_has_processes(cgroups_path: str, root: str = CGROUP_ROOT) -> bool:
    """Whether the container's cgroup folder has a process now (False: no folder, or
    empty). The runtime makes it with the container's task, at its start."""
    folder = cgroup_dir(cgroups_path, root)
    if folder is None:
        return False
    try:
        with open(f"{folder}/cgroup.procs") as handle:
            return any(line.strip() for line in handle)
    except FileNotFoundError:
        return False  # removed meanwhile


def stop_processes(pid: int, cgroups_path: str, root: str = CGROUP_ROOT) -> str | None:
    """SIGKILL a container's processes without asking the runtime: its whole cgroup when
    we can see it, else its init ``pid``. How it was done, or None when there was nothing
    to signal (no cgroup folder, pid 0, already gone). Raises OSError when not allowed."""
    folder = cgroup_dir(cgroups_path, root)
    if folder is not None:
        try:
            if os.path.exists(f"{folder}/cgroup.kill"):  # cgroup v2, Linux >= 5.14
                with open(f"{folder}/cgroup.kill", "w") as handle:
                    handle.write("1")
                return f"cgroup {folder}"
            with open(f"{folder}/cgroup.procs") as handle:
                pids = [int(line) for line in handle if line.strip()]
        except FileNotFoundError:
            pids = []  # removed meanwhile
        signalled = 0
        for each in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
                signalled += 1
        if signalled:
            return f"{signalled} process(es) of {folder}"
    if pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"pid {pid}"
    return None


def write_termination_message(path: str, message: str) -> str:
    """Write ``message`` into the kubelet's termination-message file ``path`` (an existing
    regular file, never through a link); "" when done, else why not."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return "not a regular file"
        os.write(fd, message.encode()[:4096])
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return ""
