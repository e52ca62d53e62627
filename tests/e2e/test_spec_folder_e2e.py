"""The plugin's spec folder under attack, on a real containerd.

* Hostile files (too deep, bad tags, NUL, lone surrogates, a FIFO, a dangling symlink)
  beside a good spec, present when the plugin starts and dropped in while it runs: the
  good devices keep being injected, every bad file is named in the log.
* A spec rewritten in place (truncated, then written in slow chunks) and by atomic
  renames, while another spec in the folder keeps changing and containers are created in
  a loop: no creation fails, and every container gets one whole version of the spec.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import PluginProcess
from tests.helpers import place_file

SLEEP = ["sleep", "600"]
GOOD_HEAD = "cdiVersion: 0.5.0\nkind: good.example/dev\ndevices:\n"
BAD_HEAD = "cdiVersion: 0.5.0\nkind: bad.example/dev\ndevices:\n"


def _good(*names: str) -> str:
    return GOOD_HEAD + "".join(
        f"- name: {n}\n  containerEdits:\n    env: [GOOD_{n.upper()}=1]\n" for n in names)


HOSTILE: dict[str, bytes | Callable[[Path], None]] = {
    "deep.yaml": (BAD_HEAD.replace("devices:\n", "devices: ") + "[" * 30000 + "]" * 30000)
    .encode(),
    "tags.yaml": (BAD_HEAD + "- name: !!bool x\n  containerEdits: {env: !!map [1]}\n").encode(),
    "nul.json": b'{"cdiVersion": "0.5.0", "kind": "bad.example/dev", "devices": [{"name": '
    b'"a", "containerEdits": {"deviceNodes": [{"path": "/dev/x\\u0000y"}]}}]}',
    "surrogate.json": b'{"cdiVersion": "0.5.0", "kind": "bad.example/dev", "devices": [{"name":'
    b' "a", "containerEdits": {"env": ["A=\\ud800"]}}]}',
    "fifo.yaml": lambda path: os.mkfifo(path),
    "dangling.yaml": lambda path: os.symlink(path.parent / "nowhere", path),
}


def _drop(folder: Path, name: str) -> Path:
    return place_file(folder, name, HOSTILE[name])


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _env_once_served(ctrd: Containerd, pod: str, cri: Any, plugin: Any,
                     device: str) -> list[str]:
    """``_env`` of a new container asking for ``device``, retried until the plugin serves it
    (the registry takes a changed file after its event and a short settle)."""
    return wait_until(lambda: _env(ctrd, pod, cri, f"c1-{time.monotonic_ns()}", device),
                      f"a container served {device}", interval=0.2, retry_on=(Exception,),
                      seen=lambda: plugin.log()[-3000:])


def _env(ctrd: Containerd, pod: str, cri: Any, name: str, device: str) -> list[str]:
    ctr = cri.create_container(pod, name, BUSYBOX_IMAGE, command=SLEEP,
                               annotations={"cdi.k8s.io/t": device})
    try:
        return list(cri.runtime_spec(ctr)["process"]["env"])
    finally:
        cri.remove_container(ctr)


@pytest.fixture
def plugin_factory(tmp_path: Path) -> Any:
    started: list[PluginProcess] = []

    def start(ctrd: Containerd, folder: Path, *extra: str) -> PluginProcess:
        plugin = PluginProcess(ctrd.nri_socket, [folder], tmp_path / "plugin.log",
                               extra_args=extra).start()
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.kill()


def test_hostile_files_never_hide_the_good_spec(
    containerd: ContainerdFactory, plugin_factory: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "good.yaml").write_text(_good("g0"))
    at_start = ["deep.yaml", "tags.yaml", "nul.json"]
    later = ["surrogate.json", "fifo.yaml", "dangling.yaml"]
    for name in at_start:
        _drop(folder, name)
    ctrd = containerd()
    plugin = plugin_factory(ctrd, folder)
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("hostile")
        assert "GOOD_G0=1" in _env(ctrd, pod, cri, "c0", "good.example/dev=g0")
        for name in at_start:
            plugin.wait_for_log(f"{folder / name}: ")
        # dropped in while the plugin runs, then the good spec changes: the change is seen
        for name in later:
            _drop(folder, name)
        _replace(folder / "good.yaml", _good("g0", "g1"))
        env = _env_once_served(ctrd, pod, cri, plugin, "good.example/dev=g1")
        assert "GOOD_G1=1" in env
        for name in later:
            plugin.wait_for_log(f"{folder / name}: ")
        assert "GOOD_G0=1" in _env(ctrd, pod, cri, "c2", "good.example/dev=g0")
    log = plugin.log()
    assert "Traceback" not in log and "refreshing CDI specs failed" not in log, log[-3000:]
    assert plugin.process is not None and plugin.process.poll() is None

    # a restart with every hostile file present still serves the good devices
    plugin.kill()
    plugin = plugin_factory(ctrd, folder)
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("hostile-restart")
        assert "GOOD_G1=1" in _env(ctrd, pod, cri, "c3", "good.example/dev=g1")


ENTRIES = 24


def _versioned(version: int) -> str:
    # Many entries, so a cut-short file is likely to still parse (and be caught by the
    # count), and one END marker last.
    env = ", ".join([f"E{i}={version}" for i in range(ENTRIES)] + [f"END={version}"])
    return ("cdiVersion: 0.5.0\nkind: torn.example/dev\ndevices:\n- name: d\n"
            f"  containerEdits:\n    env: [{env}]\n")


def _version_of(env: list[str]) -> int:
    """The one spec version a container's env carries; fails on a mix or a cut."""
    ours = [e for e in env if e.split("=", 1)[0] in {f"E{i}" for i in range(ENTRIES)} | {"END"}]
    versions = {e.split("=", 1)[1] for e in ours}
    assert len(ours) == ENTRIES + 1 and len(versions) == 1, ours
    return int(versions.pop())


