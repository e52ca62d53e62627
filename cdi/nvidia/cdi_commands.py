"""``nri-cdi list``, ``validate`` and ``inject`` as ``nvidia-ctk cdi`` has them: the neutral
commands of :mod:`cdi.cli`, reading nvidia-ctk's spec-folder variable when no
``--spec-dir`` is given."""

from __future__ import annotations

from typing import Any

from cdi import cli

SPEC_DIRS_ENV = "NVIDIA_CTK_CDI_SPEC_DIRS"  # nvidia-ctk cdi list's variable (comma-separated)


def add_commands(subparsers: Any) -> None:
    cli.add_commands(subparsers, spec_dirs_env=SPEC_DIRS_ENV)
