"""``nri-cdi doctor --e2e``: check.py runs the checks, on the node's containerd or on a private
one. What it is made of is also this package's API (tests/e2e and scripts/demo_node.py use it):
paths (where scripts/install-containerd.sh puts containerd), containerd (a private daemon),
cri (a CRI client), images (OCI archives without a registry), plugin (``nri-cdi plugin`` as a
process). Test fixtures and test-only helpers live in tests/e2e."""
