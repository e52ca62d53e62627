"""End-to-end tests against a real containerd (see README.md in this folder)."""
