"""Container Device Interface (CDI): specs, qualified names, the spec registry and applying
edits to OCI runtime specs (docs/developer/cdi-library.md). Vendor-neutral; a vendor's
generator and hook operations live in a subpackage of their own.

This module imports nothing: every hook process and ``nri-cdi generate`` pass through it,
and take from the library only the modules they use.
"""
