"""nri_plugin.plugins."""
