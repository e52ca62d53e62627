"""What building a node needs from the host besides gcc: glibc's ldconfig, unix sockets."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from nri_cdi_testbed.simnode.layout import SimNodeError


def find_ldconfig() -> str:
    for cand in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if cand and os.access(cand, os.X_OK):
            # Ubuntu ships a wrapper script; the real binary sits next to it.
            real = cand + ".real"
            return real if os.access(real, os.X_OK) else cand
    raise SimNodeError("building a simulated node needs glibc's ldconfig")


def make_socket(path: Path) -> None:
    """A bound unix socket file at ``path``; binds in a short temp dir, then renames.

    sun_path holds at most 107 bytes, which deep test folders exceed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="simsock")
    try:
        tmp = os.path.join(tmpdir, "s")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(tmp)
        os.chmod(tmp, 0o666)
        shutil.move(tmp, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
