"""Isolated hook entry: ``PYTHON -I -S /abs/path/to/cdi/hooks/__main__.py OPERATION ...``.
Under ``-I -S`` neither the current folder nor site-packages is on ``sys.path``, so the
folder holding ``cdi`` (from this file's own absolute path, written in the spec) goes first.
"""

from __future__ import annotations

import os
import sys

if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

from cdi.hooks.cli import main
from cdi.process import finish

if __name__ == "__main__":
    os.chdir("/")  # runc may start us inside the container root; we use no relative path
    finish(main())
