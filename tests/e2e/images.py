"""Re-export of nri_plugin/ops/node_check/images.py (shared with doctor --e2e)."""

from nri_plugin.ops.node_check.images import *  # noqa: F403
