"""The CDI subcommands of ``nri-cdi``: ``list``, ``validate``, ``inject``.

Thin: each command parses its arguments, calls the library and prints. The ``nri-cdi``
entry point (``nri_plugin.ops.cli``) adds these to its parser with ``add_commands``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cdi.cache import SpecCache
from cdi.dirs import DEFAULT_SPEC_DIRS
from cdi.edits import apply
from cdi.errors import CDIError, FieldError, SpecError, printable
from cdi.spec import is_json_path, load_document, read_spec
from cdi.validate import interop_warnings

# nri-cdi imports this module only for list, validate and inject (nri_plugin/ops/cli.py).


def add_commands(subparsers: Any, *, spec_dirs_env: str = "") -> None:
    """Add ``list``, ``validate`` and ``inject``; ``spec_dirs_env`` names an environment
    variable (comma-separated folders) that replaces the default spec folders when no
    ``--spec-dir`` is given: a vendor's tool convention, passed in by its caller."""
    listing = subparsers.add_parser("list", help="list the CDI devices of the spec directories")
    validate = subparsers.add_parser("validate", help="validate CDI spec files")
    inject = subparsers.add_parser(
        "inject", help="apply CDI devices to an OCI runtime spec (config.json) and print it"
    )
    default = " then ".join(DEFAULT_SPEC_DIRS)
    for parser in (listing, inject):
        parser.add_argument(
            "--spec-dir",
            dest="spec_dirs",
            action="append",
            metavar="DIR",
            help="a spec directory; repeat for several, later ones win "
            f"(default: {f'${spec_dirs_env}, else ' if spec_dirs_env else ''}{default})",
        )
        parser.set_defaults(spec_dirs_env=spec_dirs_env)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument(
        "--strict", action="store_true", help="exit non-zero when any spec file has an error"
    )
    listing.set_defaults(func=cmd_list)
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument(
        "--schema",
        action="store_true",
        help="also check each file against the project's JSON schema",
    )
    validate.set_defaults(func=cmd_validate)
    inject.add_argument(
        "--device",
        dest="devices",
        action="append",
        required=True,
        metavar="NAME",
        help="a qualified device name; repeat for several",
    )
    inject.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE|-",
        help="the OCI runtime spec (default: standard input)",
    )
    inject.set_defaults(func=cmd_inject)


def spec_dirs(args: argparse.Namespace) -> list[str] | None:
    """``--spec-dir`` values, else those of ``$<args.spec_dirs_env>`` (when the command was
    added with one), else None (the defaults)."""
    if args.spec_dirs:
        return list(args.spec_dirs)
    raw = os.environ.get(args.spec_dirs_env, "") if args.spec_dirs_env else ""
    return [d.strip() for d in raw.split(",") if d.strip()] or None


def cmd_list(args: argparse.Namespace) -> int:
    snapshot = SpecCache(spec_dirs(args)).refresh()
    for path, messages in [*sorted(snapshot.errors.items()), *sorted(snapshot.warnings.items())]:
        for message in messages:
            print(printable(f"{path}: {message}"), file=sys.stderr)
    if args.json:
        listing = [
            {"name": name, "spec": snapshot.devices[name].spec.path}
            for name in sorted(snapshot.devices)
        ]
        errors = [{"file": p, "error": m} for p, ms in sorted(snapshot.errors.items()) for m in ms]
        warnings = [
            {"file": p, "warning": m} for p, ms in sorted(snapshot.warnings.items()) for m in ms
        ]
        # ensure_ascii (the default) also writes names that are not UTF-8 as escapes
        print(json.dumps({"devices": listing, "errors": errors, "warnings": warnings}, indent=2))
    else:
        for name in sorted(snapshot.devices):
            print(name)
    return 1 if args.strict and snapshot.errors else 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Error lines and warnings (valid, but trouble elsewhere) go to stderr."""
    failed = False
    for path in args.files:
        errors: list[str] = []
        try:
            spec = read_spec(path)
        except SpecError as exc:
            errors += exc.lines()
        else:
            for warning in interop_warnings(spec.data):
                print(f"{printable(path)}: {warning}", file=sys.stderr)
        if args.schema:
            errors += [f"{printable(path)}: schema: {e}" for e in _schema_errors(path)]
        failed |= bool(errors)
        for line in errors:
            print(line, file=sys.stderr)
        if not errors:
            print(f"{printable(path)}: valid")
    return 1 if failed else 0


def _schema_errors(path: str) -> list[FieldError]:
    # Here: importing jsonschema is slow, and only --schema needs it.
    from cdi.schema import schema_errors

    try:
        with open(path, "rb") as handle:
            document = load_document(handle.read(), json_format=is_json_path(path))
    except (OSError, ValueError, SpecError):
        return []  # already reported by the code's validator
    return schema_errors(document)


def cmd_inject(args: argparse.Namespace) -> int:
    try:
        oci = _read_oci(args.file)
    except (OSError, ValueError) as exc:
        print(f"{args.file}: cannot read OCI runtime spec: {exc}", file=sys.stderr)
        return 1
    snapshot = SpecCache(spec_dirs(args)).refresh()
    try:
        result = apply(oci, snapshot.resolve(args.devices))
    except CDIError as exc:
        print(f"nri-cdi inject: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


def _read_oci(name: str) -> dict[str, Any]:
    text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    document = json.loads(text)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document
