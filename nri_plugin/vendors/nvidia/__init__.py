"""nri_plugin.vendors.nvidia."""
