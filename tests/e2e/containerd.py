"""A private containerd for the e2e tests (the product's node_check.containerd)."""

from nri_cdi_testbed.node_check.containerd import Containerd, ContainerdError

__all__ = ["Containerd", "ContainerdError"]
