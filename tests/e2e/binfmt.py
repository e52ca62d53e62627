"""qemu-user as the kernel's handler for aarch64 programs (binfmt_misc), for the arm64 tests.

Registering a handler is a system-wide change: while it is there, every aarch64 program
started on this machine, in any container, runs under the emulator. So it is made only by
:func:`registered`, which says so on stderr, registers only when no handler for aarch64 is
there already (one of the system's is used as it is), and unregisters exactly the handler it
registered, under a name of its own (``nri-cdi-aarch64-<pid>-<n>``): concurrent test sessions
each remove only theirs.

The handler is registered with the ``F`` flag (as Debian's qemu-user-binfmt does): the kernel
opens the emulator once, at registration, so runc can start an aarch64 program inside a
container whose root has no emulator. The registration line is qemu's own
(``usr/share/qemu/binfmt.d/qemu-aarch64.conf`` of the package) with our path and name.

binfmt_misc need not be mounted: it is mounted in a mount namespace of our own (``unshare
-m``), so no mount is left behind. The kernel drops the handlers of a binfmt_misc instance
when its last mount goes, so the registration is held by a process that keeps that
namespace and its mount (:class:`_Holder`) and unregisters when told to or when the test
process goes away (its stdin closes): a killed test session leaves nothing registered.
Where mounting is refused (no root, no binfmt_misc in the kernel, a container without the
privilege), :class:`BinfmtUnavailable` says why, and the tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BinfmtUnavailable", "Handler", "aarch64_handler", "handlers", "parse_line",
           "registered"]

# Run in a private mount namespace: $1 the action, then its arguments. The entries are
# printed as "== NAME" followed by the entry file's lines.
_SCRIPT = r"""set -e
d=$(mktemp -d)
mount -t binfmt_misc nri-cdi-binfmt "$d" 2>"$d.err" || {
    echo "cannot mount binfmt_misc: $(cat "$d.err")" >&2; rm -f "$d.err"; rmdir "$d"; exit 3; }
rm -f "$d.err"
case $1 in
list)
    echo "== status"; cat "$d/status"
    for f in "$d"/*; do
        case ${f##*/} in register|status) continue ;; esac
        echo "== ${f##*/}"; cat "$f"
    done ;;
hold)
    # $2 the line, $3 its name: registered until stdin says stop or closes.
    printf '%s' "$2" >"$d/register"
    echo registered
    read -r _ || true
    [ ! -e "$d/$3" ] || echo -1 >"$d/$3"
    echo unregistered ;;
