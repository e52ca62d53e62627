"""A private containerd for the e2e tests (the product's node_check.containerd)."""

from nri_plugin.ops.node_check.containerd import Containerd, ContainerdError

__all__ = ["Containerd", "ContainerdError"]
