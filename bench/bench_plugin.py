"""NRI plugin costs, medians and tails, each next to a baseline from the same run.

(a) adjustment computation for an 8-GPU request (8 GPU nodes + 4 control nodes, 60
    library mounts, hooks, env): the pure ``plan_injection`` path, p50/p99, next to
    ``Snapshot.resolve`` alone (the registry part of it);
(b) CreateContainer round trip over a real Unix socket against the test runtime peer
    (raw frames in, raw frames out), p50/p99, next to an empty CreateContainer (a
    container that asks for nothing) over the same connection.

(e) the CreateContainer handler with cold caches (32 MiB touched before each call, as the
    runtime, runc and the shims do between two containers) next to the same hot, with the
    per-container log line inline and deferred (the daemon runs it after the reply), p50.

(f) the whole plugin in process, frame bytes in to reply bytes out (wire, dispatch, start
    guard, injector, NVIDIA's rules), for a container as containerd sends one under
    Kubernetes (15 env entries, 12 mounts, 7 annotations, cgroup and namespaces), hot and
    cold as in (e). Run another checkout's copy of this file for an A/B.

(g) reading one request from a Unix socket, as asyncio's transports do it: a plain
    Protocol's ``recv`` of up to 256 KiB into a new bytes object (glibc maps, shrinks
    and unmaps it) against a BufferedProtocol's ``recv_into`` one buffer kept for the
    connection (what the stub uses), for a 1.5 KB and a 9 KB message, with a second
    thread alive as in the plugin (the log writer), p50 and the ratio. Each size in a
    process of its own: whether glibc maps each 256 KiB depends on what the process freed
    before (a fresh one, like the plugin, does; strace shows it there at every request).

(i) the cuts between the request and its reply's write, each on and off in alternate
    rounds of one plugin in process, cold as in (f), a Kubernetes container: the reply
    encoding kept for an answer given before (``dispatch.KeptReplies``) against encoded
    each time, and the log line put off in a list the stub runs after the replies
    (the daemon's ``PutOff``) against scheduled with the event loop's ``call_soon``;
    frame in to the reply's write (what the runtime waits for), medians and the median
    paired difference with a bootstrap 95 % interval. In process both halves share every
    other cost, so a few microseconds resolve here that no containerd run can.

(h) the per-container log line's CPU (the whole process, every thread), as the daemon logs
    it from the event loop with a container's gap (2 ms) between two, to a regular file, a
    pipe and a Unix stream socket (journald's) each read by another process: the daemon's
    ``NonBlockingHandler`` against the standard library's queue handler and listener
    thread (what the daemon used before), less the same loop logging nothing,
    interleaved in blocks, medians of the blocks.

With ``--reference BINARY`` (or ``$NRI_CDI_REFERENCE_INJECTOR``, the Go reference CDI
injector; see bench_containerd.py):

(d) CreateContainer round trip of the plugins as deployed, interleaved: ``nri-cdi
    plugin`` and the reference, each a process of its own connected to a test runtime
    peer's socket, asked for the same 8 GPUs from the same spec folder, p50/p99 and the
    ratio ours / reference; back to back (hot), then cold (32 MiB touched and 5 ms idle
    before each request, as inside a runtime: the gap containerd shows).

Run: ``python3 bench/bench_plugin.py``. (c), Create+Start on a real containerd, is
``bench/bench_containerd.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import logging.handlers
import os
import queue
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from google.protobuf.message import Message

from cdi.cache import Snapshot, SpecCache
from nri_plugin.nri.api import nri_pb2, ttrpc_pb2
from nri_plugin.nri.dispatch import KeptReplies
from nri_plugin.nri.stub import READ_SIZE, Stub, _Session
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.ops.logformat import BoundedLog, log_formatter
from nri_plugin.ops.logwriter import NonBlockingHandler
from nri_plugin.plugins.cdi_injector.guard import StartGuard
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, plan_injection
from nri_plugin.plugins.cdi_injector.requests import DeviceRequest
from nri_plugin.plugins.cdi_injector.vendor import Registry, RegistryHolder
from nri_plugin.vendors.nvidia.rules import NvidiaRules
from tests.nri_runtime_peer import RecordingTransport, RuntimePeer, plugin_call_frame


def gpu_spec(gpus: int = 8, libraries: int = 60) -> str:
    control = "".join(
        f"  - {{path: /dev/{n}, type: c, major: 195, minor: {m}, fileMode: 438}}\n"
        for n, m in (("nvidiactl", 255), ("nvidia-uvm", 0), ("nvidia-uvm-tools", 1),
                     ("nvidia-modeset", 254)))
    mounts = "".join(
        f"  - {{hostPath: /usr/lib/x86_64-linux-gnu/libnv{i}.so.580.82.07, "
        f"containerPath: /usr/lib/x86_64-linux-gnu/libnv{i}.so.580.82.07, "
        "options: [ro, nosuid, nodev, rbind, rprivate]}\n" for i in range(libraries))
    devices = "".join(
        f"- name: \"{g}\"\n  containerEdits:\n    deviceNodes:\n"
        f"    - {{path: /dev/nvidia{g}, type: c, major: 195, minor: {g}, fileMode: 438}}\n"
        f"    - {{path: /dev/dri/card{g}, type: c, major: 226, minor: {g}, fileMode: 432}}\n"
        for g in range(gpus))
    return (
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n"
        "  env: [NVIDIA_VISIBLE_DEVICES=void, NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu]\n"
        f"  deviceNodes:\n{control}  mounts:\n{mounts}"
        "  hooks:\n"
        "  - {hookName: createContainer, path: /usr/local/bin/nri-cdi, args: [nri-cdi, hook, "
        "create-symlinks, --link, libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so]}\n"
        "  - {hookName: createContainer, path: /usr/local/bin/nri-cdi, args: [nri-cdi, hook, "
        "update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}\n"
        f"devices:\n{devices}")


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def bench_plan(snapshot: Snapshot, rounds: int) -> None:
    names = [f"nvidia.com/gpu={g}" for g in range(8)]
    requests = [DeviceRequest(n, "bench") for n in names]
    runtime = RuntimeInfo.from_configure("containerd", "1.7.24")
    plan_us, resolve_us = [], []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        snapshot.resolve(names)
        resolve_us.append((time.perf_counter_ns() - start) / 1000)
        start = time.perf_counter_ns()
        plan_injection(snapshot, requests, runtime)
        plan_us.append((time.perf_counter_ns() - start) / 1000)
    (p50, p99), (r50, r99) = percentiles(plan_us), percentiles(resolve_us)
    print(f"(a) adjustment for 8 GPUs (12 nodes, 60 mounts, 2 hooks), {rounds} rounds")
    print(f"    plan_injection  p50 {p50:8.1f} us   p99 {p99:8.1f} us")
    print(f"    resolve only    p50 {r50:8.1f} us   p99 {r99:8.1f} us   "
          f"(plan / resolve = {p50 / r50:.1f})")


async def round_trips(
    snapshot: Snapshot, rounds: int, *, plan_cache: bool
) -> tuple[list[float], list[float]]:
    ours, theirs = socket.socketpair()
    injector = CdiInjector(lambda: Registry(snapshot))
    if not plan_cache:
        injector.PLAN_CACHE_SIZE = 0  # every request computes its plan afresh
    stub = Stub(injector, sock=ours, name="bench", idx="10", env={})
    runner = asyncio.create_task(stub.run())
    peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
    await peer.handshake()
    gpu = nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(name="p", namespace="n", annotations={
            "cdi.k8s.io/gpus": ",".join(f"nvidia.com/gpu={g}" for g in range(8))}),
        container=nri_pb2.Container(name="c"))
    empty = nri_pb2.CreateContainerRequest(pod=nri_pb2.PodSandbox(name="p"),
                                           container=nri_pb2.Container(name="c"))
    timings: dict[str, list[float]] = {"gpu": [], "empty": []}
    for _ in range(rounds):
        for kind, request in (("gpu", gpu), ("empty", empty)):
            start = time.perf_counter_ns()
            reply = await peer.response_to(peer.send_request("CreateContainer", request))
            timings[kind].append((time.perf_counter_ns() - start) / 1000)
            assert reply.status.code == 0
    peer.close()
    await asyncio.wait_for(runner, 5)
    return timings["gpu"], timings["empty"]


def bench_cold(snapshot: Snapshot, rounds: int) -> None:
    """(e): the handler cold and hot; the log line inline and deferred."""
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives with the run
    logger = logging.getLogger("nri_cdi")
    logging.disable(logging.NOTSET)
    logger.addHandler(sink)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    junk = bytearray(32 << 20)
    pod = nri_pb2.PodSandbox(name="p", namespace="n", annotations=GPU_ASK)
    container = nri_pb2.Container(name="c")
    results: dict[tuple[str, str], float] = {}
    try:
        for how in ("inline", "deferred"):
            injector = CdiInjector(lambda: Registry(snapshot))
            later: list[Callable[[], object]] = []
            if how == "deferred":
                injector.defer = later.append
            for cache in ("hot", "cold"):
                times = []
                for _ in range(rounds):
                    if cache == "cold":
                        junk[::64] = bytes(len(junk[::64]))  # touch every cache line
                    start = time.perf_counter_ns()
                    injector.create_container(pod, container)
                    times.append((time.perf_counter_ns() - start) / 1000)
                    for call in later:  # after the "reply": not timed
                        call()
                    later.clear()
                results[how, cache] = statistics.median(times)
    finally:
        logger.removeHandler(sink)
        logger.propagate = True
        logging.disable(logging.INFO)
    print(f"(e) CreateContainer handler, 8 GPUs, {rounds} rounds, p50")
    for how in ("inline", "deferred"):
        print(f"    log line {how:8s}  hot {results[how, 'hot']:7.1f} us   cold "
              f"{results[how, 'cold']:7.1f} us   (cold / hot = "
              f"{results[how, 'cold'] / results[how, 'hot']:.1f})")
    print(f"    deferred / inline, cold: "
          f"{results['deferred', 'cold'] / results['inline', 'cold']:.2f}")


def kubernetes_container(index: int) -> nri_pb2.Container:
    """A container as containerd 2.1 sends it for a Kubernetes pod (no device asked for by
    the container itself: the pod's annotation asks)."""
    sandbox = "f" * 64
    container = nri_pb2.Container(id=f"{index:064x}", pod_sandbox_id=sandbox, name="app",
                                  args=["sleep", "600"])
    container.annotations.update({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "app", "io.kubernetes.cri.sandbox-id": sandbox,
        "io.kubernetes.cri.sandbox-name": "pod",
        "io.kubernetes.cri.sandbox-namespace": "default",
        "io.kubernetes.cri.sandbox-uid": "u" * 36,
        "io.kubernetes.cri.image-name": "docker.io/library/app:1"})
    container.labels.update({"io.kubernetes.container.name": "app",
                             "io.kubernetes.pod.name": "pod",
                             "io.kubernetes.pod.namespace": "default"})
    container.env.extend(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "HOSTNAME=pod", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                          *(f"SVC{j}_SERVICE_HOST=10.0.0.{j}" for j in range(12))])
    for destination, source in (
            ("/proc", "proc"), ("/dev", "tmpfs"), ("/dev/pts", "devpts"),
            ("/dev/mqueue", "mqueue"), ("/sys", "sysfs"), ("/sys/fs/cgroup", "cgroup"),
            ("/etc/hosts", "/var/lib/kubelet/pods/u/etc-hosts"),
            ("/dev/termination-log", "/var/lib/kubelet/pods/u/containers/app/0"),
            ("/etc/hostname", "/var/lib/containerd/sandboxes/f/hostname"),
            ("/etc/resolv.conf", "/var/lib/containerd/sandboxes/f/resolv.conf"),
            ("/dev/shm", "/run/containerd/sandboxes/f/shm"),
            ("/var/run/secrets/kubernetes.io/serviceaccount", "/var/lib/kubelet/pods/u/sa")):
        container.mounts.add(destination=destination, source=source, type="bind",
                             options=["rbind", "rprivate", "rw"])
    container.linux.cgroups_path = f"kubepods-besteffort-podu.slice:cri-containerd:{index:064x}"
    for kind in ("pid", "ipc", "uts", "mount", "network"):
        container.linux.namespaces.add(type=kind, path=f"/proc/1/ns/{kind}")
    container.linux.resources.devices.add(allow=False, access="rwm")
    container.linux.oom_score_adj.value = 1000
    return container


