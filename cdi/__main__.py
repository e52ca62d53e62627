import sys

from cdi.cli import run

sys.exit(run())
