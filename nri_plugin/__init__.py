"""The containerd NRI plugin, in layers (docs/developer/architecture.md):

- ``nri_plugin.nri``: the NRI runtime library (wire, messages, stub, dispatch, the plugin
  API); it knows nothing of CDI or of any vendor;
- ``nri_plugin.plugins``: plugins built on it (the vendor-neutral CDI injector);
- ``nri_plugin.vendors``: vendor rules the injector applies, behind one interface;
- ``nri_plugin.ops``: operations (the ``nri-cdi`` command, daemon, settings, doctor, ...).

This module imports nothing: ``nri-cdi`` passes through it for every subcommand.
"""
