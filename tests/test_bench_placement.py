"""bench_containerd's placement of roles on containerds: each kind measured on each
containerd alike (two containerds serving the same thing differ by more than the
differences the bench is there to measure)."""

from __future__ import annotations

import importlib.util
import itertools
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_containerd.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_containerd", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("roles", [["plain", "plugin"], ["plain", "plugin", "reference"],
                                   ["plain", "plugin", "baseline", "reference", "noop"]])
@pytest.mark.parametrize("rotations", [1, 2, 3])
def test_every_role_on_every_containerd_alike(roles: list[str], rotations: int) -> None:
    blocks = _bench().placements(roles, rotations * len(roles))
    assert len(blocks) == rotations * len(roles)
    for where in blocks:
        assert sorted(where) == sorted(roles)
        assert sorted(where.values()) == list(range(len(roles)))  # one role per containerd
    for role in roles:
        visits = Counter(where[role] for where in blocks)
        assert visits == dict.fromkeys(range(len(roles)), rotations)
    # the roles move: no block repeats the one before it
    assert all(a != b for a, b in itertools.pairwise(blocks))
