"""The e2e tests use the product's private-containerd helpers (nri_plugin/ops/node_check)."""

from nri_plugin.ops.node_check.paths import *  # noqa: F403
from nri_plugin.ops.node_check.paths import REPO  # noqa: F401
