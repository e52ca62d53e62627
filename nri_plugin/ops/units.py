"""systemd units and the runtime-launched launcher: text, and ``nri-cdi install-units`` /
``nri-cdi install-launcher`` to put them in place.

The units are rendered from this module (the copies in the repository's ``systemd/``
folder are its output for the default paths, checked by a test), so the installed
ExecStart lines always name the ``nri-cdi`` that is actually installed.

* ``nri-cdi-generate.service``: oneshot at boot, before containerd and the plugin, creates
  missing NVIDIA control nodes and /dev/char links (``nri-cdi system ...``), then runs
  ``nri-cdi refresh`` (the generator with ``--if-changed``);
* ``nri-cdi-generate.path``: runs it again when ``modules.dep`` (a driver or kernel
  package was installed) or the ``nri-cdi`` executable changes;
* ``nri-cdi-watch.service``: ``nri-cdi watch``, which also sees module reloads and MIG
  changes (procfs sends no inotify events, so a .path unit cannot);
* ``nri-cdi-plugin.service``: the plugin, after containerd, always restarted, sandboxed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nri_plugin.ops.settings import DEFAULT_CONFIG_PATH

DEFAULT_BINARY = "/usr/local/bin/nri-cdi"
DEFAULT_CONFIG = DEFAULT_CONFIG_PATH
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_PLUGIN_DIR = "/opt/nri/plugins"
DEFAULT_LAUNCHER_LOG = "/var/log/nri-cdi.log"

# Sandboxing shared by every unit. Not used, and why:
# PrivateDevices hides /dev/nvidia*, which the plugin stats to fill device numbers and the
# generator (NVML) opens; MemoryDenyWriteExecute is left out because NVML and ctypes'
# callbacks may need writable+executable pages.
_HARDENING = """\
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
UMask=0022
"""

_GENERATE_SERVICE = """\
[Unit]
Description=nri-cdi: write the NVIDIA CDI spec if the node changed
After=systemd-modules-load.service
Before=containerd.service nri-cdi-plugin.service nri-cdi-watch.service
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=oneshot
# Nothing else creates the control nodes before CUDA first runs: make the missing ones
# (and their /dev/char links) so that the spec has them. Best effort, as nvidia-ctk's unit.
ExecStartPre=-{binary} system create-device-nodes --control-devices
ExecStartPre=-{binary} system create-dev-char-symlinks
ExecStart={binary} refresh --config {config}
# The driver may still be loading at boot: try again rather than leave no spec.
Restart=on-failure
RestartSec=5
# Writes only the spec folders; RuntimeDirectory creates /run/cdi (= /var/run/cdi).
RuntimeDirectory=cdi
RuntimeDirectoryPreserve=yes
ReadWritePaths=-/etc/cdi
RestrictAddressFamilies=AF_UNIX AF_NETLINK
{hardening}
[Install]
WantedBy=multi-user.target
"""

_GENERATE_PATH = """\
[Unit]
Description=nri-cdi: regenerate the NVIDIA CDI spec when driver packages change

[Path]
# A driver or kernel package install rewrites modules.dep; a new nri-cdi may write a
# different spec. Module reloads and MIG changes are nri-cdi-watch.service's job.
PathChanged=/lib/modules/%v/modules.dep
PathChanged={binary}
Unit=nri-cdi-generate.service

[Install]
WantedBy=multi-user.target
"""

_WATCH_SERVICE = """\
[Unit]
Description=nri-cdi: regenerate the NVIDIA CDI spec on driver and MIG changes
After=nri-cdi-generate.service

[Service]
Type=simple
ExecStart={binary} watch --config {config}
Restart=always
RestartSec=5
RuntimeDirectory=cdi
RuntimeDirectoryPreserve=yes
ReadWritePaths=-/etc/cdi
RestrictAddressFamilies=AF_UNIX AF_NETLINK
{hardening}
[Install]
WantedBy=multi-user.target
"""

_PLUGIN_SERVICE = """\
[Unit]
Description=nri-cdi: NRI plugin that injects CDI devices into containers
After=containerd.service nri-cdi-generate.service
Wants=nri-cdi-generate.service

