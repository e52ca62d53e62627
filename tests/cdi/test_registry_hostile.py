"""The registry with hostile files beside a good one, at start and while refreshing, and
with specs rewritten in place while other specs change: the good devices stay served, the
bad file is reported, and no snapshot ever holds a cut-short or mixed spec."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.cache import Snapshot, SpecCache, file_clock_ns
from cdi.dirs import scan
from cdi.watch import AutoRefresh, Timing
from nri_cdi_testbed.waiting import wait_until
from tests.helpers import place_file, simple_spec

GOOD = simple_spec("good.example/dev", "g0")
GOOD_MORE = simple_spec("good.example/dev", "g0", "g1")
HEAD = "cdiVersion: 0.5.0\nkind: bad.example/dev\ndevices:\n"

# name -> bytes of the file, or a maker for what is not a plain file
HOSTILE: dict[str, bytes | Callable[[Path], None]] = {
    "deep.yaml": (HEAD.replace("devices:\n", "devices: ") + "[" * 30000 + "]" * 30000).encode(),
    "deep.json": b'{"devices": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "tag-bool.yaml": (HEAD + "- name: !!bool x\n").encode(),
    "tag-int.yaml": (HEAD + '- name: !!int ""\n').encode(),
    "tag-map.yaml": (HEAD + "- name: a\n  containerEdits: {env: !!map [1]}\n").encode(),
    "nul-path.json": b'{"cdiVersion": "0.5.0", "kind": "bad.example/dev", "devices": [{"name": '
    b'"a", "containerEdits": {"deviceNodes": [{"path": "/dev/x\\u0000y"}]}}]}',
    "surrogate.json": b'{"cdiVersion": "0.6.0", "kind": "bad.example/dev", "devices": [{"name": '
    b'"a", "annotations": {"a": "\\ud800"}, "containerEdits": {"env": ["A=\\ud800"]}}]}',
    "not-utf8.yaml": b"cdiVersion: 0.5.0\nkind: \xff\xfe\n",
    "empty.yaml": b"",
    "fifo.yaml": lambda path: os.mkfifo(path),
    "dangling.yaml": lambda path: os.symlink(path.parent / "nowhere", path),
    "folder.yaml": lambda path: path.mkdir(),
}


def _make(folder: Path, name: str) -> Path:
    return place_file(folder, name, HOSTILE[name])


# A quiet period no test outlasts: a file changed without a completion event is never taken
# for being still, however long the machine stalls a writer in the middle of a rewrite.
NEVER_QUIET_NS = 3600 * 10**9
# Longer than the registry's clock slack (two ticks of the kernel's coarse clock, which
# stamps files: 20 ms at HZ=100).
PAST_THE_SLACK_NS = 50_000_000


def _file_time(path: Path) -> int:
    """When the file last changed, by the kernel's stamp (what the registry compares)."""
    info = os.stat(path)
    return max(info.st_mtime_ns, info.st_ctime_ns)


