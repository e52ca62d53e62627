"""Run the maintainer scripts of unpacked Debian packages against a node root, as dpkg would
run them on an install (``postinst configure``, then the triggers they activate, until none
is left), so the root gets the links those scripts make (``/etc/alternatives``), not a
hand-kept list of them.  Used by scripts/install-nvidia-debian.sh.

The scripts test paths as they would on the node (``[ -f /usr/lib/nvidia/current/...]``),
so they run chrooted into the root, with busybox as their shell and tools (placed in the
root for the run, removed after).  Their ``update-alternatives`` calls are recorded there
and replayed at once, outside, by the real ``update-alternatives --root ROOT``: the links
and the alternatives state are dpkg's own.  Commands that would change a running system
(ldconfig, systemd, initramfs, diversions) do nothing; ``dpkg-query`` answers from the set
of unpacked packages; ``dpkg-trigger`` records the trigger names, matched against each
package's ``triggers`` file (explicit names, and file triggers for paths in the root).

usage: debian_maintscripts.py ROOT DEB...
"""

import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

BUSYBOX = "/bin/busybox"
UPDATE_ALTERNATIVES = "/usr/bin/update-alternatives"
LOADER = "/lib64/ld-linux-x86-64.so.2"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
APPLETS = ("sh", "grep", "dirname", "basename", "cat", "sed", "tr", "test", "[", "readlink",
           "ls", "head", "tail", "cut", "awk", "true", "false", "printf", "expr", "env",
           "echo", "mkdir", "uname", "sort", "wc")
MAINT = ".maint"  # the run's folder in the root: busybox, shims, records
NOOPS = ("ldconfig", "dpkg-maintscript-helper", "dpkg-divert", "deb-systemd-helper",
         "deb-systemd-invoke", "systemctl", "invoke-rc.d", "update-rc.d", "update-initramfs",
         "ucf", "ucfr")
CONFMODULE = "usr/share/debconf/confmodule"
# debconf's shell API, answering every question with nothing: no package here asks any.
CONFMODULE_STUB = "\n".join(
    f"{f}() {{ RET=''; return 0; }}" for f in (
        "db_version", "db_capb", "db_get", "db_set", "db_input", "db_go", "db_stop",
        "db_fset", "db_fget", "db_subst", "db_title", "db_purge", "db_reset",
        "db_register", "db_unregister", "db_metaget", "db_beginblock", "db_endblock",
        "db_settitle", "db_clear", "db_x_loadtemplatefile")) + "\n"
SHIMS = {
    # The host's own update-alternatives, run in the chroot by the host's loader and libc
    # (copied into the run's folder): links and state as dpkg makes them, seen at once by
    # the scripts' own tests.
    "update-alternatives": """#!/bin/sh
exec /{m}/lib/ld.so --library-path /{m}/lib /{m}/bin/update-alternatives "$@"
""",
    "dpkg-trigger": """#!/bin/sh
for a in "$@"; do case "$a" in --*) ;; *) echo "$a" >> /{m}/triggers ;; esac; done
""",
    "dpkg-query": """#!/bin/sh
for a in "$@"; do pkg=$a; done
grep -qx "$pkg" /{m}/installed || exit 1
case "$1" in
  -W) printf 'install ok installed' ;;
  -s) echo "Package: $pkg"; echo "Status: install ok installed" ;;
esac
""",
    "dpkg": """#!/bin/sh
case "$1" in --print-architecture) echo amd64 ;; esac
exit 0
""",
}


class Package:
    def __init__(self, deb: Path, ctl: Path) -> None:
        self.deb = deb
        self.ctl = ctl
        fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Architecture"],
                                check=True, capture_output=True, text=True).stdout
        info = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
        self.name = info["Package"]
        self.arch = info["Architecture"]
        self.interests: list[str] = []
        triggers = ctl / "triggers"
        if triggers.exists():
            for line in triggers.read_text().splitlines():
                words = line.split()
                if len(words) == 2 and words[0].startswith("interest"):
                    self.interests.append(words[1])

    def __repr__(self) -> str:
        return f"{self.name}:{self.arch}"


