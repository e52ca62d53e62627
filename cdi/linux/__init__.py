"""Generic Linux binary formats, one module per format, vendor-neutral and pure where they
can be: ``elf`` (SONAME and dynamic section of a shared object) and ``ldcache`` (glibc's
``ld.so.cache``: reader, in-root lookup and writer). Used by the hooks and the vendor
generators; imports nothing from the generators or ``cdi.hooks``."""
