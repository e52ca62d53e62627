"""Regenerate the committed protobuf modules from our own ``.proto`` files.

    python3 scripts/generate_protobuf.py            # rewrite *_pb2.py / *_pb2.pyi in place
    python3 scripts/generate_protobuf.py --check    # exit 1 if the committed files are stale

Needs ``grpcio-tools`` (a test/dev dependency only; the plugin itself needs just
``protobuf``). protoc runs with the repository root as include path so the
descriptors are registered as ``nri_plugin/nri/api/<name>.proto``: a name no other
package in the default descriptor pool is likely to use.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_DIR = ROOT / "nri_plugin" / "nri" / "api"
PROTOS = ("nri.proto", "ttrpc.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi")


def generate(out_root: Path) -> dict[str, bytes]:
    """Run protoc into ``out_root``; return {file name: content} of the outputs."""
    from grpc_tools import protoc  # here: only a dev dependency

    rel = [str((API_DIR / name).relative_to(ROOT)) for name in PROTOS]
    args = ["protoc", f"-I{ROOT}", f"--python_out={out_root}", f"--pyi_out={out_root}", *rel]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    out_dir = out_root / API_DIR.relative_to(ROOT)
    return {
        Path(name).stem + suffix: (out_dir / (Path(name).stem + suffix)).read_bytes()
        for name in PROTOS
        for suffix in SUFFIXES
    }


def stale_files() -> list[str]:
    """Names of committed generated files that differ from a fresh protoc run."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    stale = []
    for name, content in sorted(fresh.items()):
        path = API_DIR / name
        if not path.exists() or path.read_bytes() != content:
            stale.append(name)
    return stale


def write_in_place() -> list[str]:
    """Regenerate into the package directory; return the names written."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    for name, content in fresh.items():
        (API_DIR / name).write_bytes(content)
    return sorted(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/generate_protobuf.py")
    parser.add_argument("--check", action="store_true", help="only compare, exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: nri_plugin/nri/api/{name}", file=sys.stderr)
        return 1 if stale else 0
    for name in write_in_place():
        print(f"wrote nri_plugin/nri/api/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