def _deliver(session: _Session, data: bytes) -> None:
    """``data`` into ``session`` as the event loop's transport does: copied into the
    session's buffer, as much as fits per read."""
    while data:
        buffer = session.get_buffer(-1)
        size = min(len(buffer), len(data))
        buffer[:size] = data[:size]
        session.buffer_updated(size)
        data = data[size:]


def _reply_of(written: bytes) -> nri_pb2.CreateContainerResponse:
    """The CreateContainer reply in the plugin's bytes: mux frames (8-byte headers) around
    one ttrpc frame (a 10-byte header and a Response)."""
    stream, offset = b"", 0
    while offset < len(written):
        length = int.from_bytes(written[offset + 4:offset + 8], "big")
        stream += written[offset + 8:offset + 8 + length]
        offset += 8 + length
    payload = ttrpc_pb2.Response.FromString(stream[10:]).payload
    return nri_pb2.CreateContainerResponse.FromString(payload)


@dataclass
class _InProcess:
    """The whole plugin as the daemon composes it, fed frames in process."""

    session: _Session
    injector: CdiInjector
    later: list[Callable[[], object]]  # the injector's put-off work, run by the caller
    transport: RecordingTransport
    pod: nri_pb2.PodSandbox  # a Kubernetes pod asking for GPU_ASK
    streams: Iterator[int]

    def frame(self, method: str, message: Message) -> bytes:
        return plugin_call_frame(next(self.streams), method, message.SerializeToString())


