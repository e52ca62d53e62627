"""(j) Each plugin's own time inside a real containerd's CreateContainer, from the kernel's
record of its threads: what ``bench_containerd.py`` cannot resolve.

bench_containerd.py times CreateContainer as CRI sees it: two containerds serving the same
plugin differ there by about 0.2 ms, so a difference of a few tens of microseconds between
two plugins needs several pooled runs and stays within their intervals. This bench records
(``perf record``: the syscalls and the context switches of the plugin processes only) our
plugin, the Go reference injector and, with ``--baseline-repo``, the plugin of another
checkout, each connected to a containerd of its own, the rounds creating one container per
kind in a new random order each, as bench_containerd.py does. From the record, per
CreateContainer request and plugin process:

- wake -> read: from the return of the event loop's wait (``epoll_wait``/``epoll_pwait``)
  to the return of the read that took the request's bytes (Go reads the 8-byte frame
  header first, then the rest: to the second read);
- read -> reply: from there to the reply's first write on the same socket;
- wake -> reply: the two together, the plugin's share of the runtime's wait.

The requests are told apart by their reply: a CreateContainer answered with an adjustment
is over 100 bytes (its header and body together), a RemoveContainer's empty reply is not.
Medians with the quartiles; the processes run side by side in the same rounds, so the
figures compare, while their absolute values include the recording's own cost (a few
microseconds per syscall, the same kind of cost for every plugin).

Run as root with perf installed: ``python3 bench/trace_containerd.py --reference BINARY
[--baseline-repo DIR] [--runtime 1.7] [--rounds 400]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_containerd import (
    DEVICES,
    REFERENCE_ENV,
    SLEEP,
    WANTED,
    CheckoutPlugin,
    ReferencePlugin,
    make_node,
    pod_annotations,
    timed_create_start,
    wanted_nodes,
)
from tests.e2e import images, paths
from tests.e2e.containerd import Containerd
from tests.e2e.plugin import PluginProcess

# x86-64 syscall numbers: the waits, the reads and the writes of either runtime's library.
WAITS = {232, 281}  # epoll_wait, epoll_pwait
READS = {0, 45, 47}  # read, recvfrom, recvmsg
WRITES = {1, 44, 46}  # write, sendto, sendmsg
REQUEST_MIN = 1000  # bytes: a CreateContainer or RemoveContainer request is larger
REPLY_MIN = 100  # bytes: an adjustment; an empty reply is smaller
WAKE_WINDOW = 0.002  # s: a wait that returned longer ago than this did not bring the request

_LINE = re.compile(r"^\s*\S+\s+(\d+)/(\d+)\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
_EXIT = re.compile(r"NR (\d+) = (-?\d+)")


@dataclass(frozen=True, slots=True)
class Event:
    time: float
    tid: int
    name: str
    detail: str


@dataclass(slots=True)
class _Request:
    wake: float
    read: float
    fd: int
    reply_at: float = 0.0
    reply_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Timing:
    wake_to_read: float  # microseconds
    read_to_reply: float
    wake_to_reply: float


def events(script: str, pid: int) -> Iterator[Event]:
    """The process's events from ``perf script`` output, in time order."""
    found = []
    for line in script.splitlines():
        match = _LINE.match(line)
        if match and int(match.group(1)) == pid:
            found.append(Event(float(match.group(3)), int(match.group(2)), match.group(4),
                               match.group(5)))
    return iter(sorted(found, key=lambda e: e.time))


def _args(detail: str) -> tuple[int, list[int]]:
    number = int(detail.split()[1])
    inside = detail[detail.index("(") + 1:detail.index(")")]
    return number, [int(a, 16) for a in inside.split(", ")]


def create_timings(stream: Iterator[Event]) -> list[Timing]:
    """Per CreateContainer request of one process (see the module's docstring)."""
    entered: dict[int, list[int]] = {}  # thread -> the arguments of its syscall under way
    woke = 0.0
    request: _Request | None = None
    timings: list[Timing] = []
    for event in stream:
        if event.name.endswith("sys_enter"):
            number, args = _args(event.detail)
            entered[event.tid] = args
            if request is not None and number in WRITES and args[0] == request.fd:
                request.reply_at = request.reply_at or event.time
                request.reply_bytes += args[2]
            continue
        if not event.name.endswith("sys_exit"):
            continue
        match = _EXIT.match(event.detail)
        if match is None:
            continue
        number, result = int(match.group(1)), int(match.group(2))
        if number in WAITS and result > 0:
            woke = event.time
        elif number in READS and result > 0:
            fd = entered.get(event.tid, [-1])[0]
            if request is not None and request.reply_at and fd == request.fd:
                timings += _finished(request)
                request = None
            if result >= REQUEST_MIN and request is None:
                wake = woke if 0 <= event.time - woke < WAKE_WINDOW else event.time
                request = _Request(wake=wake, read=event.time, fd=fd)
    if request is not None and request.reply_at:
        timings += _finished(request)
    return timings


