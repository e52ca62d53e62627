"""Builders shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nri_cdi_testbed.node_check.plugin import ANNOTATION_SOURCES

if TYPE_CHECKING:
    from cdi.cache import Snapshot
    from nri_plugin.nri.versions import RuntimeInfo
    from nri_plugin.plugins.cdi_injector.context import DeviceRequest
    from nri_plugin.plugins.cdi_injector.plan import Injection, PlanFor
    from nri_plugin.plugins.cdi_injector.policy import Policy


def write_specs(folder: Path, files: Mapping[str, str]) -> Path:
    """Create ``folder`` with one file per entry; content is dedented."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(textwrap.dedent(content))
    return folder


def simple_spec(kind: str, *names: str, env: str = "X=1", version: str = "0.5.0") -> str:
    devices = "".join(
        f"  - name: \"{n}\"\n    containerEdits:\n      env: [\"{env}\", \"DEV_{i}={n}\"]\n"
        for i, n in enumerate(names)
    )
    return f"cdiVersion: {version}\nkind: {kind}\ndevices:\n{devices}"


def make_char_device(path: Path, major: int = 1, minor: int = 3, mode: int = 0o666) -> Path:
    """A real character device node (root only), by default equal to /dev/null."""
    os.mknod(path, 0o020000 | mode, os.makedev(major, minor))
    os.chmod(path, mode)
    return path


def run_generate(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``nri-cdi generate`` in-process, with only ``environ`` as its environment;
    returns (exit code, stdout, stderr)."""
    import argparse
    import io

    from cdi.nvidia import cli

    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", *argv])
    out, err = io.StringIO(), io.StringIO()
    rc = cli.cmd_generate(args, out, err, environ=environ or {})
    return rc, out.getvalue(), err.getvalue()


def generate_link_modes(out: Path, driver_root: Path, dev_root: Path | None = None, *,
                        cdi_version: str | None = None,
                        modes: Sequence[str] = ("hooks", "mounts")) -> None:
    """``nri-cdi generate --mode procfs`` as a user runs it (a process of its own), once per
    link mode, into ``out/<mode>/nvidia.yaml``."""
    for mode in modes:
        (out / mode).mkdir()
        argv = [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
                "--driver-root", str(driver_root), "--link-mode", mode,
                "--output", str(out / mode / "nvidia.yaml")]
        if dev_root is not None:
            argv += ["--dev-root", str(dev_root)]
        if cdi_version is not None:
            argv += ["--cdi-version", cdi_version]
        subprocess.run(argv, check=True, cwd=Path(__file__).resolve().parents[1],
                       capture_output=True)


def place_file(folder: Path, name: str, content: bytes | Callable[[Path], object]) -> Path:
    """``folder/name`` made at once: bytes are written aside and renamed into place (never
    seen half-written); a callable makes it itself (a link, a FIFO, a folder, ...)."""
    path = folder / name
    if isinstance(content, bytes):
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(content)
        tmp.rename(path)
    else:
        content(path)
    return path


# The annotation sources, allowed in every namespace: the built-in policy allows them in
# none (docs/usage/policy.md), and most tests ask by annotation about something else.
ANNOTATIONS_ANYWHERE = {name: {"namespaces": ["*"]} for name in ANNOTATION_SOURCES}


def annotations_policy(doc: dict[str, Any] | None = None, *, nvidia: bool = True) -> Policy:
    """``doc`` (a policy document) with the annotation sources it does not set allowed in
    every namespace, parsed as the daemon parses it (``nvidia``: with NVIDIA's sources)."""
    from nri_plugin.plugins.cdi_injector.policy import parse_policy
    from nri_plugin.vendors.nvidia.rules import NvidiaRules

    doc = dict(doc or {})
    sources = {**({k: v for k, v in ANNOTATIONS_ANYWHERE.items()
                   if nvidia or k != "nvidiaNriAnnotations"}), **doc.get("sources", {})}
    return parse_policy({**doc, "sources": sources},
                        vendors=(NvidiaRules(),) if nvidia else ())


def nvidia_policy(doc: object, origin: str = "") -> Policy:
    """A policy document parsed as the daemon parses it: with NVIDIA's request sources and
    default denials known."""
    from nri_plugin.plugins.cdi_injector.policy import parse_policy
    from nri_plugin.vendors.nvidia.rules import NvidiaRules

    return parse_policy(doc, origin=origin, vendors=(NvidiaRules(),))


def hook_links(hook_args: Iterable[Sequence[str]]) -> dict[str, str]:
    """The links the create-symlinks hooks of a spec make, {container path: target text},
    from each hook's args."""
    links = {}
    for args in hook_args:
        for i, word in enumerate(args):
            if word == "--link":
                target, path = args[i + 1].split("::")
                links[path] = target
    return links


def plan_injection(snapshot: Snapshot, requests: Sequence[DeviceRequest], runtime: RuntimeInfo,
                   plan_for: PlanFor | None = None) -> Injection:
    """The injector's plan for the devices ``requests`` name (looked up first)."""
    from nri_plugin.plugins.cdi_injector.plan import PlanFor, lookup_devices, plan_devices

    return plan_devices(snapshot, lookup_devices(snapshot, requests), runtime,
                        plan_for or PlanFor())
