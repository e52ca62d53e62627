"""The NVIDIA CDI spec generator (``nri-cdi generate``) and NVIDIA's hook operations
(:mod:`cdi.nvidia.hooks`). Imports nothing: a process takes only the modules it uses."""