def _finished(request: _Request) -> list[Timing]:
    if request.reply_bytes <= REPLY_MIN:
        return []  # not a CreateContainer with an adjustment
    return [Timing((request.read - request.wake) * 1e6, (request.reply_at - request.read) * 1e6,
                   (request.reply_at - request.wake) * 1e6)]


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"{statistics.median(ordered):5.0f} ({ordered[len(ordered) // 4]:.0f}-"
            f"{ordered[3 * len(ordered) // 4]:.0f})")


def report(timings: dict[str, list[Timing]]) -> None:
    print("    plugin         n     wake -> read      read -> reply     wake -> reply  (us, "
          "median and quartiles)")
    for kind, found in timings.items():
        print(f"    {kind:10s} {len(found):5d}  "
              f"{summary([t.wake_to_read for t in found]):>16s}  "
              f"{summary([t.read_to_reply for t in found]):>16s}  "
              f"{summary([t.wake_to_reply for t in found]):>16s}")


def run(version: str, rounds: int, reference: Path, baseline: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        specs = make_node(root)
        WANTED.update(wanted_nodes(specs, DEVICES))
        archives = [images.pause_image(root), images.busybox_image(root)]
        kinds = ["plugin", "reference", *(["baseline"] if baseline else [])]
        ctrds = {kind: Containerd(cdi_spec_dirs=[specs], version=version) for kind in kinds}
        for ctrd in ctrds.values():
            stack.callback(ctrd.close)
            ctrd.enable_cdi = False  # the plugin's roles in bench_containerd.py
            ctrd.start().import_images(*archives)
        pids = {}
        for kind, ctrd in ctrds.items():
            plugin: PluginProcess | ReferencePlugin
            if kind == "reference":
                plugin = ReferencePlugin(reference, ctrd.nri_socket, specs, root / "ref.log")
                plugin.start(ctrd)
            elif kind == "baseline" and baseline is not None:
                plugin = CheckoutPlugin(baseline, ctrd.nri_socket, [specs],
                                        root / "baseline.log",
                                        extra_args=["--log-level", "info"]).start()
            else:
                plugin = PluginProcess(ctrd.nri_socket, [specs], root / "plugin.log",
                                       extra_args=["--log-level", "info"]).start()
            stack.callback(plugin.kill)
            assert plugin.process is not None
            pids[kind] = plugin.process.pid
        clients = {kind: stack.enter_context(ctrd.cri()) for kind, ctrd in ctrds.items()}
        for cri in clients.values():
            stack.enter_context(cri.cleanup())
        pods = {kind: cri.run_pod(kind, annotations=pod_annotations(kind))
                for kind, cri in clients.items()}
        for kind, cri in clients.items():
            for _ in range(2):  # warm-ups, each checked to get the devices
                timed_create_start(cri, pods[kind], kind, check=True)
        record = root / "perf.data"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-o", str(record), "-e", "sched:sched_switch",
             "-e", "raw_syscalls:sys_enter", "-e", "raw_syscalls:sys_exit",
             "-p", ",".join(map(str, pids.values()))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf attached (it has no signal for that)
        order = random.Random(rounds)
        for _ in range(rounds):
            for kind in order.sample(kinds, len(kinds)):
                container = clients[kind].create_container(pods[kind], "bench",
                                                           images.BUSYBOX_IMAGE, command=SLEEP)
                clients[kind].start_container(container)
                clients[kind].stop_container(container)
                clients[kind].remove_container(container)
        perf.send_signal(2)
        perf.wait(timeout=60)
        script = subprocess.run(["perf", "script", "-i", str(record), "-F",
                                 "comm,pid,tid,cpu,time,event,trace"],
                                capture_output=True, text=True, check=True).stdout
    timings = {kind: create_timings(events(script, pid)) for kind, pid in pids.items()}
    print(f"(j) CreateContainer inside containerd {version}, {rounds} interleaved rounds, "
          "each plugin's threads as the kernel recorded them")
    report(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=sorted(paths.RUNTIMES), default="1.7")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--reference", type=Path,
                        default=os.environ.get(REFERENCE_ENV) or None,
                        help=f"the Go reference CDI injector's binary (also ${REFERENCE_ENV})")
    parser.add_argument("--baseline-repo", type=Path,
                        help="also the plugin of this checkout, in the same rounds")
    args = parser.parse_args()
    if args.reference is None:
        sys.exit(f"no Go reference injector: --reference or ${REFERENCE_ENV}")
    run(args.runtime, args.rounds, args.reference, args.baseline_repo)


if __name__ == "__main__":
    main()
