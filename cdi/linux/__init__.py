"""cdi.linux."""
