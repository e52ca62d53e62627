"""NVIDIA's createContainer hook operations (``enable-cuda-compat``,
``disable-device-node-modification``, ``mask-proc``), with the names and flags of
``nvidia-cdi-hook``'s.  They run in the same one hook process as the neutral operations of
:mod:`cdi.hooks`, which finds them through :data:`cdi.nvidia.hooks.operations.OPERATIONS`."""
