"""Changing a simulated node in place, the way a driver upgrade or a MIG reconfiguration
changes a real one: new files are renamed into place over the old ones, old versioned
files stay (as they do until a package manager's cleanup), /proc is updated last."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from nri_cdi_testbed.simnode import BuiltNode


def _replace(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` atomically (temporary name + rename), as an installer does."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    if src.is_symlink():
        os.symlink(os.readlink(src), tmp)
    else:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _overlay(src_root: Path, dst_root: Path, top: str) -> None:
    for folder, dirs, files in os.walk(src_root / top):
        dirs.sort()
        rel = Path(folder).relative_to(src_root)
        (dst_root / rel).mkdir(parents=True, exist_ok=True)
        for name in [*files, *(d for d in dirs if (Path(folder) / d).is_symlink())]:
            src = Path(folder) / name
            mode = os.lstat(src).st_mode
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                _replace(src, dst_root / rel / name)


def upgrade_driver(node: BuiltNode, new: BuiltNode) -> None:
    """Install ``new``'s driver files over ``node``'s, then its /proc (the module load)."""
    for top in sorted(os.listdir(new.driver_root)):
        if top not in ("dev", "proc", "sys", "simnode.json"):
            _overlay(new.driver_root, node.driver_root, top)
    _overlay(new.proc_root, node.proc_root, "proc")


def apply_mig(node: BuiltNode, new: BuiltNode) -> None:
    """Create ``new``'s MIG capability device nodes in ``node``, then its /proc tree."""
    for entry in new.manifest["device_nodes"]:
        path = node.dev_root / entry["path"].lstrip("/")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(path, stat.S_IFCHR | entry["mode"],
                     os.makedev(entry["major"], entry["minor"]))
            os.chmod(path, entry["mode"])
    _overlay(new.proc_root, node.proc_root, "proc")
