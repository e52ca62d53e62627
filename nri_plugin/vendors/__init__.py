"""nri_plugin.vendors."""
