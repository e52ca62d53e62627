"""The spec registry on real directories: priority, conflicts, bad files, refresh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cdi.cache import SpecCache
from cdi.errors import UnresolvedDevicesError
from cdi.watch import AutoRefresh, Timing
from nri_cdi_testbed.waiting import wait_until
from tests.helpers import make_char_device, simple_spec, write_specs

VENDOR_A = simple_spec("vendor-a.com/fpga", "f0", "f1")
VENDOR_B = simple_spec("vendor-b.com/nic", "n0")


def test_devices_of_all_dirs_are_listed_sorted(tmp_path: Path) -> None:
    low = write_specs(tmp_path / "etc", {"a.yaml": VENDOR_A})
    high = write_specs(
        tmp_path / "run",
        {
            "b.json": '{"cdiVersion": "0.3.0", "kind": '
            '"vendor-b.com/nic", "devices": [{"name": "n0", '
            '"containerEdits": {"env": ["N=0"]}}]}'
        },
    )
    snapshot = SpecCache([str(low), str(high)]).refresh()
    assert sorted(snapshot.devices) == [
        "vendor-a.com/fpga=f0",
        "vendor-a.com/fpga=f1",
        "vendor-b.com/nic=n0",
    ]
    assert dict(snapshot.errors) == {}


def test_later_directory_wins(tmp_path: Path) -> None:
    low = write_specs(tmp_path / "etc", {"gpu.yaml": simple_spec("x.com/gpu", "0", env="V=old")})
    high = write_specs(tmp_path / "run", {"gpu.yaml": simple_spec("x.com/gpu", "0", env="V=new")})
    snapshot = SpecCache([str(low), str(high)]).refresh()
    assert snapshot.resolve(["x.com/gpu=0"]).env == ("V=new", "DEV_0=0")
    assert snapshot.devices["x.com/gpu=0"].spec.path == str(high / "gpu.yaml")
    assert dict(snapshot.errors) == {}  # shadowing is silent, as priorities promise


def test_equal_priority_conflict_drops_device_and_reports_both(tmp_path: Path) -> None:
    folder = write_specs(
        tmp_path / "etc",
        {
            "one.yaml": simple_spec("x.com/gpu", "0", "1"),
            "two.yaml": simple_spec("x.com/gpu", "1", "2"),
        },
    )
    snapshot = SpecCache([str(folder)]).refresh()
    assert sorted(snapshot.devices) == ["x.com/gpu=0", "x.com/gpu=2"]
    one, two = str(folder / "one.yaml"), str(folder / "two.yaml")
    assert set(snapshot.errors) == {one, two}
    assert "conflicting device 'x.com/gpu=1'" in snapshot.errors[one][0]
    assert two in snapshot.errors[one][0]
    with pytest.raises(UnresolvedDevicesError, match="more than one spec of equal priority"):
        snapshot.resolve(["x.com/gpu=1"])


def test_conflict_below_a_higher_definition_does_not_drop_it(tmp_path: Path) -> None:
    low = write_specs(
        tmp_path / "etc",
        {"one.yaml": simple_spec("x.com/gpu", "0"), "two.yaml": simple_spec("x.com/gpu", "0")},
    )
    high = write_specs(tmp_path / "run", {"gpu.yaml": simple_spec("x.com/gpu", "0", env="H=1")})
    snapshot = SpecCache([str(low), str(high)]).refresh()
    assert snapshot.resolve(["x.com/gpu=0"]).env[0] == "H=1"


def test_bad_file_never_hides_good_ones(tmp_path: Path) -> None:
    folder = write_specs(
        tmp_path / "etc",
        {
            "a.yaml": VENDOR_A,
            "broken.yaml": "cdiVersion: 0.3.0\nkind: vendor-c.com/x\ndevices: [{name: d}]\n",
            "syntax.json": "{not json",
            "z.yaml": VENDOR_B,
            "ignored.yml": "not read at all: [",
            "notes.txt": "ignored",
        },
    )
    snapshot = SpecCache([str(folder)]).refresh()
    assert sorted(snapshot.devices) == [
        "vendor-a.com/fpga=f0",
        "vendor-a.com/fpga=f1",
        "vendor-b.com/nic=n0",
    ]
    assert set(snapshot.errors) == {str(folder / "broken.yaml"), str(folder / "syntax.json")}
    assert snapshot.errors[str(folder / "broken.yaml")] == (
        "devices[0].containerEdits: required field is missing",
    )
    assert snapshot.errors[str(folder / "syntax.json")][0].startswith("invalid JSON")


def test_fifo_named_like_a_spec_is_reported_not_opened(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "etc", {"a.yaml": VENDOR_A})
    os.mkfifo(folder / "pipe.yaml")
    os.mkdir(folder / "dir.yaml")
    snapshot = SpecCache([str(folder)]).refresh()
    assert len(snapshot.devices) == 2
    assert snapshot.errors[str(folder / "pipe.yaml")] == ("not a regular file",)
    assert snapshot.errors[str(folder / "dir.yaml")] == ("not a regular file",)


def test_missing_directories_are_skipped(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "etc", {"a.yaml": VENDOR_A})
    snapshot = SpecCache([str(tmp_path / "nope"), str(folder)]).refresh()
    assert len(snapshot.devices) == 2 and not snapshot.errors


def test_resolve_merges_spec_edits_once_per_file_in_request_order(tmp_path: Path) -> None:
    folder = write_specs(
        tmp_path / "etc",
        {
            "a.yaml": """\
        cdiVersion: 0.5.0
        kind: x.com/gpu
        containerEdits:
          env: [COMMON=1]
        devices:
        - {name: "0", containerEdits: {env: [D0=1]}}
        - {name: "1", containerEdits: {env: [D1=1]}}
        """,
            "b.yaml": """\
        cdiVersion: 0.3.0
        kind: y.com/nic
        containerEdits:
          env: [NIC=1]
        devices:
        - {name: n, containerEdits: {env: [N=1]}}
        """,
        },
    )
    snapshot = SpecCache([str(folder)]).refresh()
    edits = snapshot.resolve(["x.com/gpu=1", "y.com/nic=n", "x.com/gpu=0", "x.com/gpu=1"])
    assert edits.env == ("COMMON=1", "D1=1", "NIC=1", "N=1", "D0=1")


def test_resolve_names_every_unresolvable_device(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "etc", {"a.yaml": VENDOR_A})
    snapshot = SpecCache([str(folder)]).refresh()
    with pytest.raises(UnresolvedDevicesError) as info:
        snapshot.resolve(["vendor-a.com/fpga=f0", "vendor-a.com/fpga=f9", "not-a-name"])
    assert tuple(info.value.reasons) == ("vendor-a.com/fpga=f9", "not-a-name")
    assert "no such device" in str(info.value)
    assert "not a qualified CDI device name" in str(info.value)


def test_host_device_info_is_filled_at_load_and_errors_only_on_request(
    tmp_path: Path, need_root: None
) -> None:
    node = make_char_device(tmp_path / "gpu0", major=1, minor=3, mode=0o660)
    folder = write_specs(
        tmp_path / "etc",
        {
            "a.yaml": f"""\
        cdiVersion: 0.5.0
        kind: x.com/gpu
        devices:
        - name: good
          containerEdits:
            deviceNodes: [{{path: /dev/gpu0, hostPath: {node}}}]
        - name: missing
          containerEdits:
            deviceNodes: [{{path: {tmp_path}/absent}}]
        """
        },
    )
    snapshot = SpecCache([str(folder)]).refresh()
    filled = snapshot.resolve(["x.com/gpu=good"]).device_nodes[0]
    assert (filled.type, filled.major, filled.minor, filled.file_mode) == ("c", 1, 3, 0o660)
    with pytest.raises(UnresolvedDevicesError, match="failed to stat CDI host device"):
        snapshot.resolve(["x.com/gpu=missing"])


def test_unchanged_files_are_not_parsed_again(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "etc", {"a.yaml": VENDOR_A, "b.yaml": VENDOR_B})
    cache = SpecCache([str(folder)])
    first = cache.refresh()
    (folder / "b.yaml").write_text(simple_spec("vendor-b.com/nic", "n0", "n1"))
    second = cache.refresh()
    spec_a = str(folder / "a.yaml")
    assert second.specs[spec_a].spec is first.specs[spec_a].spec  # same object: not re-parsed
    assert "vendor-b.com/nic=n1" in second.devices
    assert second.generation == first.generation + 1


def test_auto_refresh_sees_new_changed_and_removed_files(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "cdi"  # does not exist yet: its creation must be noticed
    cache = SpecCache([str(folder)])
    with AutoRefresh(cache, Timing(rescan_interval=3600)):
        assert sorted(cache.snapshot.devices) == []
        folder.mkdir(parents=True)
        write_specs(folder, {"a.yaml": VENDOR_A})
        wait_until(lambda: len(cache.snapshot.devices) == 2, "a.yaml's 2 devices served",
                   seen=lambda: sorted(cache.snapshot.devices))
        (folder / "a.yaml").write_text(simple_spec("vendor-a.com/fpga", "f0"))
        wait_until(lambda: len(cache.snapshot.devices) == 1, "a.yaml's new device alone",
                   seen=lambda: sorted(cache.snapshot.devices))
        (folder / "a.yaml").unlink()
        wait_until(lambda: len(cache.snapshot.devices) == 0, "no device once a.yaml is gone",
                   seen=lambda: sorted(cache.snapshot.devices))


WRITER = textwrap.dedent("""\
    import os, sys
    folder, rounds = sys.argv[1], int(sys.argv[2])
    for version in range(1, rounds + 1):
        devices = "".join(
            f"- name: d{i}\\n  containerEdits:\\n    env: [VERSION={version}, PAD={'x' * 4000}]\\n"
            for i in range(40))
        text = (f"cdiVersion: 0.6.0\\nkind: x.com/gpu\\nannotations: {{version: '{version}'}}\\n"
                f"devices:\\n{devices}")
        tmp = os.path.join(folder, ".gpu.yaml.tmp")
        with open(tmp, "w") as handle:
            handle.write(text)
        os.rename(tmp, os.path.join(folder, "gpu.yaml"))
    """)


def test_refresh_during_renames_never_sees_a_half_written_spec(tmp_path: Path) -> None:
    folder = write_specs(tmp_path / "cdi", {})
    cache = SpecCache([str(folder)])
    rounds = 300
    seen_versions = set()
    with AutoRefresh(cache, Timing(rescan_interval=3600)):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(rounds)])
        try:
            deadline = time.monotonic() + 120
            while (writer.poll() is None or len(seen_versions) < 2) and (
                time.monotonic() < deadline
            ):
                snapshot = cache.snapshot
                assert not snapshot.errors, snapshot.errors
                if snapshot.devices:
                    spec = next(iter(snapshot.specs.values())).spec
                    version = spec.data.annotations["version"]
                    envs = {d.edits.env[0] for d in snapshot.devices.values()}
                    assert len(snapshot.devices) == 40
                    assert envs == {f"VERSION={version}"}  # one version, never a mix
                    seen_versions.add(version)
                cache.refresh()  # also refresh from this thread, racing the watcher
        finally:
            writer.wait()
        def served_version() -> str | None:
            specs = cache.snapshot.specs
            return next(iter(specs.values())).spec.data.annotations["version"] if specs else None

        wait_until(lambda: served_version() == str(rounds), f"version {rounds} served",
                   seen=served_version)
    assert len(seen_versions) >= 2


def test_an_empty_folder_list_means_no_folders_and_none_means_the_defaults() -> None:
    from cdi.dirs import DEFAULT_SPEC_DIRS

    empty = SpecCache([])
    assert empty.spec_dirs == ()
    snapshot = empty.refresh()
    assert (dict(snapshot.devices), dict(snapshot.errors), snapshot.spec_dirs) == ({}, {}, ())
    assert SpecCache().spec_dirs == DEFAULT_SPEC_DIRS
    assert SpecCache(None).spec_dirs == DEFAULT_SPEC_DIRS
