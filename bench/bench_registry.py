"""Registry load + resolve versus a plain ``yaml.safe_load`` of the same files.

Builds 200 spec files (each a small vendor spec: 8 devices with device nodes, env and a
few mounts, plus spec-level edits), then, interleaved in one run so that machine noise
hits both sides alike:

- floor: read every file and ``yaml.safe_load`` it (what any loader must at least do);
- floor (libyaml): the same with ``yaml.CSafeLoader``;
- registry: ``SpecCache(dirs).refresh()`` from cold (parse, strict checks, validation,
  host device fill-in, conflict resolution) and ``resolve`` of 8 devices.

Prints medians and the ratio registry / floor. Run: ``python3 bench/bench_registry.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdi.cache import SpecCache


def spec_text(index: int) -> str:
    devices = []
    for d in range(8):
        devices.append(f"""\
  - name: "{d}"
    containerEdits:
      env: [DEVICE_{d}=present]
      deviceNodes:
        - {{path: /dev/bench{index}-{d}, hostPath: /dev/null, type: c, major: 1, minor: 3}}
      mounts:
        - {{hostPath: /usr/lib/bench/{index}/{d}, containerPath: /opt/bench/{d},
           options: [ro, nosuid, nodev, bind]}}
""")
    mounts = "".join(
        f"    - {{hostPath: /usr/lib/libbench{m}.so.1, containerPath: /usr/lib/libbench{m}.so.1,"
        " options: [ro, nosuid, nodev, bind]}\n"
        for m in range(10)
    )
    return (
        f"cdiVersion: 0.5.0\nkind: bench{index}.example.com/dev\ncontainerEdits:\n"
        f"  env: [BENCH={index}]\n  mounts:\n{mounts}"
        "  hooks:\n    - {hookName: createContainer, path: /usr/bin/true, args: ['true']}\n"
        f"devices:\n{''.join(devices)}"
    )


def make_dir(root: Path, count: int) -> Path:
    folder = root / "cdi"
    folder.mkdir()
    for index in range(count):
        (folder / f"bench{index:03}.yaml").write_text(spec_text(index))
    return folder


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_dir(Path(tmp), args.files)
        files = sorted(folder.iterdir())
        wanted = [f"bench{i * 20}.example.com/dev={i % 8}" for i in range(8)]

        def floor() -> None:
            for path in files:
                yaml.safe_load(path.read_bytes())

        def floor_c() -> None:
            for path in files:
                yaml.load(path.read_bytes(), Loader=yaml.CSafeLoader)

        def registry() -> None:
            snapshot = SpecCache([str(folder)]).refresh()
            assert len(snapshot.devices) == 8 * args.files and not snapshot.errors
            snapshot.resolve(wanted)

        snapshot = SpecCache([str(folder)]).refresh()
        samples: dict[str, list[float]] = {"floor": [], "floor_c": [], "registry": []}
        resolve_us = []
        for _ in range(args.rounds):
            samples["floor"].append(timed(floor))
            samples["floor_c"].append(timed(floor_c))
            samples["registry"].append(timed(registry))
            resolve_us.append(timed(lambda: snapshot.resolve(wanted)) * 1e6)
    med = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    print(f"{args.files} spec files x 8 devices, {args.rounds} interleaved rounds (medians)")
    print(f"  yaml.safe_load (pure-Python loader)  {med['floor']:8.1f} ms   floor")
    print(f"  yaml CSafeLoader (libyaml)           {med['floor_c']:8.1f} ms")
    print(f"  SpecCache.refresh + resolve 8        {med['registry']:8.1f} ms")
    print(f"  ratio registry / safe_load floor     {med['registry'] / med['floor']:8.2f}")
    print(f"  ratio registry / CSafeLoader         {med['registry'] / med['floor_c']:8.2f}")
    print(f"  resolve 8 devices on a loaded snapshot {statistics.median(resolve_us):6.1f} us")


if __name__ == "__main__":
    main()