def _in_process(snapshot: Snapshot) -> _InProcess:
    """Configured and synchronized as containerd 2.1.9 does; must run on an event loop."""
    # As the daemon holds it: one registry (the snapshot and NVIDIA's facts) until a refresh.
    registry = RegistryHolder((NvidiaRules(),))
    registry.update(snapshot)
    injector = CdiInjector(registry.get, vendors=registry.vendors)
    later: list[Callable[[], object]] = []
    injector.defer = later.append
    session = _Session(StartGuard(injector, own_connection=True), logging.getLogger("bench"))
    transport = RecordingTransport()
    session.transport = transport  # type: ignore[assignment]
    plugin = _InProcess(session, injector, later, transport, nri_pb2.PodSandbox(
        id="f" * 64, name="pod", namespace="default", uid="u" * 36, annotations=GPU_ASK),
        iter(range(1, 1 << 30, 2)))
    _deliver(session, plugin.frame("Configure", nri_pb2.ConfigureRequest(
        runtime_name="containerd", runtime_version="2.1.9")))
    _deliver(session, plugin.frame("Synchronize", nri_pb2.SynchronizeRequest()))
    return plugin


async def _whole_stack(snapshot: Snapshot, rounds: int) -> dict[str, float]:
    plugin = _in_process(snapshot)
    session, later, sink, pod, frame = (plugin.session, plugin.later, plugin.transport,
                                        plugin.pod, plugin.frame)
    junk = bytearray(32 << 20)
    medians: dict[str, float] = {}
    for cache in ("hot", "cold"):
        frames = [frame("CreateContainer", nri_pb2.CreateContainerRequest(
            pod=pod, container=kubernetes_container(i))) for i in range(rounds)]
        sink.written.clear()
        times = []
        for data in frames:
            if cache == "cold":
                junk[::64] = bytes(len(junk[::64]))
            start = time.perf_counter_ns()
            _deliver(session, data)
            times.append((time.perf_counter_ns() - start) / 1000)
            for call in later:  # after the reply: not timed
                call()
            later.clear()
        reply = _reply_of(sink.written[-1])
        assert len(reply.adjust.linux.devices) == 20, reply
        medians[cache] = statistics.median(times)
    return medians


