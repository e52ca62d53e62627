"""Re-export of nri_plugin/ops/node_check/plugin.py (shared with doctor --e2e)."""

from nri_plugin.ops.node_check.plugin import *  # noqa: F403
