"""Spec refresh end to end: ``nri-cdi watch`` on a simulated node, ``nri-cdi plugin`` on a
real containerd, and a loop creating containers the whole time.

The node's driver is upgraded (580 -> 590), then MIG is enabled on its GPU. The watcher
must regenerate the spec once per change and never when nothing changed; the loop must see
no failure, and every container must carry the edits of exactly one spec version (all its
driver mounts and device nodes from the same spec file), the last ones the newest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node
from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess
from tests.ops.simchange import apply_mig, upgrade_driver

OLD, NEW = "580.82.07", "590.48.01"
SEED = "refresh-e2e"
REGENERATED = "spec regenerated"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None,
          containerd: ContainerdFactory) -> dict[str, BuiltNode]:
    # Depends on ``containerd`` only to be built once per containerd version: the test
    # upgrades the live node's driver, so each version needs a fresh one.
    if os.geteuid() != 0:
        pytest.skip("device nodes need root")
    cache = tmp_path_factory.mktemp("simnode-cache")

    def make(name: str, **kwargs: Any) -> BuiltNode:
        return build_node(tmp_path_factory.mktemp(name) / "node",
                          NodeLayout.uniform(1, seed=SEED, **kwargs), cache_dir=cache)

    return {"live": make("live", driver_version=OLD),
            "upgraded": make("upgraded", driver_version=NEW),
            "mig": make("mig", driver_version=NEW, mig={0: "1g.10gb*2"})}


class Watch:
    """``nri-cdi watch`` as a child process with its log in a file."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nri_plugin.ops.cli", "watch", "--config", str(config)],
                stdout=log, stderr=log, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def regenerations(self) -> int:
        return self.log().count(REGENERATED)

    def _running(self) -> None:
        assert self.process.poll() is None, f"watch exited:\n{self.log()}"

    def wait_regenerations(self, count: int) -> None:
        def regenerated() -> bool:
            self._running()
            return self.regenerations() >= count

        wait_until(regenerated, f"regeneration #{count}", seen=lambda: self.log()[-3000:])

    def just_after_periodic_check(self) -> None:
        """Return right after a periodic generator run finished. The next one is then a
        whole resync interval away, so a change made now is seen by the poller (and
        settled) before any periodic run could read it half-made: the count of
        regenerations per change is exact, not a race."""
        seen = self.log().count("(periodic check)")

        def checked() -> bool:
            self._running()
            return self.log().count("(periodic check)") > seen

        wait_until(checked, "the next periodic check", interval=0.005,
                   seen=lambda: self.log()[-3000:])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@dataclass
class Loop:
    """Creates, starts, inspects and removes containers until stopped."""

    ctrd: Containerd
    pod_annotations: dict[str, str]
    results: list[tuple[int, Any]] = field(default_factory=list)  # (n, runtime spec | error)
    stopping: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.stopped.set()

    def _run(self) -> None:
        with self.ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("refresh", annotations=self.pod_annotations)
            n = 0
            while not self.stopping.is_set():
                n += 1
                try:
                    # every capability: the plugin then mounts everything the spec lists
                    ctr = cri.create_container(pod, f"c{n}", BUSYBOX_IMAGE,
                                               command=["sleep", "600"],
                                               env={"NVIDIA_DRIVER_CAPABILITIES": "all"})
                    cri.start_container(ctr)
                    spec = cri.runtime_spec(ctr)
                    cri.stop_container(ctr)
                    cri.remove_container(ctr)
                    self.results.append((n, spec))
                except Exception as exc:
                    self.results.append((n, exc))

    def count(self) -> int:
        return len(self.results)

    def wait_for(self, more: int) -> None:
        target = self.count() + more
        wait_until(lambda: self.count() >= target or self.stopped.is_set(),
                   f"{more} more containers from the loop", seen=lambda: self.results[-3:])
        assert not self.stopped.is_set() or self.count() >= target, "the loop ended"