def bench_whole_stack(snapshot: Snapshot, rounds: int) -> None:
    """(f): frame in, reply out, a Kubernetes container, hot and cold."""
    medians = asyncio.run(_whole_stack(snapshot, rounds))
    print(f"(f) the whole plugin in process, frame in to reply out, 8 GPUs, a Kubernetes "
          f"container, {rounds} rounds, p50")
    print(f"    hot {medians['hot']:7.1f} us   cold {medians['cold']:7.1f} us")


Toggle = Callable[[_Session, CdiInjector, bool], None]


def _keep_replies(kept: KeptReplies) -> Toggle:
    def toggle(session: _Session, injector: CdiInjector, on: bool) -> None:
        session.dispatcher._kept = kept if on else None
    return toggle


def _put_off(pending: list[Callable[[], object]]) -> Toggle:
    """On: the daemon's PutOff (a list append); off: the event loop's call_soon, which
    the daemon used before (its handles are never run here: the loop does not turn)."""
    loop = asyncio.get_running_loop()

    def toggle(session: _Session, injector: CdiInjector, on: bool) -> None:
        injector.defer = pending.append if on else (lambda call: loop.call_soon(call))
    return toggle


async def _alternating(snapshot: Snapshot, rounds: int, name: str) -> dict[bool, list[float]]:
    """Frame in to the reply's first write, cold, ``name``'s cut on and off in turn."""
    plugin = _in_process(snapshot)
    session, injector, later, sink = (plugin.session, plugin.injector, plugin.later,
                                      plugin.transport)
    toggle = _keep_replies(KeptReplies()) if name == "kept" else _put_off(later)
    junk = bytearray(COLD_TOUCH)
    times: dict[bool, list[float]] = {True: [], False: []}
    replies: dict[bool, bytes] = {}
    for index in range(2 * rounds):
        on = bool(index % 2)
        toggle(session, injector, on)
        data = plugin.frame("CreateContainer", nri_pb2.CreateContainerRequest(
            pod=plugin.pod, container=kubernetes_container(index)))
        junk[::64] = bytes(len(junk[::64]))
        sink.clear()
        start = time.perf_counter_ns()
        _deliver(session, data)
        times[on].append((sink.first_write - start) / 1000)
        replies[on] = b"".join(sink.written)
        later.clear()
    assert _reply_of(replies[True]) == _reply_of(replies[False])  # the same answer
    return times


