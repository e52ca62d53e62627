"""``python -m cdi.nvidia.simnode``."""

import sys

from cdi.nvidia.simnode.cli import main

sys.exit(main())