[Service]
Type=simple
ExecStart={binary} plugin --config {config}
# The plugin reconnects when containerd restarts; if it exits anyway, start it again:
# while it is gone, containers are created without their devices (NRI is fail-open).
Restart=always
RestartSec=2
# Root with one capability: it owns the NRI socket and its 0700 folder, and the specs
# are world-readable. CAP_KILL lets fail-closed stop a container created without its
# devices whatever user runs it. The NRI socket is reached by connect(), which a
# read-only mount does not block; the metrics endpoint, when enabled, needs AF_INET/6.
CapabilityBoundingSet=CAP_KILL
AmbientCapabilities=
ProtectProc=invisible
DevicePolicy=closed
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
{hardening}
[Install]
WantedBy=multi-user.target
"""

UNITS: dict[str, str] = {
    "nri-cdi-generate.service": _GENERATE_SERVICE,
    "nri-cdi-generate.path": _GENERATE_PATH,
    "nri-cdi-watch.service": _WATCH_SERVICE,
    "nri-cdi-plugin.service": _PLUGIN_SERVICE,
}
# Enabled by install-units; the generate service is pulled in by the others.
ENABLE = ("nri-cdi-generate.service", "nri-cdi-generate.path", "nri-cdi-watch.service",
          "nri-cdi-plugin.service")


def render_units(binary: str = DEFAULT_BINARY, config: str = DEFAULT_CONFIG) -> dict[str, str]:
    for what, path in (("binary", binary), ("config", config)):
        if not os.path.isabs(path) or any(c.isspace() for c in path):
            raise ValueError(f"{what} must be an absolute path without spaces, got {path!r}")
    return {name: text.format(binary=binary, config=config, hardening=_HARDENING)
            for name, text in UNITS.items()}


def render_launcher(*, python: str = sys.executable, config: str | None = DEFAULT_CONFIG,
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
        "# nri-cdi NRI plugin, launched by the container runtime (NRI plugin_path).",
        "# Written by `nri-cdi install-launcher`; the runtime passes the NRI socket as fd 3.",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "export PATH",
    ]
    if pythonpath:
        lines += [f"PYTHONPATH={shlex.quote(pythonpath)}", "export PYTHONPATH"]
    lines.append(f"exec {shlex.quote(python)} -m nri_plugin.ops.cli plugin {args} "
                 f">>{shlex.quote(log_file)} 2>&1")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


Systemctl = Callable[[list[str]], int]


def _systemctl(args: list[str]) -> int:
    return subprocess.run(["systemctl", *args], check=False).returncode


def install_units(unit_dir: Path, *, binary: str, config: str, enable: bool,
                  systemctl: Systemctl = _systemctl) -> list[Path]:
    unit_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_units(binary, config).items():
        _write(unit_dir / name, text, 0o644)
        written.append(unit_dir / name)
    if enable:
        for args in (["daemon-reload"], ["enable", "--now", *ENABLE]):
            if systemctl(args) != 0:
                raise RuntimeError(f"systemctl {' '.join(args)} failed")
    return written


# --- commands ------------------------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    units = subparsers.add_parser("install-units", help="install the systemd units")
    units.add_argument("--unit-dir", default=DEFAULT_UNIT_DIR,
                       help=f"where to write the units (default {DEFAULT_UNIT_DIR})")
    units.add_argument("--binary", help="the nri-cdi executable the units run "
                                        "(default: nri-cdi on PATH, else "
                                        f"{DEFAULT_BINARY})")
    units.add_argument("--config", default=DEFAULT_CONFIG,
                       help=f"configuration file the units pass (default {DEFAULT_CONFIG})")
    units.add_argument("--no-enable", dest="enable", action="store_false",
                       help="only write the files; no daemon-reload, no enable --now")
    units.add_argument("--print", dest="print_only", action="store_true",
                       help="print the units instead of writing them")
    units.set_defaults(func=cmd_install_units)
    launcher = subparsers.add_parser(
        "install-launcher", help="install the launcher for the runtime's NRI plugin folder")
    launcher.add_argument("--plugin-dir", default=DEFAULT_PLUGIN_DIR,
                          help=f"the runtime's NRI plugin_path (default {DEFAULT_PLUGIN_DIR})")
    launcher.add_argument("--index", default="10", help="two-digit plugin index (default 10)")
    launcher.add_argument("--config", default=DEFAULT_CONFIG)
    launcher.add_argument("--log-file", default=DEFAULT_LAUNCHER_LOG)
    launcher.add_argument("--python", default=sys.executable,
                          help="interpreter with nri-cdi installed (default: this one)")
    launcher.add_argument("--print", dest="print_only", action="store_true")
    launcher.set_defaults(func=cmd_install_launcher)


def cmd_install_units(args: argparse.Namespace) -> int:
    binary = args.binary or shutil.which("nri-cdi") or DEFAULT_BINARY
    try:
        if args.print_only:
            for name, text in render_units(binary, args.config).items():
                print(f"# --- {name}\n{text}")
            return 0
        written = install_units(Path(args.unit_dir), binary=binary, config=args.config,
                                enable=args.enable)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"nri-cdi install-units: error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_install_launcher(args: argparse.Namespace) -> int:
    if len(args.index) != 2 or not args.index.isdigit():
        print(f"nri-cdi install-launcher: error: --index must be two digits, got "
              f"{args.index!r}", file=sys.stderr)
        return 1
    text = render_launcher(python=args.python, config=args.config, log_file=args.log_file)
    if args.print_only:
        print(text, end="")
        return 0
    target = Path(args.plugin_dir) / f"{args.index}-nri-cdi"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, text, 0o755)
    except OSError as exc:
        print(f"nri-cdi install-launcher: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}; containerd starts it at its next start (NRI must be enabled)")
    return 0
