"""Hook-free mode: hand the injected library folders to the loader through LD_LIBRARY_PATH.

A CDI ``env`` entry replaces a variable by name, so a spec cannot *append* to the image's
``LD_LIBRARY_PATH``.  The generator therefore writes the folders under
:data:`EXTRA_LIBRARY_PATH_ENV`, and whoever applies the edits (the NRI plugin) calls
:func:`merge_library_path` on the container's final environment: the folders are appended
to the image's value (the image's own choices, such as a vendor's forward-compat libraries,
keep priority) and :data:`EXTRA_LIBRARY_PATH_ENV` is removed.  Empty elements are dropped on
purpose: in ``LD_LIBRARY_PATH`` an empty element means the current folder.
"""

from __future__ import annotations

from collections.abc import Sequence

# The folders a spec hands over, to be appended to the loader's path (the one definition:
# the generator imports it).
EXTRA_LIBRARY_PATH_ENV = "NRI_CDI_LD_LIBRARY_PATH"
LD_LIBRARY_PATH_ENV = "LD_LIBRARY_PATH"  # the dynamic loader's search path


def merge_library_path(env: Sequence[str]) -> tuple[str, ...]:
    """``env`` (``NAME=value`` strings, last one wins) with :data:`EXTRA_LIBRARY_PATH_ENV`
    folded into ``LD_LIBRARY_PATH``; unchanged when :data:`EXTRA_LIBRARY_PATH_ENV` is
    absent."""
    values = dict(_split(e) for e in env)
    if EXTRA_LIBRARY_PATH_ENV not in values:
        return tuple(env)
    parts = [*values.get(LD_LIBRARY_PATH_ENV, "").split(":"),
             *values[EXTRA_LIBRARY_PATH_ENV].split(":")]
    merged = ":".join(dict.fromkeys(p for p in parts if p))
    out = [e for e in env if _split(e)[0] not in (EXTRA_LIBRARY_PATH_ENV, LD_LIBRARY_PATH_ENV)]
    if merged:
        out.append(f"{LD_LIBRARY_PATH_ENV}={merged}")
    return tuple(out)


def _split(entry: str) -> tuple[str, str]:
    name, _, value = entry.partition("=")
    return name, value
