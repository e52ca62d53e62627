"""The CRI client the e2e tests drive containerd with (the product's node_check.cri)."""

from nri_cdi_testbed.node_check.cri import CriClient, ExecResult

__all__ = ["CriClient", "ExecResult"]