def spec_edits(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(host paths of mounts, container paths of device nodes) that ``all`` gets."""
    spec = yaml.safe_load(text)
    edits = [spec.get("containerEdits", {})]
    edits += [d["containerEdits"] for d in spec["devices"] if d["name"] == "all"]
    mounts = frozenset(m["hostPath"] for e in edits for m in e.get("mounts", []))
    nodes = frozenset(n["path"] for e in edits for n in e.get("deviceNodes", []))
    return mounts, nodes


def container_edits(spec: dict[str, Any], root: Path,
                    device_paths: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    mounts = frozenset(m["source"] for m in spec["mounts"]
                       if m.get("source", "").startswith(str(root) + "/"))
    nodes = frozenset(d["path"] for d in spec["linux"].get("devices", [])
                      if d["path"] in device_paths)
    return mounts, nodes


@pytest.fixture
def setup(nodes: dict[str, BuiltNode], containerd: ContainerdFactory,
          tmp_path: Path) -> Iterator[tuple[Watch, Loop, Path]]:
    live = nodes["live"]
    specs = tmp_path / "cdi"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "generate": {"output": str(specs / "nvidia.yaml"), "mode": "procfs",
                     "driver_root": str(live.root), "link_mode": "mounts",
                     "disabled_hooks": ["all"], "device_name_strategies": ["index"],
                     # no additionalGids: NRI cannot carry them on containerd < 1.7.30
                     "extra_args": ["--cdi-version", "0.6.0"]},
        # A resync short enough for the quiet phases below to see several "nothing changed"
        # runs, and settle and resync long enough that a change being copied in on a loaded
        # machine is not read half-made (it would count as a second regeneration).
        "watch": {"poll_interval": 0.2, "settle": 1.0, "resync_interval": 4.0},
    }))
    watch = Watch(config, tmp_path / "watch.log")
    plugin: PluginProcess | None = None
    loop: Loop | None = None
    thread: threading.Thread | None = None
    try:
        watch.wait_regenerations(1)
        ctrd = containerd()
        plugin = PluginProcess(ctrd.nri_socket, [specs], tmp_path / "plugin.log").start()
        loop = Loop(ctrd, {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        yield watch, loop, specs / "nvidia.yaml"
    finally:
        if loop is not None and thread is not None:
            loop.stopping.set()
            thread.join(timeout=60)
        if plugin is not None:
            plugin.kill()
        watch.stop()


def runc_raced_a_rename(result: object) -> bool:
    """runc bind-mounts a host file, then opens it again at its container path to remount
    it read-only and checks that path through /proc/self/fd. When the installer renames a
    new version over the host file in between, the path reads "<container path>
    (deleted)" and runc refuses the container. That is the runtime racing the upgrade, and
    native CDI races it the same way. A stale spec fails with "no such file or directory"
    instead."""
    return isinstance(result, Exception) and "(deleted)" in str(result)


def test_driver_upgrade_and_mig_change_regenerate_once_each_without_failures(
    setup: tuple[Watch, Loop, Path], nodes: dict[str, BuiltNode]
) -> None:
    watch, loop, spec_path = setup
    live = nodes["live"]
    versions = [spec_edits(spec_path.read_text())]
    loop.wait_for(5)

    # Quiet: polls and two periodic generator runs, nothing to write.
    watch.just_after_periodic_check()
    watch.just_after_periodic_check()
    assert watch.regenerations() == 1, watch.log()
    assert "spec up to date (periodic check)" in watch.log()

    watch.just_after_periodic_check()
    upgrade_driver(live, nodes["upgraded"])
    watch.wait_regenerations(2)
    versions.append(spec_edits(spec_path.read_text()))
    loop.wait_for(8)

    watch.just_after_periodic_check()
    apply_mig(live, nodes["mig"])
    watch.wait_regenerations(3)
    versions.append(spec_edits(spec_path.read_text()))
    loop.wait_for(8)
    # Quiet again: the periodic runs after the last change write nothing.
    watch.just_after_periodic_check()
    watch.just_after_periodic_check()
    loop.stopping.set()
    wait_until(loop.stopped.is_set, "the container loop to end", seen=lambda: loop.results[-1:])

    assert watch.regenerations() == 3, watch.log()
    log = watch.log()
    assert "spec regenerated (driver changed)" in log
    assert "spec regenerated (MIG layout changed)" in log
    results = [(n, r) for n, r in loop.results if not runc_raced_a_rename(r)]
    failures = [(n, r) for n, r in results if isinstance(r, Exception)]
    assert not failures, failures[:3]

    assert len(set(versions)) == 3  # three different specs
    assert any(NEW in p for p in versions[1][0]) and not any(OLD in p for p in versions[1][0])
    assert any("nvidia-caps" in p for p in versions[2][1])
    device_paths = frozenset().union(*(v[1] for v in versions))
    seen = [versions.index(container_edits(spec, live.root, device_paths))
            if container_edits(spec, live.root, device_paths) in versions else None
            for _, spec in results]
    if None in seen:
        got = container_edits(results[seen.index(None)][1], live.root, device_paths)
        detail = [(sorted(got[0] ^ v[0])[:4], sorted(got[1] ^ v[1])) for v in versions]
        raise AssertionError(f"a container got edits that match no single spec version: "
                             f"differences from each version: {detail}")
    assert seen == sorted(seen), "a container got an older spec after a newer one"
    assert set(seen) == {0, 1, 2} and seen[-1] == 2
