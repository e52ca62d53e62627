"""nri_plugin.plugins.cdi_injector."""
