"""NVIDIA's createContainer hook operations, with the names and flags of ``nvidia-cdi-hook``'s
(:data:`cdi.nvidia.hooks.operations.OPERATIONS`)."""
