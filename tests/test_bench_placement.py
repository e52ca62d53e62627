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
                                   ["plain", "plugin", "baseline", "reference", "noop"],
                                   ["plain", "plugin", "reference", "noop", "floor"]])
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


def test_the_blocks_interval_counts_what_blocks_share() -> None:
    """Rounds that share a block's offset (its placement) are not independent: resampling
    whole blocks widens the interval that resampling rounds gives; with no offsets, the
    two are alike."""
    bench = _bench()
    noise = [((i * 7919) % 101 - 50) / 1000 for i in range(16 * 40)]  # small, fixed
    offsets = [(-1) ** b * 0.5 * (b % 4) for b in range(16)]  # placements differ a lot
    shifted = [v + offsets[i // 40] for i, v in enumerate(noise)]
    rounds = [40] * 16
    _, low, high = bench.interval(shifted)
    block_low, block_high = bench.block_interval(shifted, rounds)
    assert block_high - block_low > 3 * (high - low)
    _, low, high = bench.interval(noise)
    block_low, block_high = bench.block_interval(noise, rounds)
    assert block_high - block_low < 3 * (high - low)


def test_the_blocks_must_cover_the_values() -> None:
    with pytest.raises(ValueError, match="do not split into blocks"):
        _bench().block_interval([1.0] * 10, [4, 4])
