"""Re-export of nri_plugin/ops/node_check/containerd.py (shared with doctor --e2e)."""

from nri_plugin.ops.node_check.containerd import *  # noqa: F403
