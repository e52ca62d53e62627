"""``python -m nri_cdi_testbed.simnode``."""

import sys

from nri_cdi_testbed.simnode.cli import main

sys.exit(main())
