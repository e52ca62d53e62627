"""containerd's configuration read as containerd reads it: imports, the two merge rules,
version 1's short names; and which file, from the running containerd's command line.
(tests/e2e/test_containerd_config_e2e.py checks the merge rules against the daemons.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_plugin.nri.versions import NativeCdi
from nri_plugin.ops.containerd_config import (
    CRI_V2_SECTION,
    CRI_V3_SECTION,
    DEFAULT_PATH,
    DefaultValidator,
    locate,
    read_containerd_config,
)
from nri_plugin.ops.runtime_cdi import cri_cdi_settings

V2_ON = f'version = 2\n[plugins."{CRI_V2_SECTION}"]\n  enable_cdi = true\n'
V2_SELINUX = f'version = 2\n[plugins."{CRI_V2_SECTION}"]\n  enable_selinux = true\n'


def _write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / "config.toml"


def test_imports_relative_glob_and_nested_in_order(tmp_path: Path) -> None:
    config = _write(tmp_path, {
        "config.toml": 'version = 3\nimports = ["d/*.toml", "/nonexistent/*.toml"]\n',
        "d/20-b.toml": 'version = 3\nimports = ["../more/c.toml"]\n'
                       '[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = true\n',
        "d/10-a.toml": 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
                       '  enable_cdi = false\n  cdi_spec_dirs = ["/a"]\n',
        "more/c.toml": 'version = 3\nimports = ["../config.toml"]\n'  # a cycle: read once
                       '[plugins."io.containerd.cri.v1.runtime"]\n  cdi_spec_dirs = ["/c"]\n',
    })
    cfg = read_containerd_config(str(config), None)
    assert cfg.error is None and cfg.major == 2  # version 3: containerd 2.x
    assert cfg.files == (str(config), str(tmp_path / "d/10-a.toml"),
                         str(tmp_path / "d/20-b.toml"), str(tmp_path / "more/c.toml"))
    assert cri_cdi_settings(cfg) == (NativeCdi.ON, ("/c",))


def test_the_default_validator_and_its_tolerate_key_are_read_through_imports(
        tmp_path: Path) -> None:
    """containerd >= 2.2: [plugins."io.containerd.nri.v1.nri".default_validator], its
    required_plugins in the root file, the tolerate key in a drop-in (merged key by key)."""
    section = '[plugins."io.containerd.nri.v1.nri".default_validator]\n'
    config = _write(tmp_path, {
        "config.toml": 'version = 3\nimports = ["conf.d/*.toml"]\n' + section
                       + '  enable = true\n  required_plugins = ["nri-cdi"]\n',
        "conf.d/tolerate.toml": 'version = 3\n' + section
                                + '  tolerate_missing_plugins_annotation = "t.example.com"\n',
    })
    validator = read_containerd_config(str(config), 2).default_validator
    assert validator == DefaultValidator(enabled=True, required=("nri-cdi",),
                                         tolerate_annotation="t.example.com")
    alone = _write(tmp_path / "alone", {"config.toml": "version = 3\n" + section
                                        + '  required_plugins = ["nri-cdi"]\n'})
    off = read_containerd_config(str(alone), 2).default_validator
    assert off == DefaultValidator(required=("nri-cdi",))  # not enabled
    assert read_containerd_config(str(tmp_path / "none.toml"), 2).default_validator == (
        DefaultValidator())


def test_1x_replaces_a_plugin_section_2x_merges_keys(tmp_path: Path) -> None:
    config = _write(tmp_path, {"config.toml": 'imports = ["d.toml"]\n' + V2_ON,
                               "d.toml": V2_SELINUX})
    # Measured on the daemons (e2e): 1.7 loses the root's enable_cdi, 2.1 keeps it.
    v1, v2 = (read_containerd_config(str(config), major) for major in (1, 2))
    assert cri_cdi_settings(v1)[0] is NativeCdi.UNKNOWN
    assert cri_cdi_settings(v2)[0] is NativeCdi.ON
    unknown = read_containerd_config(str(config), None)
    assert unknown.data is None and unknown.error is not None
    assert "which containerd 1.x replaces and 2.x merges key by key" in unknown.error
    # Different sections: both rules agree, so the version need not be known.
    config.write_text('imports = ["d.toml"]\n' + V2_ON)
    (tmp_path / "d.toml").write_text('version = 2\n[plugins."io.containerd.nri.v1.nri"]\n'
                                     '  disable = false\n')
    both = read_containerd_config(str(config), None)
    assert both.error is None and cri_cdi_settings(both)[0] is NativeCdi.ON
    assert both.plugin("io.containerd.nri.v1.nri") == {"disable": False}


def test_the_cri_section_is_the_files_version_or_without_a_file_the_major(
        tmp_path: Path) -> None:
    config = _write(tmp_path, {"config.toml": V2_ON})
    assert read_containerd_config(str(config), 2).cri_section == CRI_V2_SECTION
    config.write_text(f'version = 3\n[plugins."{CRI_V3_SECTION}"]\n  enable_cdi = true\n')
    assert read_containerd_config(str(config), None).cri_section == CRI_V3_SECTION
    missing = str(tmp_path / "none.toml")
    assert [read_containerd_config(missing, major, default_drop_ins="").cri_section
            for major in (1, 2)] == [CRI_V2_SECTION, CRI_V3_SECTION]


def test_version_1_short_names(tmp_path: Path) -> None:
    config = _write(tmp_path, {"config.toml": "[plugins.cri]\n  enable_cdi = true\n"})
    cfg = read_containerd_config(str(config), 1)
    assert cri_cdi_settings(cfg) == (NativeCdi.ON, ("/etc/cdi", "/var/run/cdi"))


@pytest.mark.parametrize(("files", "words"), [
    ({"config.toml": 'version = 3\nimports = ["gone.toml"]\n'}, "gone.toml, which"),
    ({"config.toml": 'version = 3\nimports = ["d.toml"]\n', "d.toml": V2_ON},
     "is config version 2 under version 3"),
    ({"config.toml": "version = [\n"}, "config.toml: "),
    ({"config.toml": "imports = 'x.toml'\n"}, "imports is not a list"),
])
def test_what_cannot_be_known_is_said(tmp_path: Path, files: dict[str, str],
                                      words: str) -> None:
    cfg = read_containerd_config(str(_write(tmp_path, files)), 2)
    assert cfg.data is None and cfg.error is not None and words in cfg.error, cfg.error


def test_no_file_means_containerds_defaults(tmp_path: Path) -> None:
    drop_ins = str(tmp_path / "conf.d" / "*.toml")
    cfg = read_containerd_config(str(tmp_path / "none.toml"), 2, default_drop_ins=drop_ins)
    assert cfg.data is None and cfg.error is None and not cfg.running
    # containerd 2.2's default imports, with no config.toml: not modelled, so said.
    _write(tmp_path, {"conf.d/50-nvidia.toml": V2_ON})
    cfg = read_containerd_config(str(tmp_path / "none.toml"), 2, default_drop_ins=drop_ins)
    assert cfg.data is None and cfg.error is not None
    assert "containerd 2.2 and later read" in cfg.error and "50-nvidia.toml" in cfg.error


# --- which file: the running containerd's --config --------------------------------------------


def _is_containerd(pid: int) -> bool:
    """The process has exec'd into the one whose argv[0] is containerd (until then its
    command line is the shell's, which names containerd too)."""
    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    return os.path.basename(argv0) == b"containerd"


