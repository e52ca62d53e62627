"""``nri-cdi refresh --wait-for-driver``: a driver container that is not ready yet (the
DaemonSet's init container starts before it) is waited for, with a bound, on a real folder
where the driver's files appear partway; past the bound, one line names what never
appeared. No test judges wall time: the waiter is observed through its own pauses."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from nri_plugin.ops.refresh import driver_parts, wait_for_driver
from nri_plugin.ops.settings import Settings

VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  "
           "Wed Aug 20 00:00:00 UTC 2025\n")
BOUND = 30.0  # never reached: the files appear, and the test waits on the waiter


def _node(root: Path) -> Settings:
    return Settings().with_values({"generate.driver_root": str(root),
                                   "generate.dev_root": str(root)})


def _module_loaded(root: Path) -> None:
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(VERSION)


def _root_mounted(root: Path) -> None:
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.580.82.07").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.82.07")


class Pauses:
    """The waiter's ``wait``: counts its pauses so that the test can wait for the waiter
    to have looked again, and never asks it to stop."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self, seconds: float) -> bool:
        with self._changed:
            self.count += 1
            self._changed.notify_all()
        return False

    def wait_for(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= count, timeout=60)


def test_the_driver_that_appears_partway_is_waited_for_and_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nri_cdi.refresh")
    parts = driver_parts(_node(tmp_path))
    pauses = Pauses()
    result: list[list[str]] = []
    waiter = threading.Thread(target=lambda: result.append(
        wait_for_driver(parts, BOUND, poll=0.001, wait=pauses)))
    waiter.start()
    pauses.wait_for(1)  # it has looked once and found nothing
    _module_loaded(tmp_path)
    seen = pauses.count
    pauses.wait_for(seen + 2)  # it has looked again since: half a driver is no driver
    assert waiter.is_alive() and not result
    _root_mounted(tmp_path)
    waiter.join(timeout=60)
    assert not waiter.is_alive() and result == [[]]

    module = f"{tmp_path}/proc/driver/nvidia/version (the kernel module)"
    library = f"libnvidia-ml.so.1 under {tmp_path} (the driver's libraries)"
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"waiting up to 30s for the NVIDIA driver: {module}; {library}"
    appeared = [m.split(": ", 1)[1] for m in messages if m.startswith("appeared after")]
    assert appeared == [module, library]  # in the order they came
    assert messages[-1].startswith("NVIDIA driver ready after")


def test_a_driver_already_there_is_not_waited_for(tmp_path: Path) -> None:
    _module_loaded(tmp_path)
    _root_mounted(tmp_path)
    pauses = Pauses()
    assert wait_for_driver(driver_parts(_node(tmp_path)), BOUND, wait=pauses) == []
    assert pauses.count == 0


def test_past_the_bound_what_never_appeared_is_returned(tmp_path: Path) -> None:
    _module_loaded(tmp_path)  # the module, but the driver container never mounted its root
    clock = [0.0]

    def wait(seconds: float) -> bool:
        clock[0] += seconds
        return False

    missing = wait_for_driver(driver_parts(_node(tmp_path)), 5.0, poll=1.0,
                              clock=lambda: clock[0], wait=wait)
    assert missing == [f"libnvidia-ml.so.1 under {tmp_path} (the driver's libraries)"]
    assert clock[0] == 5.0  # looked until the bound, not past it


def test_refresh_past_the_bound_exits_1_with_one_line_naming_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nri_plugin.ops.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(f"generate:\n  driver_root: {tmp_path}\n  dev_root: {tmp_path}\n"
                      f"  output: {tmp_path}/cdi/nvidia.yaml\n")
    assert main(["refresh", "--config", str(config), "--wait-for-driver", "0.01"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "no NVIDIA driver after waiting 0.01s (--wait-for-driver): never appeared: "
        f"{tmp_path}/proc/driver/nvidia/version (the kernel module); "
        f"libnvidia-ml.so.1 under {tmp_path} (the driver's libraries)")
    assert not (tmp_path / "cdi/nvidia.yaml").exists()  # the generator never ran


@pytest.mark.parametrize("text", ["-1", "soon"])
def test_a_bound_that_is_no_duration_is_refused(text: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from nri_plugin.ops.cli import main

    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    assert main(["refresh", "--config", str(config), "--wait-for-driver", text]) == 2
    assert "wait_for_driver" in capsys.readouterr().err


@pytest.mark.parametrize("bound, runs, status", [
    ("600", 2, 0),   # fails, the driver appears, generated again
    ("0", 1, 1),     # no wait: the first failure is the answer
])
def test_refresh_generates_again_once_the_driver_appeared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str, runs: int,
        status: int) -> None:
    from nri_plugin.ops import refresh
    from nri_plugin.ops.cli import main

    done: list[str] = []

    def generate(settings: Settings) -> refresh.Outcome:
        done.append(settings.generate.driver_root)
        if len(done) == 1:  # the driver container finishes while the generator fails
            _module_loaded(tmp_path)
            _root_mounted(tmp_path)
            return refresh.Outcome(ok=False, written=False, fingerprint=None,
                                   message="no NVIDIA driver found")
        return refresh.Outcome(ok=True, written=True, fingerprint="fp")

    monkeypatch.setattr(refresh, "run_generator", generate)
    config = tmp_path / "config.yaml"
    config.write_text(f"generate:\n  driver_root: {tmp_path}\n  dev_root: {tmp_path}\n")
    assert main(["refresh", "--config", str(config), "--wait-for-driver", bound]) == status
    assert len(done) == runs


def test_a_driver_that_generates_at_once_is_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated node's NVML needs no kernel module: the generator succeeds though
    /proc/driver/nvidia/version never appears, and refresh does not wait for it."""
    from nri_plugin.ops import refresh
    from nri_plugin.ops.cli import main

    monkeypatch.setattr(refresh, "run_generator", lambda settings: refresh.Outcome(
        ok=True, written=True, fingerprint="fp"))
    monkeypatch.setattr(refresh, "wait_for_driver", lambda *a, **k: pytest.fail("waited"))
    config = tmp_path / "config.yaml"
    config.write_text(f"generate:\n  driver_root: {tmp_path}\n  dev_root: {tmp_path}\n")
    assert main(["refresh", "--config", str(config), "--wait-for-driver", "600"]) == 0