CUTS = {"kept": ("reply encoding kept (KeptReplies)", "encoded each time"),
        "put-off": ("log line put off (PutOff)", "scheduled with call_soon")}


def bench_reply_cuts(snapshot: Snapshot, rounds: int) -> None:
    """(i): each cut on and off in alternate rounds, cold."""
    print(f"(i) frame in to the reply's write, cold, {rounds} pairs each, p50")
    for name, (on, off) in CUTS.items():
        times = asyncio.run(_alternating(snapshot, rounds, name))
        paired = [b - a for a, b in zip(times[True], times[False], strict=True)]
        draw = random.Random(rounds)
        medians = sorted(statistics.median(draw.choices(paired, k=len(paired)))
                         for _ in range(400))
        print(f"    {off:25s} {statistics.median(times[False]):7.1f} us   {on:34s} "
              f"{statistics.median(times[True]):7.1f} us   (paired: saves "
              f"{statistics.median(paired):.1f} us, {medians[10]:.1f} to {medians[389]:.1f})")


def _socket_reads(size: int, rounds: int, view: memoryview) -> dict[str, float]:
    """Medians (us) of reading one ``size``-byte message each way, interleaved."""
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    message = bytes(size)
    times: dict[str, list[float]] = {"recv": [], "recv_into": []}
    with sender, receiver:
        for _ in range(rounds):
            for kind in times:
                sender.sendall(message)
                start = time.perf_counter_ns()
                if kind == "recv":
                    data = receiver.recv(READ_SIZE)  # what a plain Protocol gets
                    got = len(data)
                    del data  # freed as data_received returns: in the timed part
                else:
                    got = receiver.recv_into(view)
                times[kind].append((time.perf_counter_ns() - start) / 1000)
                assert got == size, (kind, got)
    return {kind: statistics.median(values) for kind, values in times.items()}


