"""How a one-shot command process ends."""

from __future__ import annotations

import gc
import sys

TYPE_CHECKING = False  # typing would cost every hook process's start-up; only mypy needs it
if TYPE_CHECKING:
    from typing import NoReturn


def finish(status: int) -> NoReturn:
    """Exit with ``status``, skipping the final collection of what lived until now.

    At exit the interpreter walks every object still tracked by the cyclic collector, and a
    command that just built a spec leaves tens of thousands, paid for nothing (what that
    costs ``nri-cdi generate``: bench/reports/2026-11-27-generator-stdlib-2-cores).
    ``gc.freeze()`` moves them out of the collector's reach; finalizers, atexit handlers
    and stream flushing still run.  Only for process entry points: a long-lived caller must
    never freeze its heap.
    """
    gc.freeze()
    sys.exit(status)
