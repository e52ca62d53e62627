"""``nri-cdi system create-device-nodes`` and ``create-dev-char-symlinks``.

The NVIDIA kernel modules create no ``/dev`` nodes; ``nvidia-modprobe`` does, on first use,
so a node where nothing ran CUDA since boot may lack ``/dev/nvidia-uvm`` and
``/dev/nvidiactl``. As ``nvidia-ctk system create-device-nodes --control-devices``, the
first command makes the four control nodes with the majors the running modules registered
in ``/proc/devices`` (mode 0666), replacing one with stale numbers atomically. The second
makes the ``/dev/char/MAJOR:MINOR`` links (relative) that udev makes for the nodes it
knows but not for these: systemd's device cgroup rules look nodes up there.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The control nodes' numbers: name -> (/proc/devices names of its major, in preference
# order; minor). Their paths, for the spec: cdi.nvidia.driver.CONTROL_NODE_PATHS.
CONTROL_NODE_NUMBERS: dict[str, tuple[tuple[str, ...], int]] = {
    "nvidiactl": (("nvidia-frontend", "nvidia"), 255),
    "nvidia-modeset": (("nvidia-frontend", "nvidia"), 254),
    "nvidia-uvm": (("nvidia-uvm",), 0),
    "nvidia-uvm-tools": (("nvidia-uvm",), 1),
}
_BLOCKED = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")
_MAX_PROC_DEVICES = 1 << 20


def char_majors(text: str) -> dict[str, int]:
    """Names of the character devices in ``/proc/devices`` text, with their majors."""
    majors: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        if line.endswith("devices:"):
            section = line.split()[0]
            continue
        fields = line.split()
        if section == "Character" and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def control_node_plan(majors: dict[str, int]) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(name, major, minor) for each control node whose module is loaded, and a line for
    each that is not."""
    plan, missing = [], []
    for name, (modules, minor) in CONTROL_NODE_NUMBERS.items():
        major = next((majors[m] for m in modules if m in majors), None)
        if major is None:
            missing.append(f"/dev/{name}: no {' or '.join(modules)} major in /proc/devices "
                           "(module not loaded)")
        else:
            plan.append((name, major, minor))
    return plan, missing


def create_device_nodes(dev_root: Path, majors: dict[str, int], *, dry_run: bool = False
                        ) -> list[str]:
    """What was done (or would be): a line for each node made, replaced or skipped."""
    plan, missing = control_node_plan(majors)
    said = [f"skipped {m.replace(': ', ' (', 1)})" for m in missing]
    for name, major, minor in plan:
        said.append(_make_node(dev_root / "dev" / name, os.makedev(major, minor), dry_run))
    return [line for line in said if line]


def _make_node(path: Path, rdev: int, dry_run: bool) -> str:
    numbers = f"{os.major(rdev)}:{os.minor(rdev)}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev:
        return ""  # kept
    if st is not None and stat.S_ISDIR(st.st_mode):
        return f"skipped {path} (a folder is in the way)"
    was = (f"was {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if st is not None
           and stat.S_ISCHR(st.st_mode) else "was not a character device") if st else ""
    detail = ", ".join(filter(None, (numbers, was)))
    if dry_run:
        return f"would {'replace' if st else 'create'} {path} ({detail})"
    tmp = path.with_name(f".{path.name}.nri-cdi-{os.urandom(4).hex()}")
    os.mknod(tmp, stat.S_IFCHR | 0o666, rdev)
    try:
        os.chmod(tmp, 0o666)  # whatever the umask
        os.rename(tmp, path)  # atomic: the name never disappears
    except BaseException:
        os.unlink(tmp)
        raise
    return f"{'replaced' if st else 'created'} {path} ({detail})"


def nvidia_char_nodes(dev_root: Path) -> list[tuple[Path, int]]:
    """(path, rdev) of the NVIDIA character devices under ``dev_root``/dev."""
    found = []
    for folder, pattern in (("dev", "nvidia*"), ("dev/nvidia-caps", "nvidia-*")):
        for path in sorted((dev_root / folder).glob(pattern)):
            if path.name.startswith(_BLOCKED):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found.append((path, st.st_rdev))
    return found


def create_dev_char_links(dev_root: Path, dev_char: Path, *, dry_run: bool = False
                          ) -> list[str]:
    """What was done (or would be): a line for each link made, replaced or skipped."""
    nodes = nvidia_char_nodes(dev_root)
    if nodes and not dry_run:
        dev_char.mkdir(mode=0o755, parents=True, exist_ok=True)
    return [line for path, rdev in nodes if (line := _link(dev_char, path, rdev, dry_run))]


