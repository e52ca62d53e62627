"""``nri-cdi doctor --e2e`` and the private-containerd helpers it shares with tests/e2e:
paths (the install script's cache), containerd (a private daemon), cri (a CRI client),
images (OCI archives without a registry), plugin (our plugin as a process), check (the run)."""
