"""createContainer hooks that are safe by construction: ``create-symlinks`` and
``update-ldcache`` act only inside the container root (see :mod:`cdi.hooks.rootfs`) and
execute nothing from the image.  How a spec must invoke them: :mod:`cdi.hooks.entry`; one
process runs every operation a container needs: :mod:`cdi.hooks.cli`."""