def _link(dev_char: Path, node: Path, rdev: int, dry_run: bool) -> str:
    link = dev_char / f"{os.major(rdev)}:{os.minor(rdev)}"
    target = os.path.relpath(node, dev_char)
    try:
        current: str | None = os.readlink(link)
    except FileNotFoundError:
        current = None
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return f"skipped {link} (not a link; left alone)"
    if current == target:
        return ""  # kept
    detail = f"-> {target}" + (f", was -> {current}" if current is not None else "")
    if dry_run:
        return f"would {'replace' if current else 'create'} {link} ({detail})"
    tmp = dev_char / f".{link.name}.nri-cdi-{os.urandom(4).hex()}"
    os.symlink(target, tmp)
    os.rename(tmp, link)
    return f"{'replaced' if current else 'created'} {link} ({detail})"


# --- the command ----------------------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "system", help="create missing NVIDIA device nodes and /dev/char links "
        "(nvidia-ctk system compatible)")
    sub = parser.add_subparsers(dest="system_command", required=True, metavar="COMMAND")
    nodes = sub.add_parser("create-device-nodes", help="create the NVIDIA control device nodes")
    nodes.add_argument("--dev-root", "--root", "--driver-root", dest="dev_root", default="/",
                       help="where /dev is (default /)")
    nodes.add_argument("--control-devices", action="store_true", required=True,
                       help="nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools")
    _common(nodes)
    nodes.set_defaults(func=cmd_create_device_nodes)
    links = sub.add_parser("create-dev-char-symlinks",
                           help="link /dev/char/MAJOR:MINOR to the NVIDIA device nodes")
    links.add_argument("--dev-root", "--driver-root", dest="dev_root", default="/",
                       help="where /dev is (default /)")
    links.add_argument("--dev-char-path", help="where the links go (default DEV_ROOT/dev/char)")
    links.add_argument("--create-all", action="store_true",
                       help="refused: links are made for existing nodes only")
    links.add_argument("--create-device-nodes", action="store_true",
                       help="first run create-device-nodes --control-devices")
    _common(links)
    links.set_defaults(func=cmd_create_dev_char_symlinks)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proc-devices", help="the /proc/devices to read the majors from "
                   "(default: DEV_ROOT/proc/devices when DEV_ROOT has one, else /proc/devices)")
    p.add_argument("--load-kernel-modules", action="store_true",
                   help="refused: load the modules first (modprobe nvidia nvidia-uvm)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; do nothing")


def _majors(args: argparse.Namespace, root: Path) -> dict[str, int]:
    path = Path(args.proc_devices) if args.proc_devices else root / "proc/devices"
    if not args.proc_devices and not path.is_file():
        path = Path("/proc/devices")
    with open(path, encoding="utf-8", errors="replace") as f:
        return char_majors(f.read(_MAX_PROC_DEVICES))


def _run(prog: str, args: argparse.Namespace, work: Callable[[Path], list[str]]) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr)

    if args.load_kernel_modules:
        say(f"nri-cdi system {prog}: error: --load-kernel-modules is not supported: "
            "load the modules first (modprobe nvidia; modprobe nvidia-uvm)")
        return 2
    root = Path(args.dev_root)
    if not root.is_dir():
        say(f"nri-cdi system {prog}: error: dev root {root} is not a folder")
        return 1
    try:
        for line in work(root):
            say(f"nri-cdi system {prog}: {line}")
    except OSError as exc:
        say(f"nri-cdi system {prog}: error: {exc.filename or ''}: {exc.strerror or exc}")
        return 1
    return 0


def cmd_create_device_nodes(args: argparse.Namespace) -> int:
    return _run("create-device-nodes", args,
                lambda root: create_device_nodes(root, _majors(args, root), dry_run=args.dry_run))


def cmd_create_dev_char_symlinks(args: argparse.Namespace) -> int:
    if args.create_all:
        print("nri-cdi system create-dev-char-symlinks: error: --create-all is not supported: "
              "links are made for the nodes that exist (use --create-device-nodes to make the "
              "control nodes first)", file=sys.stderr)
        return 2

    def work(root: Path) -> list[str]:
        actions = []
        if args.create_device_nodes:
            actions += create_device_nodes(root, _majors(args, root), dry_run=args.dry_run)
        dev_char = Path(args.dev_char_path) if args.dev_char_path else root / "dev/char"
        return actions + create_dev_char_links(root, dev_char, dry_run=args.dry_run)

    return _run("create-dev-char-symlinks", args, work)
