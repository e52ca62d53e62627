"""Lean ``generate`` entry: ``PYTHON -I -S /abs/path/to/cdi/nvidia/__main__.py [OPTIONS]``.

Start-up without ``site`` (no ``.pth`` files, no site-packages scan) is most of what a
``generate`` run costs on a node whose site-packages carry editable installs or CA
bundles.  The folder holding the ``cdi`` package comes from this file's own path;
``--mode nvml`` finds nvidia-ml-py in the interpreter's site-packages when it needs it
(``cdi.nvidia.discover.load_nvml``).  ``python3 -m cdi.nvidia`` works as well.
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