def prepare(root: Path) -> list[Path]:
    """Busybox, the shims and the debconf stub in the root; what to remove afterwards."""
    maint = root / MAINT
    (maint / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, maint / "bin" / "busybox")
    shutil.copy(UPDATE_ALTERNATIVES, maint / "bin" / "update-alternatives")
    (maint / "lib").mkdir()
    shutil.copy(LOADER, maint / "lib" / "ld.so")
    shutil.copy(LIBC, maint / "lib" / "libc.so.6")
    for applet in APPLETS:
        os.symlink("busybox", maint / "bin" / applet)
    (maint / "shims").mkdir()
    for name, text in SHIMS.items():
        (maint / "shims" / name).write_text(text.replace("{m}", MAINT))
    for name in NOOPS:
        (maint / "shims" / name).write_text("#!/bin/sh\nexit 0\n")
    for shim in (maint / "shims").iterdir():
        shim.chmod(0o755)
    made = [maint]
    # /bin/sh for the scripts' own #! lines (/bin is a link to usr/bin: merged /usr).
    for rel, make in (("usr/bin/sh", lambda p: os.symlink(f"/{MAINT}/bin/busybox", p)),
                      ("dev/null", lambda p: os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))),
                      (CONFMODULE, lambda p: p.write_text(CONFMODULE_STUB))):
        path = root / rel
        if path.exists() or path.is_symlink():
            continue
        missing = [q for q in [path.parent, *path.parent.parents] if not q.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
        made += [path, *missing]  # removed in this order: the file, then new folders
    return made


def run_postinst(root: Path, pkg: Package, args: list[str]) -> None:
    script = pkg.ctl / "postinst"
    if not script.exists():
        return
    inside = f"/{MAINT}/ctl/{pkg.ctl.name}/postinst"
    env = {"PATH": f"/{MAINT}/shims:/{MAINT}/bin", "DPKG_MAINTSCRIPT_PACKAGE": pkg.name,
           "DPKG_MAINTSCRIPT_ARCH": pkg.arch, "DPKG_MAINTSCRIPT_NAME": "postinst",
           "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    done = subprocess.run([CHROOT, str(root), f"/{MAINT}/bin/sh", "-e", inside, *args],
                          env=env, capture_output=True, text=True)
    print(f"postinst {pkg} {shlex.join(args)}: exit {done.returncode}\n{done.stdout}"
          f"{done.stderr}", end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"postinst of {pkg} {shlex.join(args)} failed with exit "
                         f"{done.returncode}: {done.stderr.strip()[-400:]}")


def take_triggers(root: Path) -> list[str]:
    path = root / MAINT / "triggers"
    if not path.exists():
        return []
    names = list(dict.fromkeys(path.read_text().split()))
    path.unlink()
    return names


def interested(pkg: Package, names: list[str]) -> list[str]:
    return [n for n in names if n in pkg.interests]


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    debs = [Path(a) for a in argv[1:]]
    made = prepare(root)
    pkgs = []
    for deb in debs:
        ctl = root / MAINT / "ctl" / deb.stem
        ctl.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-e", str(deb), str(ctl)], check=True)
        pkgs.append(Package(deb, ctl))
    # dpkg-query's answers: every package unpacked counts as installed.
    (root / MAINT / "installed").write_text("".join(f"{p.name}\n" for p in pkgs))
    try:
        for pkg in pkgs:
            run_postinst(root, pkg, ["configure", ""])
        # File triggers: every unpacked path a package declared an interest in.
        pending = take_triggers(root) + [
            i for p in pkgs for i in p.interests
            if i.startswith("/") and os.path.lexists(root / i.lstrip("/"))]
        rounds = 0
        while pending:
            rounds += 1
            if rounds > 20:
                raise SystemExit(f"triggers do not settle: {pending}")
            for pkg in pkgs:
                hits = interested(pkg, pending)
                if hits:
                    run_postinst(root, pkg, ["triggered", " ".join(hits)])
            pending = take_triggers(root)
    finally:
        for path in made:
            if path.name == MAINT:
                shutil.rmtree(path)
            elif path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif os.path.lexists(path):
                path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
