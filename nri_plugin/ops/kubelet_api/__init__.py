"""The kubelet's gRPC APIs nri-cdi reads, as message definitions of our own."""