def bench_socket_reads(rounds: int) -> None:
    """(g): asyncio's two ways of reading a request, each size in a fresh process."""
    print(f"(g) reading one request from a Unix socket, {rounds} interleaved rounds, p50")
    for size in (1500, 9000):
        subprocess.run([sys.executable, __file__, "--socket-reads", str(rounds),
                        "--read-size", str(size)], check=True)


def socket_reads_here(rounds: int, size: int) -> None:
    """(g) for one size in this process, a second thread alive."""
    idle = threading.Event()
    threading.Thread(target=idle.wait, daemon=True).start()  # as the log writer waits
    try:
        medians = _socket_reads(size, rounds, memoryview(bytearray(READ_SIZE)))
    finally:
        idle.set()
    print(f"    {size:5d} bytes: recv {medians['recv']:6.2f} us   recv_into "
          f"{medians['recv_into']:6.2f} us   (recv / recv_into = "
          f"{medians['recv'] / medians['recv_into']:.1f})")


LOG_GAP = 0.002  # between two per-container lines, as between two containers


def bench_log_output(lines: int) -> None:
    """(h): CPU per log line, the daemon's handler against a queue and a listener thread."""
    print(f"(h) CPU per per-container log line, {lines} lines per handler and output, "
          f"{LOG_GAP * 1000:.0f} ms apart, medians of blocks")
    for output in ("file", "pipe", "socket"):
        with _log_output(output) as fd:
            cpu = asyncio.run(_log_cpu(fd, lines))
        queued, direct = cpu["queue"] - cpu["none"], cpu["direct"] - cpu["none"]
        print(f"    {output:6s}  queue + listener {queued:6.1f} us   NonBlockingHandler "
              f"{direct:6.1f} us   (direct / queue = {direct / queued:.2f})")


@contextlib.contextmanager
def _log_output(kind: str) -> Iterator[int]:
    """A descriptor to log to: a file, or a pipe's or socket's end read by ``cat``."""
    if kind == "file":
        with tempfile.TemporaryFile() as out:
            yield out.fileno()
        return
    if kind == "pipe":
        reader, writer = os.pipe()
    else:
        writer, reader = (s.detach() for s in socket.socketpair())
    process = subprocess.Popen(["cat"], stdin=reader, stdout=subprocess.DEVNULL)
    os.close(reader)
    try:
        yield writer
    finally:
        os.close(writer)
        process.wait(30)