esac
"""
OUR_PREFIX = "nri-cdi-aarch64-"
# A number of its own for each registration of a session: the session-wide one of the arm64
# tests and a test's own may be there at once, and the kernel takes a name only once.
_REGISTRATIONS = itertools.count(1)


class BinfmtUnavailable(Exception):
    """binfmt_misc cannot be read or written here; says why in one line."""


@dataclass(frozen=True)
class Handler:
    name: str
    enabled: bool
    interpreter: str
    flags: str
    magic: str  # hex, as the entry file shows it
    mask: str


def _argv(*args: str) -> list[str]:
    if os.geteuid() != 0:
        raise BinfmtUnavailable("binfmt_misc needs root (mount, register)")
    if shutil.which("unshare") is None:
        raise BinfmtUnavailable("no unshare(1) (util-linux) to mount binfmt_misc privately")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", _SCRIPT, "sh", *args]


def _run(*args: str) -> str:
    done = subprocess.run(_argv(*args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()
        raise BinfmtUnavailable(why[-1] if why else f"binfmt_misc {args[0]} failed")
    return done.stdout


def handlers() -> tuple[bool, list[Handler]]:
    """(binfmt_misc enabled, the registered handlers)."""
    blocks: dict[str, list[str]] = {}
    name = ""
    for line in _run("list").splitlines():
        if line.startswith("== "):
            name = line[3:]
            blocks[name] = []
        elif name:
            blocks[name].append(line)
    enabled = blocks.pop("status", ["enabled"]) == ["enabled"]
    found = []
    for entry, lines in blocks.items():
        fields = dict(line.partition(" ")[::2] for line in lines[1:])
        found.append(Handler(name=entry, enabled=lines[:1] == ["enabled"],
                             interpreter=fields.get("interpreter", ""),
                             flags=fields.get("flags:", ""), magic=fields.get("magic", ""),
                             mask=fields.get("mask", "")))
    return enabled, found


def parse_line(line: str) -> tuple[str, str]:
    """(magic, mask) of a registration line ``:name:M:offset:magic:mask:interpreter:flags``
    in the hex the entry files show."""
    fields = line.strip().split(":")
    if len(fields) != 8 or fields[2] != "M":
        raise ValueError(f"not a magic-type binfmt_misc line: {line.strip()!r}")
    return (_hex(fields[4]), _hex(fields[5]))


def _hex(escaped: str) -> str:
    return escaped.encode().decode("unicode_escape").encode("latin-1").hex()


def aarch64_handler(found: list[Handler], magic: str, mask: str) -> Handler | None:
    """The enabled handler for the programs ``magic``/``mask`` select (the newest wins in the
    kernel; any will do here), ours last."""
    matching = [h for h in found if h.enabled and h.magic == magic and h.mask == mask]
    matching.sort(key=lambda h: h.name.startswith(OUR_PREFIX))
    return matching[0] if matching else None


@contextlib.contextmanager
def registered(qemu: Path, conf: Path) -> Iterator[Handler]:
    """An aarch64 handler with the ``F`` flag for the time of the ``with``: the system's, or
    ``qemu`` registered with ``conf``'s line (and unregistered after). Raises
    :class:`BinfmtUnavailable` when there is none and none can be made."""
    line = conf.read_text().strip()
    magic, mask = parse_line(line)
    enabled, found = handlers()
    if not enabled:
        raise BinfmtUnavailable("binfmt_misc is disabled on this machine (status: disabled)")
    theirs = aarch64_handler([h for h in found if not h.name.startswith(OUR_PREFIX)],
                             magic, mask)
    if theirs is not None:
        if "F" not in theirs.flags:
            raise BinfmtUnavailable(
                f"the system's aarch64 handler {theirs.name} ({theirs.interpreter}) lacks the F "
                "flag: runc cannot start aarch64 programs in containers with it")
        yield theirs
        return
    if ":" in str(qemu) or not qemu.is_file():
        raise BinfmtUnavailable(f"{qemu}: not a file, or a path with ':'")
    name = f"{OUR_PREFIX}{os.getpid()}-{next(_REGISTRATIONS)}"
    fields = line.split(":")
    fields[1], fields[6] = name, str(qemu)
    flags = "".join(dict.fromkeys(fields[7] + "F"))
    fields[7] = flags
    print(f"binfmt: SYSTEM-WIDE CHANGE: registering {qemu} as the handler of every aarch64 "
          f"program on this machine (binfmt_misc entry {name}, flags {flags}) for this test "
          "session; it is unregistered when the session ends", file=sys.stderr)
    holder = _Holder(":".join(fields))
    try:
        _, now = handlers()
        ours = [h for h in now if h.name == name]
        if not ours:
            raise BinfmtUnavailable(f"{name} was registered but binfmt_misc does not list it")
        yield ours[0]
    finally:
        holder.close()
        print(f"binfmt: unregistered {name} (the system's aarch64 handlers are as before)",
              file=sys.stderr)


class _Holder:
    """The process that keeps the registration (see the module's doc)."""

    def __init__(self, line: str) -> None:
        name = line.split(":")[1]
        self._proc = subprocess.Popen(_argv("hold", line, name), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline().strip()
        if first != "registered":
            _, err = self._proc.communicate(timeout=30)
            why = err.strip().splitlines()
            raise BinfmtUnavailable(f"registering {name} failed: "
                                    f"{why[-1] if why else f'exit {self._proc.returncode}'}")

    def close(self) -> None:
        out, err = self._proc.communicate("stop\n", timeout=30)
        if "unregistered" not in out:
            raise RuntimeError(f"binfmt: unregistering failed: {err.strip()}")
