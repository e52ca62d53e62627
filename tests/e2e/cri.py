"""Re-export of nri_plugin/ops/node_check/cri.py (shared with doctor --e2e)."""

from nri_plugin.ops.node_check.cri import *  # noqa: F403
