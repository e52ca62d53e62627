"""systemd units and the plugin's launcher for the runtime's NRI plugin folder: their text,
and the commands that put them in place and take them away (``nri-cdi install-units`` /
``uninstall-units``, ``install-plugin-launcher`` / ``uninstall-plugin-launcher``; what each
unit does: docs/install/systemd.md). The units are rendered here, so the installed
ExecStart lines name the ``nri-cdi`` actually installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from cdi.spec import atomic_write
from nri_plugin.ops.settings import DEFAULT_CONFIG_PATH, PluginSettings

DEFAULT_BINARY = "/usr/local/bin/nri-cdi"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_PLUGIN_DIR = "/opt/nri/plugins"
DEFAULT_LAUNCHER_LOG = "/var/log/nri-cdi.log"

# The units, in the order they are enabled. Their one home is nri_plugin/ops/systemd/ (ready
# to copy: they run DEFAULT_BINARY with DEFAULT_CONFIG_PATH); render_units names other paths.
UNITS = ("nri-cdi-generate.service", "nri-cdi-generate.path", "nri-cdi-watch.service",
         "nri-cdi-plugin.service")


def render_units(binary: str = DEFAULT_BINARY,
                 config: str = DEFAULT_CONFIG_PATH) -> dict[str, str]:
    for what, path in (("binary", binary), ("config", config)):
        if not os.path.isabs(path) or any(c.isspace() for c in path):
            raise ValueError(f"{what} must be an absolute path without spaces, got {path!r}")
    paths = {DEFAULT_BINARY: binary, DEFAULT_CONFIG_PATH: config}
    # One pass: a path given may contain the other default.
    default = re.compile(f"({'|'.join(map(re.escape, paths))})(?=\\s)")
    folder = resources.files("nri_plugin.ops").joinpath("systemd")
    return {name: default.sub(lambda m: paths[m[0]], folder.joinpath(name).read_text())
            for name in UNITS}


# The launcher's second line: how uninstall-plugin-launcher knows a file is ours.
LAUNCHER_MARK = "# nri-cdi NRI plugin, launched by the container runtime (NRI plugin_path)."


def render_launcher(*, python: str = sys.executable, config: str | None = DEFAULT_CONFIG_PATH,
                    log_file: str = DEFAULT_LAUNCHER_LOG, pythonpath: str | None = None,
                    extra_args: Sequence[str] = ()) -> str:
    """A ``/opt/nri/plugins/NN-nri-cdi`` launcher. The runtime starts it with only
    NRI_PLUGIN_NAME/IDX/SOCKET in the environment, the NRI socket as fd 3, and its output
    discarded: so the interpreter is named by absolute path, PATH is set for the hooks'
    helpers, and the log goes to a file."""
    flags = ["--config", config] if config else []
    args = " ".join(shlex.quote(a) for a in (*flags, *extra_args))
    lines = [
        "#!/bin/sh",
        LAUNCHER_MARK,
        "# Written by `nri-cdi install-plugin-launcher`; the runtime passes the NRI socket "
        "as fd 3.",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "export PATH",
    ]
    if pythonpath:
        lines += [f"PYTHONPATH={shlex.quote(pythonpath)}", "export PYTHONPATH"]
    lines.append(f"exec {shlex.quote(python)} -m nri_plugin.ops.cli plugin {args} "
                 f">>{shlex.quote(log_file)} 2>&1")
    return "\n".join(lines) + "\n"


Systemctl = Callable[[list[str]], int]


def _systemctl(args: list[str]) -> int:
    return subprocess.run(["systemctl", *args], check=False).returncode


def install_units(unit_dir: Path, units: Mapping[str, str], *, enable: bool,
                  root: Path | None = None, systemctl: Systemctl = _systemctl) -> list[Path]:
    """Write ``units`` (``render_units``' texts by file name) into ``unit_dir``; with
    ``enable``, reload systemd and enable and start them. With ``root`` (an offline system
    image), ``enable`` only enables them there (``systemctl --root``): nothing is reloaded
    or started."""
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        atomic_write(unit_dir / name, text.encode(), mode=0o644)
    if enable:
        steps = ([[f"--root={root}", "enable", *UNITS]] if root is not None
                 else [["daemon-reload"], ["enable", "--now", *UNITS]])
        for args in steps:
            if systemctl(args) != 0:
                raise RuntimeError(f"systemctl {' '.join(args)} failed")
    return [unit_dir / name for name in UNITS]


def uninstall_units(unit_dir: Path, *, disable: bool, root: Path | None = None,
                    systemctl: Systemctl = _systemctl) -> list[Path]:
    """Stop and disable the units (with ``disable``), remove their files from ``unit_dir``
    and reload systemd; returns the files removed. Files of other names are left alone.
    With ``root``, only disable them in that image."""
    present = [unit_dir / name for name in UNITS if (unit_dir / name).exists()]
    names = [p.name for p in present]
    if disable and names:
        args = ([f"--root={root}", "disable", *names] if root is not None
                else ["disable", "--now", *names])
        if systemctl(args) != 0:
            raise RuntimeError(f"systemctl {' '.join(args)} failed")
    for path in present:
        path.unlink()
    if disable and present and root is None and systemctl(["daemon-reload"]) != 0:
        raise RuntimeError("systemctl daemon-reload failed")
    return present


def running_command(argv0: str | None = None, executable: str = sys.executable) -> str | None:
    """The ``nri-cdi`` executable that is running this: ``argv0`` when it is the console
    script (made absolute, not resolved: a link the user chose stays a link), else the
    console script next to the interpreter (a virtual environment's bin folder); None when
    neither (``python -m nri_plugin.ops.cli``)."""
    argv0 = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
    candidates = []
    if os.path.basename(argv0) == "nri-cdi":
        candidates.append(argv0 if os.sep in argv0 else shutil.which(argv0) or "")
    if executable:
        candidates.append(os.path.join(os.path.dirname(executable), "nri-cdi"))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def launcher_path(plugin_dir: Path, index: str) -> Path:
    return plugin_dir / f"{index}-nri-cdi"


def remove_launcher(plugin_dir: Path, index: str) -> Path | None:
    """Remove the launcher ``install-plugin-launcher`` wrote; None when there is none. A
    file of that name that we did not write is refused (ValueError)."""
    target = launcher_path(plugin_dir, index)
    try:
        text = target.read_text(errors="replace")
    except FileNotFoundError:
        return None
    if LAUNCHER_MARK not in text.splitlines()[:3]:
        raise ValueError(f"{target} was not written by nri-cdi install-plugin-launcher; "
                         "left in place")
    target.unlink()
    return target


# --- commands ------------------------------------------------------------------------------


def _index(text: str) -> str:
    if len(text) != 2 or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected two digits, got {text!r}")
    return text


def _root_and_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, metavar="DIR",
                        help="act on the system image under DIR (systemctl --root): the "
                             "units go to DIR/etc/systemd/system and nothing is started or "
                             "stopped")
    parser.add_argument("--unit-dir", type=Path, metavar="DIR",
                        help=f"the units' folder (default {DEFAULT_UNIT_DIR}, under --root "
                             "when given)")


def _unit_dir(args: argparse.Namespace) -> Path:
    if args.unit_dir is not None:
        return Path(args.unit_dir)
    return Path(args.root or "/", DEFAULT_UNIT_DIR.lstrip("/"))


def add_commands(subparsers: Any) -> None:
    units = subparsers.add_parser(
        "install-units", help="install (and enable and start) the systemd units")
    _root_and_dir(units)
    units.add_argument("--binary", metavar="PATH",
                       help="the nri-cdi executable the units run (default: the nri-cdi "
                            "running this command, not whichever is first on PATH; "
                            "required when started as python -m)")
    units.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="FILE",
                       help="configuration file the units pass (default "
                            f"{DEFAULT_CONFIG_PATH})")
    units.add_argument("--no-enable", dest="enable", action="store_false",
                       help="only write the files; no daemon-reload, no enable --now")
    units.add_argument("--print", dest="print_only", action="store_true",
                       help="print the units instead of writing them")
    units.set_defaults(func=cmd_install_units)
    remove = subparsers.add_parser(
        "uninstall-units", help="stop, disable and remove the systemd units")
    _root_and_dir(remove)
    remove.add_argument("--no-disable", dest="disable", action="store_false",
                        help="only remove the files; no disable --now, no daemon-reload")
    remove.set_defaults(func=cmd_uninstall_units)
    launcher = subparsers.add_parser(
        "install-plugin-launcher",
        help="install the plugin's launcher in the runtime's NRI plugin folder (the "
             "runtime then starts the plugin itself)")
    _launcher_place(launcher)
    launcher.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="FILE",
                          help=f"configuration file the plugin reads (default "
                               f"{DEFAULT_CONFIG_PATH}; empty: none)")
    launcher.add_argument("--log-file", default=DEFAULT_LAUNCHER_LOG, metavar="FILE",
                          help="where the plugin's log goes: the runtime discards the "
                               f"output of plugins it launches (default {DEFAULT_LAUNCHER_LOG})")
    launcher.add_argument("--python", default=sys.executable, metavar="PATH",
                          help="interpreter with nri-cdi installed (default: this one, "
                               f"{sys.executable})")
    launcher.add_argument("--print", dest="print_only", action="store_true",
                          help="print the launcher instead of writing it")
    launcher.set_defaults(func=cmd_install_launcher)
    unlaunch = subparsers.add_parser(
        "uninstall-plugin-launcher",
        help="remove the plugin's launcher from the runtime's NRI plugin folder")
    _launcher_place(unlaunch)
    unlaunch.set_defaults(func=cmd_uninstall_launcher)


def _launcher_place(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin-dir", type=Path, default=DEFAULT_PLUGIN_DIR, metavar="DIR",
                        help=f"the runtime's NRI plugin_path (default {DEFAULT_PLUGIN_DIR})")
    parser.add_argument("--index", type=_index, default=PluginSettings().index, metavar="NN",
                        help=f"two-digit plugin index (default {PluginSettings().index})")


def _fail(command: str, why: object) -> int:
    print(f"nri-cdi {command}: error: {why}", file=sys.stderr)
    return 1


def cmd_install_units(args: argparse.Namespace) -> int:
    binary = args.binary or running_command()
    if binary is None:
        return _fail("install-units", "cannot tell which nri-cdi is running (started as "
                     f"{sys.argv[0] if sys.argv else '?'}): pass --binary PATH")
    try:
        units = render_units(binary, args.config)
        if args.print_only:
            for name, text in units.items():
                print(f"# --- {name}\n{text}")
            return 0
        written = install_units(_unit_dir(args), units, enable=args.enable, root=args.root)
    except (ValueError, OSError, RuntimeError) as exc:
        return _fail("install-units", exc)
    for path in written:
        print(f"wrote {path}")
    print(f"the units run {binary}")
    return 0


def cmd_uninstall_units(args: argparse.Namespace) -> int:
    try:
        removed = uninstall_units(_unit_dir(args), disable=args.disable, root=args.root)
    except (OSError, RuntimeError) as exc:
        return _fail("uninstall-units", exc)
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print(f"no nri-cdi units in {_unit_dir(args)}")
    return 0


def cmd_install_launcher(args: argparse.Namespace) -> int:
    text = render_launcher(python=args.python, config=args.config or None,
                           log_file=args.log_file)
    if args.print_only:
        print(text, end="")
        return 0
    target = launcher_path(args.plugin_dir, args.index)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text.encode(), mode=0o755)
    except OSError as exc:
        return _fail("install-plugin-launcher", exc)
    print(f"wrote {target}; containerd starts it at its next start (NRI must be enabled)")
    return 0


def cmd_uninstall_launcher(args: argparse.Namespace) -> int:
    try:
        removed = remove_launcher(args.plugin_dir, args.index)
    except (OSError, ValueError) as exc:
        return _fail("uninstall-plugin-launcher", exc)
    if removed is None:
        print(f"no launcher at {launcher_path(args.plugin_dir, args.index)}")
        return 0
    print(f"removed {removed}; a plugin the runtime already started runs until the "
          "runtime restarts")
    return 0
