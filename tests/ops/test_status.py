"""The status file's lock during an upgrade's overlap: two plugins of one name and index on
one node, the older owning the file (and the metrics address) until it ends, however it
ends; the newer taking both over then. And the ready file, the process's own."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from nri_cdi_testbed.node_check.paths import REPO
from nri_cdi_testbed.waiting import wait_until
from nri_plugin.ops.status import CONNECTED, STOPPED, StatusFile, read_status, set_ready


def _file(folder: Path) -> dict[str, object]:
    reading = read_status(str(folder), "nri-cdi", "10")
    assert reading.status is not None, reading.problem
    return {"socket": reading.status.socket, "state": reading.status.state,
            "pid": reading.status.pid, "alive": reading.alive}


def test_the_newer_plugin_takes_the_file_over_when_the_older_stops(tmp_path: Path) -> None:
    old = StatusFile(str(tmp_path), name="nri-cdi", index="10", socket="/old.sock").start()
    old.connected(None)
    owned = threading.Event()
    new = StatusFile(str(tmp_path), name="nri-cdi", index="10", socket="/new.sock").start(
        on_owner=owned.set)
    new.connected(None)  # serving too, but the file is the older one's
    assert not owned.is_set()
    assert _file(tmp_path)["socket"] == "/old.sock"
    old.stopped()
    wait_until(owned.is_set, "the newer plugin owns the status file")
    got = _file(tmp_path)
    assert (got["socket"], got["state"], got["alive"]) == ("/new.sock", CONNECTED, True)
    new.stopped()
    got = _file(tmp_path)
    assert (got["state"], got["alive"]) == (STOPPED, False)


def test_an_older_plugin_killed_hands_over_too(tmp_path: Path) -> None:
    """SIGKILL: no ``stopped()`` runs; the kernel's release of the lock is the hand-over."""
    older = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from nri_plugin.ops.status import StatusFile\n"
         f"s = StatusFile({str(tmp_path)!r}, name='nri-cdi', index='10', socket='/old.sock')"
         ".start()\n"
         "s.connected(None)\nprint('owned', flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert older.stdout is not None and older.stdout.readline() == "owned\n"
        owned = threading.Event()
        new = StatusFile(str(tmp_path), name="nri-cdi", index="10", socket="/new.sock").start(
            on_owner=owned.set)
        assert not owned.is_set() and _file(tmp_path)["pid"] == older.pid
    finally:
        older.kill()
        older.wait()
    wait_until(owned.is_set, "the newer plugin owns the status file")
    assert _file(tmp_path)["socket"] == "/new.sock"
    new.stopped()


def test_without_a_folder_the_plugin_owns_nothing_and_serves_its_metrics_at_once() -> None:
    owned = threading.Event()
    StatusFile("", name="nri-cdi", index="10", socket="/s").start(on_owner=owned.set)
    assert owned.is_set()


def test_the_ready_file_follows_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "pod" / "ready"
    set_ready(str(path), True)
    assert path.exists()
    set_ready(str(path), False)
    assert not path.exists()
    set_ready(str(path), False)  # absent already: no error
    set_ready("", True)  # off
