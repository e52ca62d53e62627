"""nri_plugin.ops."""
