"""Several runs of bench_containerd.py (``--save``) pooled: the per-round comparisons of
every run of one containerd together, with a bootstrap interval that resamples whole
blocks within each run.

One run's interval is about +-0.1 ms wide for CreateContainer and +-1 % for Create+Start
on this project's 2-core VM, and the machine's speed drifts from hour to hour, so one run
can meet or miss a goal by chance. Each comparison here is per round (every kind measured
in the same round), so pooling rounds of different hours compares like with like; the
rounds of a block share its placement of the kinds on the containerds, and a run its
hour, so the interval resamples blocks, run by run (each run keeps its number of blocks),
never single rounds.

Run: ``python3 bench/pool_containerd.py RUN.json [RUN.json ...]``. Each file is one run's
``bench_containerd.py --runtime V --save RUN.json``; runs of several containerds are
pooled per containerd.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One run as ``bench_containerd.py --save`` writes it (JSON).
Saved = dict[str, Any]

# One comparison: its name, the part of a run it reads ("create_start", "create", "start"
# or "create_cpu"), the two kinds it compares, and per round (a, b) -> value. Names of
# values in milliseconds end with "(ms)", in microseconds with "(us)".
Comparison = tuple[str, str, str, str, Callable[[float, float], float]]
# What the kinds are called in the comparisons' names.
_SAID = {"plugin": "ours", "noop": "no-op"}
_PART = {"create_start": "Create+Start", "create": "CreateContainer", "start": "Start",
         "create_cpu": "plugin CPU per CreateContainer"}
# How each unit's values are printed (a ratio: no unit), one run's report and the pool's.
FORMS = {"(ms)": "+.3f", "(us)": "+.0f", "": ".4f"}


def _ratio(part: str, mine: str, other: str) -> Comparison:
    return (f"{_PART[part]} {_SAID.get(mine, mine)} / {_SAID.get(other, other)}", part,
            mine, other, lambda a, b: a / b)


def _difference(part: str, mine: str, other: str) -> Comparison:
    return (f"{_PART[part]} {_SAID.get(mine, mine)} - {_SAID.get(other, other)} (ms)", part,
            mine, other, lambda a, b: (a - b) * 1000)


def _cpu_difference(mine: str, other: str) -> Comparison:
    """The two plugin processes' CPU (all threads) during their CreateContainer."""
    return (f"{_PART['create_cpu']} {_SAID.get(mine, mine)} - {_SAID.get(other, other)} "
            "(us)", "create_cpu", mine, other, lambda a, b: (a - b) * 1e6)


def unit(comparison: Comparison) -> str:
    """"(ms)", "(us)" or "" (a ratio)."""
    name = comparison[0]
    return next((u for u in ("(ms)", "(us)") if name.endswith(u)), "")


# Every per-round comparison, for one run (bench_containerd's report) and pooled runs
# alike; each where a run has both its kinds. "floor" (--floor) is native CDI with the
# no-op plugin connected, the least any injection through NRI costs: ours / native is
# (floor / native) x (ours / floor). The no-op's containers get no devices: it is
# compared with no injection.
COMPARISONS: tuple[Comparison, ...] = (
    _ratio("create_start", "plugin", "native"),
    _ratio("create_start", "plugin", "reference"),
    _ratio("create_start", "plugin", "baseline"),
    _ratio("create_start", "reference", "native"),
    _ratio("create_start", "noop", "none"),
    _ratio("create_start", "floor", "native"),
    _ratio("create_start", "plugin", "floor"),
    _ratio("create_start", "reference", "floor"),
    _difference("create", "plugin", "reference"),
    _difference("create", "plugin", "baseline"),
    _difference("create", "plugin", "noop"),
    _difference("create", "plugin", "floor"),
    _difference("start", "plugin", "native"),
    _difference("start", "plugin", "floor"),
    _difference("start", "plugin", "reference"),
    _difference("start", "plugin", "baseline"),
    _difference("start", "floor", "native"),
    _cpu_difference("plugin", "reference"),
    _cpu_difference("plugin", "baseline"),
)


def per_round(parts: Saved, comparison: Comparison) -> list[float] | None:
    """``comparison``'s value in each round of one run (``parts``: its per-kind times by
    part, as saved), or None where the run lacks either kind."""
    _, part, mine, other, value = comparison
    kinds = parts[part]
    if mine not in kinds or other not in kinds:
        return None
    return [value(a, b) for a, b in zip(kinds[mine], kinds[other], strict=True)]


@dataclass(frozen=True, slots=True)
class Run:
    """One saved run: its per-round values of one comparison, cut into its blocks."""

    name: str
    blocks: tuple[tuple[float, ...], ...]


def split(values: Sequence[float], block_rounds: Sequence[int]) -> tuple[tuple[float, ...], ...]:
    """``values`` (one per round, in order) cut into blocks of ``block_rounds`` rounds."""
    if sum(block_rounds) != len(values) or len(block_rounds) < 2:
        raise ValueError(f"{len(values)} values do not split into blocks of {block_rounds}")
    blocks, start = [], 0
    for count in block_rounds:
        blocks.append(tuple(values[start:start + count]))
        start += count
    return tuple(blocks)


def pooled(runs: Sequence[Run], resamples: int = 2000,
           seed: int = 0) -> tuple[float, float, float]:
    """The median of every round of ``runs`` and a bootstrap 95 % interval for it that
    draws, for each run, as many of its blocks as it has (with replacement)."""
    everything = [value for run in runs for block in run.blocks for value in block]
    draw = random.Random(seed)
    medians = sorted(
        statistics.median([value for run in runs
                           for block in draw.choices(run.blocks, k=len(run.blocks))
                           for value in block])
        for _ in range(resamples))
    return (statistics.median(everything), medians[int(resamples * 0.025)],
            medians[int(resamples * 0.975) - 1])


def comparison_runs(saved: Sequence[tuple[str, Saved]],
                    comparison: Comparison) -> list[Run]:
    """Each saved run's per-round values of ``comparison`` (runs without both kinds left
    out)."""
    runs = []
    for name, data in saved:
        values = per_round(data, comparison)
        if values is not None:
            runs.append(Run(name, split(values, data["block_rounds"])))
    return runs


def report(version: str, saved: Sequence[tuple[str, Saved]]) -> None:
    rounds = sum(len(data["create_start"]["plugin"]) for _, data in saved)
    names = ", ".join(f"{name} ({data['plugin_commit']})" for name, data in saved)
    print(f"containerd {version}: {len(saved)} runs, {rounds} rounds ({names})")
    for comparison in COMPARISONS:
        runs = comparison_runs(saved, comparison)
        if not runs:
            continue
        form = FORMS[unit(comparison)]
        each = ", ".join(f"{statistics.median(v for b in run.blocks for v in b):{form}}"
                         for run in runs)
        mid, low, high = pooled(runs)
        print(f"    {comparison[0]}: pooled {mid:{form}} ({low:{form}} to {high:{form}}); "
              f"each run {each}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench_containerd.py --save files")
    args = parser.parse_args()
    by_version: dict[str, list[tuple[str, Saved]]] = {}
    for path in args.runs:
        try:
            data = json.loads(path.read_text())
            version = data["containerd"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sys.exit(f"{path}: not a bench_containerd.py --save file: {exc}")
        by_version.setdefault(version, []).append((path.name, data))
    for version, saved in sorted(by_version.items()):
        report(version, saved)


if __name__ == "__main__":
    main()