def test_rewrites_in_place_and_renames_during_a_creation_loop(
    containerd: ContainerdFactory, plugin_factory: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    torn = folder / "torn.yaml"
    torn.write_text(_versioned(0))
    (folder / "other.yaml").write_text(_good("g0"))
    ctrd = containerd()
    plugin = plugin_factory(ctrd, folder)
    stop = threading.Event()
    results: list[Any] = []

    def create_loop() -> None:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("torn", annotations={"cdi.k8s.io/t": "torn.example/dev=d"})
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    ctr = cri.create_container(pod, f"c{n}", BUSYBOX_IMAGE, command=SLEEP)
                    results.append(list(cri.runtime_spec(ctr)["process"]["env"]))
                    cri.remove_container(ctr)
                except Exception as exc:
                    results.append(exc)

    def churn_other() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            _replace(folder / "other.yaml", _good("g0", f"n{n % 7}"))
            time.sleep(0.02)

    loop = threading.Thread(target=create_loop)
    churn = threading.Thread(target=churn_other)
    loop.start()
    churn.start()
    rounds = 24
    try:
        for version in range(1, rounds + 1):
            data = _versioned(version).encode()
            if version % 3 == 0:
                _replace(torn, data.decode())  # atomic rename
            else:
                with open(torn, "wb") as handle:  # "> torn.yaml", slow chunks
                    for start in range(0, len(data), 40):
                        handle.write(data[start:start + 40])
                        handle.flush()
                        time.sleep(0.01)
            # The next version only once a container got this one, however slow the
            # machine: every version is served in turn while the loop and the churn go on.
            wait_until(lambda version=version: any(
                isinstance(r, list) and _version_of(r) >= version for r in results[-3:]),
                f"version {version} served", seen=lambda: results[-3:])
    finally:
        stop.set()
        loop.join(timeout=60)
        churn.join(timeout=10)
    failures = [r for r in results if isinstance(r, Exception)]
    assert not failures, failures[:3]
    versions = [_version_of(env) for env in results]
    assert len(results) >= 10 and len(set(versions)) >= 3, versions
    assert versions == sorted(versions), versions  # never an older version after a newer
    assert "Traceback" not in plugin.log()


def test_world_writable_spec_is_refused_when_configured(
    containerd: ContainerdFactory, plugin_factory: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    folder.chmod(0o755)
    spec = folder / "open.yaml"
    spec.write_text(_good("g0"))
    spec.chmod(0o666)
    config = tmp_path / "config.yaml"
    config.write_text("plugin:\n  spec_permissions: refuse\nlog:\n  level: debug\n")
    ctrd = containerd()
    plugin = plugin_factory(ctrd, folder, "--config", str(config))
    plugin.wait_for_log(f"{spec}: refused: file is world-writable")
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("perms")
        with pytest.raises(Exception, match="no such device"):
            _env(ctrd, pod, cri, "c0", "good.example/dev=g0")
        spec.chmod(0o644)  # fixed: the attribute change alone brings it in
        env = _env_once_served(ctrd, pod, cri, plugin, "good.example/dev=g0")
        assert "GOOD_G0=1" in env
