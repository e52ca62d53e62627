"""Regenerate the committed protobuf modules from our own ``.proto`` files.

    python3 scripts/generate_protobuf.py            # rewrite *_pb2.py / *_pb2.pyi in place
    python3 scripts/generate_protobuf.py --check    # exit 1 if the committed files are stale

Needs ``grpcio-tools`` (a test/dev dependency only; the plugin itself needs just
``protobuf``). protoc runs with the repository root as include path so the
descriptors are registered under their repository path (``nri_plugin/nri/api/nri.proto``): a
name no other package in the default descriptor pool is likely to use.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each .proto of ours, by repository path; its modules are written beside it.
PROTOS = ("nri_plugin/nri/api/nri.proto", "nri_plugin/nri/api/ttrpc.proto",
          "nri_plugin/ops/kubelet_api/podresources.proto",
          "nri_plugin/ops/kubelet_api/registration.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi")


def generate(out_root: Path) -> dict[str, bytes]:
    """Run protoc into ``out_root``; return {repository path: content} of the outputs."""
    from grpc_tools import protoc  # here: only a dev dependency

    args = ["protoc", f"-I{ROOT}", f"--python_out={out_root}", f"--pyi_out={out_root}",
            *PROTOS]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    outputs = [name.removesuffix(".proto") + suffix for name in PROTOS for suffix in SUFFIXES]
    return {name: (out_root / name).read_bytes() for name in outputs}


def stale_files() -> list[str]:
    """Names of committed generated files that differ from a fresh protoc run."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    stale = []
    for name, content in sorted(fresh.items()):
        path = ROOT / name
        if not path.exists() or path.read_bytes() != content:
            stale.append(name)
    return stale


def write_in_place() -> list[str]:
    """Regenerate into the package directory; return the names written."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    for name, content in fresh.items():
        (ROOT / name).write_bytes(content)
    return sorted(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/generate_protobuf.py")
    parser.add_argument("--check", action="store_true", help="only compare, exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {name}", file=sys.stderr)
        return 1 if stale else 0
    for name in write_in_place():
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
