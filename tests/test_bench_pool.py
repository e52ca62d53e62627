"""bench/pool_containerd.py: several bench_containerd.py runs pooled, the interval
resampling blocks within each run; and ``--save``, which writes what it reads."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


pool = _load("pool_containerd")


def test_split_cuts_rounds_into_their_blocks() -> None:
    assert pool.split([1.0, 2.0, 3.0, 4.0, 5.0], [2, 3]) == ((1.0, 2.0), (3.0, 4.0, 5.0))
    with pytest.raises(ValueError, match="do not split"):
        pool.split([1.0, 2.0, 3.0], [2, 2])
    with pytest.raises(ValueError, match="do not split"):
        pool.split([1.0, 2.0], [2])  # one block: nothing to resample


def test_each_run_keeps_its_share_of_blocks() -> None:
    """Blocks are drawn run by run: a resample never holds more of one run's rounds than
    that run gave. Resampling all blocks together would let one run's hour fill whole
    resamples (here: medians of 0 or 10 instead of always 5)."""
    fast = pool.Run("fast", tuple((0.0,) * 10 for _ in range(4)))
    slow = pool.Run("slow", tuple((10.0,) * 10 for _ in range(4)))
    assert pool.pooled([fast, slow]) == (5.0, 5.0, 5.0)


def test_pooling_agreeing_runs_narrows_the_interval() -> None:
    draw = random.Random(7)

    def run(name: str) -> object:
        return pool.Run(name, tuple(tuple(draw.gauss(1.0, 0.05) for _ in range(50))
                                    for _ in range(8)))

    runs = [run(f"run{i}") for i in range(4)]
    _, low_one, high_one = pool.pooled(runs[:1])
    mid, low, high = pool.pooled(runs)
    assert low <= mid <= high
    assert high - low < (high_one - low_one) * 0.75


def _saved(kinds: tuple[str, ...], rounds: int = 4) -> dict[str, object]:
    per_kind = {kind: [0.050 + index / 1000 + k / 10000 for k in range(rounds)]
                for index, kind in enumerate(kinds)}
    return {"containerd": "2.1", "plugin_commit": "abc", "block_rounds": [2, rounds - 2],
            "create_start": per_kind, "create": per_kind, "start": per_kind,
            "create_cpu": {}}


def test_a_comparison_is_per_round_and_skips_runs_without_its_kinds() -> None:
    with_reference = _saved(("none", "native", "plugin", "reference"))
    without = _saved(("none", "native", "plugin"))
    name, *_ = comparison = next(c for c in pool.COMPARISONS
                                 if c[0] == "CreateContainer ours - reference (ms)")
    runs = pool.comparison_runs([("a", with_reference), ("b", without)], comparison)
    assert [run.name for run in runs] == ["a"]
    # plugin is kind 2, reference kind 3: 1 ms apart in every round
    assert [round(v, 6) for block in runs[0].blocks for v in block] == [-1.0] * 4
    assert name.endswith("(ms)")


def test_the_floor_splits_ours_over_native_round_by_round() -> None:
    """floor / native times ours / floor is ours / native in every round: each of the
    three reads the kinds it names (a swapped pair would break the product)."""
    saved = [("a", _saved(("none", "native", "plugin", "reference", "noop", "floor")))]

    def values(name: str) -> list[float]:
        comparison = next(c for c in pool.COMPARISONS if c[0] == name)
        (run,) = pool.comparison_runs(saved, comparison)
        return [v for block in run.blocks for v in block]

    whole = values("Create+Start ours / native")
    floor, ours = values("Create+Start floor / native"), values("Create+Start ours / floor")
    assert [f * o for f, o in zip(floor, ours, strict=True)] == pytest.approx(whole)
    assert all(f > 1 for f in floor) and all(o < 1 for o in ours)  # floor is kind 5
    # Start floor - native: kinds 5 and 1, 4 ms apart in every round
    assert values("Start floor - native (ms)") == pytest.approx([4.0] * 4)


def test_plugin_cpu_is_compared_round_by_round_in_microseconds() -> None:
    """The plugin processes' CPU during their CreateContainer, ours less the reference's
    in each round, in microseconds; a run without CPU figures has no such comparison."""
    data = _saved(("none", "native", "plugin", "reference"))
    data["create_cpu"] = {"plugin": [0.000500, 0.000480, 0.000470, 0.000450],
                          "reference": [0.000490, 0.000490, 0.000490, 0.000490]}
    comparison = next(c for c in pool.COMPARISONS
                      if c[0] == "plugin CPU per CreateContainer ours - reference (us)")
    assert pool.unit(comparison) == "(us)" and pool.FORMS["(us)"] == "+.0f"
    (run,) = pool.comparison_runs([("a", data)], comparison)
    assert [v for block in run.blocks for v in block] == pytest.approx([10, -10, -20, -40])
    assert pool.pooled([run])[0] == pytest.approx(-15)
    assert pool.comparison_runs([("b", _saved(("plugin", "reference")))], comparison) == []


def test_save_writes_what_the_pool_reads(tmp_path: Path) -> None:
    bench = _load("bench_containerd")
    samples = {"none": [0.05, 0.06, 0.07], "native": [0.051, 0.061, 0.071],
               "plugin": [0.052, 0.062, 0.072]}
    bench.BLOCK_ROUNDS[:] = [2, 1]
    bench.CREATE_ONLY.update({kind: [v / 10 for v in values] for kind, values in samples.items()})
    bench.save(tmp_path / "run.json", "1.7", samples)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["containerd"] == "1.7" and data["plugin_commit"] != ""
    comparison = pool.COMPARISONS[0]  # Create+Start ours / native
    (run,) = pool.comparison_runs([("run", data)], comparison)
    assert [len(block) for block in run.blocks] == [2, 1]
    assert run.blocks[0][0] == pytest.approx(0.052 / 0.051)
