"""``generate`` as a script: ``PYTHON -I /abs/path/to/cdi/nvidia/__main__.py [OPTIONS]``
(what ``nri-cdi refresh`` and ``watch`` run). Under ``-I`` the current folder is not on
``sys.path``, so the folder holding the ``cdi`` package comes from this file's own path; its
dependencies come from the interpreter's site-packages. ``python3 -m cdi.nvidia`` works as
well.
"""

from __future__ import annotations

import os
import sys

if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))

from cdi.nvidia.cli import main
from cdi.process import finish

if __name__ == "__main__":
    finish(main())