def _file_clock_past(folder: Path, moment_ns: int) -> None:
    """Until a file changed now is stamped after ``moment_ns``."""
    probe = folder / "clock-probe"

    def stamped_after() -> bool:
        probe.write_bytes(b"")
        return _file_time(probe) > moment_ns

    wait_until(stamped_after, f"a file stamped after {moment_ns} ns",
               seen=lambda: _file_time(probe), interval=0.005)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_at_start_hides_nothing(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    bad = _make(folder, name)
    snapshot = SpecCache([str(folder)]).refresh()
    assert sorted(snapshot.devices) == ["good.example/dev=g0"]
    assert snapshot.resolve(["good.example/dev=g0"]).env
    assert list(snapshot.errors) == [str(bad)]
    assert all(line.isprintable() for line in snapshot.errors[str(bad)])


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_during_refresh_stops_nothing(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    cache = SpecCache([str(folder)])
    # A rescan an hour away: whatever is seen below is seen through the events.
    with AutoRefresh(cache, Timing(rescan_interval=3600)):
        assert sorted(cache.snapshot.devices) == ["good.example/dev=g0"]
        bad = _make(folder, name)
        wait_until(lambda: str(bad) in cache.snapshot.errors, f"{bad} reported",
                   seen=lambda: cache.snapshot.errors)
        tmp = folder / ".good.yaml.tmp"
        tmp.write_text(GOOD_MORE)
        tmp.rename(folder / "good.yaml")
        wait_until(lambda: "good.example/dev=g1" in cache.snapshot.devices, "g1 served",
                   seen=lambda: sorted(cache.snapshot.devices))
        snapshot = cache.snapshot
        assert sorted(snapshot.devices) == ["good.example/dev=g0", "good.example/dev=g1"]
        assert list(snapshot.errors) == [str(bad)]


def _versioned(version: int, devices: int = 30) -> str:
    body = "".join(
        f"- name: d{i}\n  containerEdits:\n    env: [VERSION={version}, DEV=d{i}]\n"
        f"    mounts: [{{hostPath: /v{version}, containerPath: /c{i}}}]\n"
        for i in range(devices)
    )
    return f"cdiVersion: 0.6.0\nkind: torn.example/dev\nannotations: {{v: '{version}'}}\n" \
        f"devices:\n{body}"


def _check_whole(snapshot: Snapshot, devices: int = 30) -> int | None:
    """The version the snapshot serves for torn.yaml, asserting it is whole and unmixed."""
    names = [n for n in snapshot.devices if n.startswith("torn.example/")]
    if not names:
        return None
    assert len(names) == devices, sorted(names)
    versions = set()
    for name in names:
        edits = snapshot.devices[name].edits
        assert len(edits.env) == 2 and len(edits.mounts) == 1, (name, edits)
        versions.add(edits.env[0])
    assert len(versions) == 1, versions
    return int(versions.pop().split("=")[1])


def test_a_file_truncated_between_the_scan_and_the_read_keeps_its_last_version(
        tmp_path: Path) -> None:
    """The interleaving the in-place test hits about one run in eight without the second
    look: the folder scan sees a complete version (closed before the events were taken),
    then a writer truncates the file before it is read. What was read must be judged by
    its own change time, not the scan's."""
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = folder / "a.yaml"
    spec.write_text(GOOD)
    cache = SpecCache([str(folder)])
    spec.write_text(GOOD_MORE)  # the next version, complete (its close event is taken)
    # The events are taken well after that version was closed (further than the slack the
    # registry allows its clock), and the truncation comes after them.
    _file_clock_past(tmp_path, _file_time(spec) + PAST_THE_SLACK_NS)
    (scanned,) = scan([str(folder)])
    spec.write_text("")  # "> a.yaml": truncated after the scan, before the read
    events_ns = now_ns = _file_time(spec)
    loaded = cache._load(scanned, {str(spec)}, NEVER_QUIET_NS, now_ns, events_ns)
    assert loaded is None, loaded  # not complete yet: keeps its last version


def test_in_place_rewrites_never_serve_a_torn_spec(tmp_path: Path) -> None:
    """torn.yaml is rewritten in place (truncate, slow chunks, close) while other.yaml is
    replaced over and over, so refreshes happen in the middle of every rewrite."""
    folder = tmp_path / "cdi"
    folder.mkdir()
    torn = folder / "torn.yaml"
    torn.write_text(_versioned(0))
    (folder / "other.yaml").write_text(GOOD)
    cache = SpecCache([str(folder)])
    rounds = 20
    stop = threading.Event()

    def rewrite() -> None:
        for version in range(1, rounds + 1):
            data = _versioned(version).encode()
            with open(torn, "wb") as handle:  # "> torn.yaml"
                for start in range(0, len(data), 700):
                    handle.write(data[start:start + 700])
                    handle.flush()
                    time.sleep(0.004)
            time.sleep(0.15)

    def churn() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            tmp = folder / ".other.tmp"
            tmp.write_text(simple_spec("good.example/dev", "g0", env=f"N={n}"))
            tmp.rename(folder / "other.yaml")
            time.sleep(0.03)

    seen = set()
    with AutoRefresh(cache, Timing(rescan_interval=3600, quiet=NEVER_QUIET_NS / 1e9)):
        writer = threading.Thread(target=rewrite)
        churner = threading.Thread(target=churn)
        writer.start()
        churner.start()
        try:
            while writer.is_alive():
                snapshot = cache.snapshot
                assert str(torn) not in snapshot.errors, snapshot.errors
                version = _check_whole(snapshot)
                assert version is not None  # the device never vanishes
                seen.add(version)
                cache.refresh(set(), quiet_ns=NEVER_QUIET_NS)  # racing the watcher's
        finally:
            writer.join()
            stop.set()
            churner.join()
        wait_until(lambda: _check_whole(cache.snapshot) == rounds, f"version {rounds} served",
                   seen=lambda: _check_whole(cache.snapshot))
    assert len(seen) >= 2, seen


def test_file_changed_without_event_is_taken_once_quiet(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = folder / "torn.yaml"
    spec.write_text(_versioned(1))
    cache = SpecCache([str(folder)])
    assert _check_whole(cache.refresh()) == 1
    with open(spec, "w") as handle:  # half of a new version, still "being written"
        handle.write(_versioned(2)[:500])
        handle.flush()
        assert _check_whole(cache.refresh(set(), quiet_ns=NEVER_QUIET_NS)) == 1
        assert cache.pending == {str(spec)}
        handle.write(_versioned(2)[500:])
    # complete and closed (the watcher would report it): taken at once
    assert _check_whole(cache.refresh({str(spec)}, quiet_ns=NEVER_QUIET_NS)) == 2
    assert not cache.pending


def test_symlink_and_fifo_are_seen_without_the_rescan(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (tmp_path / "elsewhere.yaml").write_text(GOOD)
    cache = SpecCache([str(folder)])
    with AutoRefresh(cache, Timing(rescan_interval=3600)):
        os.symlink(tmp_path / "elsewhere.yaml", folder / "link.yaml")
        wait_until(lambda: "good.example/dev=g0" in cache.snapshot.devices, "the link served",
                   seen=lambda: sorted(cache.snapshot.devices))
        os.mkfifo(folder / "pipe.yaml")
        wait_until(lambda: str(folder / "pipe.yaml") in cache.snapshot.errors,
                   "the FIFO reported", seen=lambda: cache.snapshot.errors)


def test_world_writable_spec_warns_and_can_be_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    spec = folder / "open.yaml"
    spec.write_text(GOOD)
    spec.chmod(0o666)
    snapshot = SpecCache([str(folder)]).refresh()
    assert sorted(snapshot.devices) == ["good.example/dev=g0"]
    assert snapshot.warnings == {str(spec): ("file is world-writable",)}
    refused = SpecCache([str(folder)], permissions="refuse").refresh()
    assert sorted(refused.devices) == []
    assert "refused: file is world-writable" in refused.errors[str(spec)][0]
    spec.chmod(0o644)
    folder.chmod(0o777)
    snapshot = SpecCache([str(folder)]).refresh()
    assert snapshot.warnings == {str(folder): ("spec directory is world-writable",)}
    assert SpecCache([str(folder)], permissions="refuse").refresh().devices == {}
    assert SpecCache([str(folder)], permissions="ignore").refresh().warnings == {}


def test_file_name_that_is_not_utf8_is_reported_printably(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    fd = os.open(os.fsencode(folder) + b"/bad\xff\x1b[31m.yaml", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"cdiVersion: 0.5.0\n")
    os.close(fd)
    root = Path(__file__).resolve().parents[2]
    for extra in ([], ["--json"]):
        result = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "list",
                                 "--spec-dir", str(folder), *extra],
                                cwd=root, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert b"good.example/dev=g0" in result.stdout
        err = result.stderr.decode("utf-8")
        assert all(line.isprintable() for line in err.splitlines()), err
        assert "\\udcff\\x1b[31m.yaml: kind: required field is missing" in err


def test_a_write_after_the_completion_event_makes_the_file_incomplete_again(
        tmp_path: Path) -> None:
    """The watcher took a file's close event, then the next in-place rewrite began before
    the registry read it: the file's own change time, later than when the events were
    taken, says it is not complete; the last good version stays."""
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = folder / "torn.yaml"
    spec.write_text(_versioned(1))
    cache = SpecCache([str(folder)])
    assert _check_whole(cache.refresh()) == 1
    taken_ns = time.time_ns()  # the close event of version 1 was taken here
    with open(spec, "w") as handle:  # version 2 begins, cut short for now
        handle.write(_versioned(2)[:200])
    kept = cache.refresh({str(spec)}, quiet_ns=NEVER_QUIET_NS, events_ns=taken_ns)
    assert _check_whole(kept) == 1 and str(spec) not in kept.errors
    assert str(spec) in cache.pending
    # without the time, the completion event alone would let it through but for the hold
    # on a good spec that reads as broken (the next test); a direct refresh takes it
    held = cache.refresh({str(spec)}, quiet_ns=NEVER_QUIET_NS)
    assert _check_whole(held) == 1
    assert str(spec) in cache.refresh().errors


def test_a_change_after_the_events_are_taken_is_never_stamped_earlier(tmp_path: Path) -> None:
    """The watcher stamps when it takes the events with file_clock_ns: a write that comes
    after has a change time no earlier, however late the kernel's ticks (a time.time_ns()
    stamp runs ahead of file times by a tick, more on a busy machine, past the slack)."""
    spec = tmp_path / "a.yaml"
    for _ in range(2000):
        taken_ns = file_clock_ns()
        spec.write_bytes(b"x")
        assert _file_time(spec) >= taken_ns


def test_a_good_spec_caught_truncated_keeps_serving_until_it_is_complete(
        tmp_path: Path) -> None:
    """Taken as complete (its close event was read), then truncated for the next rewrite
    just before it is read: the kernel shows the new size before the truncation's event and
    change time, so nothing yet says it is being rewritten (seen under load). A good spec
    that reads as broken keeps its last good version while it changed less than the quiet
    time ago; a direct refresh takes what it reads."""
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = folder / "dev.yaml"
    spec.write_text(GOOD)
    cache = SpecCache([str(folder)])
    assert "good.example/dev=g0" in cache.refresh().devices
    spec.write_text("")  # truncated: the writer's next chunk has not come yet
    later = file_clock_ns() + 10**9  # its completion taken after this, as far as times say
    held = cache.refresh({str(spec)}, quiet_ns=NEVER_QUIET_NS, events_ns=later)
    assert "good.example/dev=g0" in held.devices and not held.errors
    assert str(spec) in cache.pending
    spec.write_text(GOOD_MORE)  # complete again
    assert "good.example/dev=g1" in cache.refresh({str(spec)}, quiet_ns=NEVER_QUIET_NS).devices
    spec.write_text("")
    assert str(spec) in cache.refresh().errors  # a direct refresh: what it reads