@pytest.fixture
def fake_containerd(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A real process whose command line is a containerd daemon's: ``containerd --config
    FILE`` (argv[0] set with exec -a; it only sleeps)."""
    config = _write(tmp_path, {"config.toml": V2_ON + '[plugins."io.containerd.nri.v1.nri"]\n'
                               f'  socket_path = "{tmp_path / "nri.sock"}"\n'})
    process = subprocess.Popen(
        ["bash", "-c", 'exec -a /opt/bin/containerd "$0" -c "import time; time.sleep(600)" '
         '--log-level debug --config "$1"', sys.executable, str(config)])
    try:
        deadline = time.monotonic() + 10
        while not _is_containerd(process.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield config, process.pid
    finally:
        process.kill()
        process.wait()


def test_the_running_containerd_serving_our_socket_tells_the_file(
        fake_containerd: tuple[Path, int], tmp_path: Path) -> None:
    config, pid = fake_containerd
    found = locate(None, str(tmp_path / "nri.sock"))
    assert found.path == str(config) and found.error is None
    assert found.source == f"the running containerd serving {tmp_path / 'nri.sock'} (pid {pid})"
    cfg = found.read(None)
    assert cfg.running and cri_cdi_settings(cfg)[0] is NativeCdi.ON
    # Another socket: not that containerd's; the default path, said as such.
    other = locate(None, str(tmp_path / "other.sock"))
    assert other.path == DEFAULT_PATH and "could be seen" in other.source
    # Named in the settings: that file, whatever runs.
    assert locate("/etc/x.toml", str(tmp_path / "nri.sock")).path == "/etc/x.toml"


def test_a_subcommand_is_not_the_daemon(tmp_path: Path) -> None:
    process = subprocess.Popen(
        ["bash", "-c", 'exec -a containerd "$0" -c "import time; time.sleep(600)" config dump',
         sys.executable])
    try:
        deadline = time.monotonic() + 10
        while not _is_containerd(process.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        found = locate(None, str(tmp_path / "nri.sock"))
        assert f"pid {process.pid}" not in found.source
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")
def test_a_file_in_another_mount_namespace_is_not_read(tmp_path: Path) -> None:
    # A node's containerd seen from a pod: its --config is a path this process cannot see.
    # The file there is not the one here (none here): say so, never read a stand-in.
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    script = ('mount -t tmpfs nri-cdi-test "$1" && printf "version = 3\\n" > "$1/config.toml" '
              '&& exec -a containerd "$2" -c "import time; time.sleep(600)" '
              '--config "$1/config.toml"')
    process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "bash", "-c",
                                script, "sh", str(hidden), sys.executable])
    try:
        deadline = time.monotonic() + 10
        while not _is_containerd(process.pid):
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.01)
        found = locate(None, str(tmp_path / "nri.sock"))
        assert found.path == str(hidden / "config.toml"), found
        assert found.error is not None and "cannot be seen from here" in found.error
        cfg = found.read(None)
        assert cfg.data is None and cfg.error == found.error
    finally:
        process.kill()
        process.wait()
