"""A static launcher for the hooks: ``nri-cdi hook build-static-launcher PATH``.

A statically linked program has no dynamic loader for ``LD_PRELOAD`` and its kin to act
on; it throws its environment away and executes ``PYTHON -I -S ENTRY_SCRIPT ARGS...`` with
:data:`~cdi.hooks.entry.HOOK_ENV`, both paths fixed when it is built. Building needs a C
compiler and a static libc (Debian: ``gcc`` and ``libc6-dev``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from cdi.hooks.entry import ENTRY_SCRIPT, HOOK_ENV, interpreter

_SAFE = re.compile(r"^[A-Za-z0-9._+/=:-]+$")  # nothing that needs escaping in a C string

_SOURCE = """\
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char *const clean_env[] = {{ {env}, NULL }};

int main(int argc, char **argv)
{{
    char **args = calloc((size_t)argc + 4, sizeof *args);
    int n = 0;
    if (args == NULL)
        return 127;
    args[n++] = "{python}";
    args[n++] = "-I";
    args[n++] = "-S";
    args[n++] = "{script}";
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    execve("{python}", args, clean_env);
    perror("nri-cdi hook launcher: execve {python}");
    return 127;
}}
"""


class LauncherError(Exception):
    """The launcher cannot be built; says why."""


def launcher_source(*, python: str) -> str:
    for what, value in (("python", python), ("script", ENTRY_SCRIPT),
                        *(("env", e) for e in HOOK_ENV)):
        if not _SAFE.match(value) or (what != "env" and not value.startswith("/")):
            raise LauncherError(f"{what} {value!r}: want an absolute path of [A-Za-z0-9._+/=:-]")
    env = ", ".join(f'"{e}"' for e in HOOK_ENV)
    return _SOURCE.format(python=python, script=ENTRY_SCRIPT, env=env)


def build_launcher(dest: str, *, python: str | None = None) -> str:
    """Compile the launcher to ``dest`` (mode 0755, replaced atomically); returns ``dest``."""
    source = launcher_source(python=python or interpreter())
    folder = os.path.dirname(os.path.abspath(dest))
    fd, tmp = tempfile.mkstemp(prefix=".nri-cdi-launcher.", dir=folder)
    os.close(fd)
    try:
        proc = subprocess.run(["cc", "-static", "-Os", "-s", "-x", "c", "-", "-o", tmp],
                              input=source.encode(), capture_output=True, check=False)
        if proc.returncode:
            raise LauncherError(f"cc -static failed: {proc.stderr.decode(errors='replace')}")
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
    except FileNotFoundError:
        raise LauncherError("no C compiler 'cc'; install gcc and libc6-dev") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