async def _log_cpu(fd: int, lines: int, block: int = 100) -> dict[str, float]:
    log = logging.getLogger("nri_cdi.injector")
    root = logging.getLogger()
    saved, saved_level = root.handlers[:], root.level
    logging.disable(logging.NOTSET)
    root.setLevel(logging.INFO)
    per_block: dict[str, list[float]] = {"none": [], "queue": [], "direct": []}
    try:
        for _ in range(max(1, lines // block)):
            for kind in per_block:
                handler, stop = _log_handler(kind, fd)
                root.handlers[:] = [handler] if handler else []
                before = time.process_time()
                for i in range(block):
                    if handler:
                        log.info("injected %s devices=%s us=%d", f"default/pod-{i}/cuda",
                                 GPU_ASK["cdi.k8s.io/gpus"], 211)
                    await asyncio.sleep(LOG_GAP)
                per_block[kind].append((time.process_time() - before) / block * 1e6)
                stop()
    finally:
        root.handlers[:], root.level = saved, saved_level
        logging.disable(logging.INFO)
    return {kind: statistics.median(values) for kind, values in per_block.items()}


def _log_handler(kind: str, fd: int) -> tuple[logging.Handler | None, Callable[[], None]]:
    """The handler for ``kind`` as the daemon would set it up, and how to stop it."""
    if kind == "none":
        return None, lambda: None
    if kind == "direct":
        handler: logging.Handler = NonBlockingHandler(fd)
        handler.setFormatter(log_formatter("text"))
        stop = handler.close
    else:  # the standard library's pair: records queued, written by a listener thread
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        stream = logging.StreamHandler(os.fdopen(os.dup(fd), "w"))
        stream.setFormatter(log_formatter("text"))
        listener = logging.handlers.QueueListener(records, stream)
        listener.start()
        handler = _MessageOnlyQueueHandler(records)

        def stop() -> None:
            listener.stop()
            stream.close()
    handler.addFilter(BoundedLog(burst=1 << 30))  # the daemon's, without its rate limit
    return handler, stop


class _MessageOnlyQueueHandler(logging.handlers.QueueHandler):
    """As the daemon's was (before ``NonBlockingHandler``): the record queued as it is, only
    its message fixed, every formatting left to the listener's handler (the stock
    ``prepare`` formats and copies the record here, which the daemon never did)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg, record.args = record.getMessage(), None
        return record


REFERENCE_ENV = "NRI_CDI_REFERENCE_INJECTOR"
GPU_ASK = {"cdi.k8s.io/gpus": ",".join(f"nvidia.com/gpu={g}" for g in range(8))}


async def _connected(path: str, command: list[str], log: Path
                     ) -> tuple[subprocess.Popen[bytes], RuntimePeer, asyncio.AbstractServer]:
    """Serve ``path`` as the runtime, start ``command``; its CreateContainer connection
    (ours opens its start guard's first: answered, then closed by the plugin)."""
    arrivals: asyncio.Queue[RuntimePeer] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await arrivals.put(RuntimePeer(reader, writer))

    server = await asyncio.start_unix_server(accept, path=path)
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out)
    while True:
        peer = await asyncio.wait_for(arrivals.get(), 30)
        registered, _ = await peer.handshake(configure_first=False,
                                             runtime_name="containerd",
                                             runtime_version="1.7.24")
        if not registered.plugin_name.endswith("-guard"):
            return process, peer, server


# Between two containers the runtime, runc and the shims run: (d) cold touches this much
# memory and leaves the plugins idle this long before each request.
COLD_TOUCH = 32 << 20
COLD_IDLE = 0.005


async def process_round_trips(spec_dir: Path, reference: Path, rounds: int,
                              tmp: Path, *, cold: bool = False) -> dict[str, list[float]]:
    ours = [sys.executable, "-m", "nri_plugin.ops.cli", "plugin", "--socket",
            str(tmp / "ours.sock"), "--spec-dir", str(spec_dir), "--rescan-interval", "3600",
            "--log-level", "warning"]
    theirs = [str(reference), "-name", "nri-cdi-ref", "-idx", "10", "-socket",
              str(tmp / "ref.sock"), "-spec-dir", str(spec_dir)]
    started = [await _connected(str(tmp / "ours.sock"), ours, tmp / "ours.log"),
               await _connected(str(tmp / "ref.sock"), theirs, tmp / "ref.log")]
    # The same devices, each asked with the annotation it reads (the reference: PR #327's).
    requests = {kind: nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(id="p", name="p", namespace="n", annotations=ask),
        container=nri_pb2.Container(id="c", name="c"))
        for kind, ask in (("ours", GPU_ASK), ("reference", {"cdi.nri.io/pod": GPU_ASK[
            "cdi.k8s.io/gpus"]}))}
    timings: dict[str, list[float]] = {"ours": [], "reference": []}
    junk = bytearray(COLD_TOUCH if cold else 0)
    try:
        for index in range(rounds + 50):  # the first 50: warm-up
            order = list(zip(("ours", "reference"), started, strict=True))
            for kind, (_, peer, _) in order[index % 2:] + order[:index % 2]:
                if cold:
                    junk[::64] = bytes(len(junk[::64]))  # touch every cache line
                    time.sleep(COLD_IDLE)  # both plugins idle, as between containers
                start = time.perf_counter_ns()
                reply = await peer.response_to(peer.send_request("CreateContainer",
                                                                 requests[kind]))
                elapsed = (time.perf_counter_ns() - start) / 1000
                response = nri_pb2.CreateContainerResponse.FromString(reply.payload)
                assert reply.status.code == 0 and len(response.adjust.linux.devices) == 20, (
                    kind, reply.status, len(response.adjust.linux.devices))
                if index >= 50:
                    timings[kind].append(elapsed)
    finally:
        for process, peer, server in started:
            peer.close()
            process.kill()
            process.wait()
            server.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--reference", type=Path,
                        default=os.environ.get(REFERENCE_ENV) or None,
                        help="the Go reference CDI injector's binary, for (d)")
    # (g)'s processes
    parser.add_argument("--socket-reads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.socket_reads:
        socket_reads_here(args.socket_reads, args.read_size)
        return

    logging.disable(logging.INFO)  # one log line per injection is not what we measure
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nvidia.yaml").write_text(gpu_spec())
        snapshot = SpecCache([tmp]).refresh()
        assert not snapshot.errors, snapshot.errors
        bench_plan(snapshot, args.rounds)
        cold, empty = asyncio.run(round_trips(snapshot, args.rounds, plan_cache=False))
        warm, _ = asyncio.run(round_trips(snapshot, args.rounds, plan_cache=True))
    (c50, c99), (w50, w99), (e50, e99) = percentiles(cold), percentiles(warm), percentiles(empty)
    print(f"(b) CreateContainer round trip over a Unix socket, {args.rounds} rounds each")
    print(f"    8 GPUs, plan computed   p50 {c50:8.1f} us   p99 {c99:8.1f} us   "
          f"(/ empty = {c50 / e50:.1f})")
    print(f"    8 GPUs, plan cached     p50 {w50:8.1f} us   p99 {w99:8.1f} us   "
          f"(/ empty = {w50 / e50:.1f})")
    print(f"    no devices              p50 {e50:8.1f} us   p99 {e99:8.1f} us")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nvidia.yaml").write_text(gpu_spec())
        bench_cold(SpecCache([tmp]).refresh(), min(args.rounds, 300))
        bench_whole_stack(SpecCache([tmp]).refresh(), min(args.rounds, 400))
        bench_reply_cuts(SpecCache([tmp]).refresh(), min(args.rounds, 1000))
    bench_socket_reads(args.rounds * 5)
    bench_log_output(min(args.rounds, 2000))
    if args.reference is None:
        print(f"(d) skipped: no Go reference injector (--reference or ${REFERENCE_ENV})")
        return
    for cache_cold in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "cdi").mkdir()
            (Path(tmp) / "cdi" / "nvidia.yaml").write_text(gpu_spec())
            rounds = args.rounds if not cache_cold else min(args.rounds, 500)
            both = asyncio.run(process_round_trips(Path(tmp) / "cdi", args.reference,
                                                   rounds, Path(tmp), cold=cache_cold))
        (o50, o99), (r50, r99) = percentiles(both["ours"]), percentiles(both["reference"])
        how = (f"cold: {COLD_TOUCH >> 20} MiB touched and {COLD_IDLE * 1e3:.0f} ms idle "
               "before each" if cache_cold else "hot: back to back")
        print(f"(d) CreateContainer round trip, plugin processes, 8 GPUs, {rounds} "
              f"interleaved rounds, {how}")
        print(f"    nri-cdi plugin          p50 {o50:8.1f} us   p99 {o99:8.1f} us")
        print(f"    Go reference injector   p50 {r50:8.1f} us   p99 {r99:8.1f} us   "
              f"(ours / reference = {o50 / r50:.2f}, difference {o50 - r50:+.0f} us)")


if __name__ == "__main__":
    main()
