"""The test bed: tools to try nri-cdi without a GPU or against a real one, not the product.

* ``simnode``: a simulated GPU node (real ELF libraries, device nodes, ``/proc``, an NVML
  that answers from a description) that the generator reads like a real node;
* ``node_check``: a private containerd, a CRI client, OCI images and a probe, which
  ``nri-cdi doctor --e2e``, the demo and the end-to-end tests run a real container with.

The CDI library (``cdi``) and the plugin (``nri_plugin``) never import this package; only
the doctor's ``--e2e`` does, when it is asked for (``tests/test_layering.py``).
"""
