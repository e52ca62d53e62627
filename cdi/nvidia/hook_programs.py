"""The programs a spec's hook entries can name (``--hook-path``, ``generate.hook_path``),
recognised by their file name: the name decides the argument layout the generator writes.

One home for the names: the generator writes by them, and the configuration file is
checked against them without importing the generator.
"""

from __future__ import annotations

# ``nri-cdi`` and ``nri-cdi-hook`` (our static launcher, built by ``nri-cdi hook
# build-static-launcher PATH``) take the subcommand first and every operation in one entry;
# NVIDIA's two take the same subcommands and flags as ours under another argv prefix
# and env, one hook per entry.
NVIDIA_HOOK_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk")
HOOK_PROGRAMS = ("nri-cdi", "nri-cdi-hook", *NVIDIA_HOOK_PROGRAMS)
