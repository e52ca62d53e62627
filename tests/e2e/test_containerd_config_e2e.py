"""containerd's configuration as the plugin and doctor read it, against what each real
containerd made of it (asked through CRI Status, verbose: its effective CRI config), and
the plugin that is not told where the file is (issue 41, defect 6: it said "own CDI on,
/etc/cdi, /var/run/cdi" for a containerd 2.1 with enable_cdi = false)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nri_plugin.nri.versions import NativeCdi
from nri_plugin.ops.containerd_config import locate, read_containerd_config
from nri_plugin.ops.runtime_cdi import cri_cdi_settings
from tests.e2e import paths
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.plugin import REPO, PluginProcess
from tests.helpers import simple_spec, write_specs

V2 = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
V3 = 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
GC = 'version = {v}\n[plugins."io.containerd.gc.v1.scheduler"]\n  pause_threshold = 0.03\n'

# version -> case -> the drop-in (the root config, made by Containerd, has
# enable_cdi = true and cdi_spec_dirs = ["/etc/cdi"] in its CRI section).
CASES: dict[str, dict[str, str]] = {
    "1.7": {
        "another key of the CRI section": V2 + "  enable_selinux = false\n",
        "the spec folders": V2 + '  cdi_spec_dirs = ["/x"]\n',
        "another plugin's section": GC.format(v=2),
    },
    "2.1": {
        "enable_cdi off": V3 + "  enable_cdi = false\n",
        "the spec folders": V3 + '  cdi_spec_dirs = ["/x"]\n',
        "another plugin's section": GC.format(v=3),
        "a version 2 drop-in": V2 + "  enable_cdi = false\n",
    },
}
DEFAULT_ON = {"1.7": False, "2.1": True}


def _effective(ctrd: Containerd) -> tuple[bool, list[str]]:
    """(enable_cdi, cdi_spec_dirs) as the running containerd has them."""
    with CriClient(ctrd.address) as cri:
        status = cri.runtime.Status(cri.pb.StatusRequest(verbose=True), timeout=30)
    config = json.loads(status.info["config"])
    return bool(config["enableCDI"]), list(config["cdiSpecDirs"])


@pytest.mark.parametrize(("version", "case"), [
    (v, case) for v in paths.runtimes() for case in CASES.get(v, {})])
def test_drop_ins_read_as_containerd_reads_them(e2e_ready: None, version: str,
                                                case: str) -> None:
    ctrd = Containerd(version=version, enable_cdi=True, cdi_spec_dirs=["/etc/cdi"],
                      drop_ins={"50-case.toml": CASES[version][case]})
    try:
        ctrd.start()
        enabled, dirs = _effective(ctrd)
        ours = read_containerd_config(str(ctrd.config_path), ctrd.major)
        if ours.error is not None:
            # What nri-cdi cannot know it says it does not know; here containerd 2.1
            # ignored the version 2 file's enable_cdi.
            assert case == "a version 2 drop-in" and (enabled, dirs) == (True, ["/etc/cdi"])
            assert "is config version 2 under version 3" in ours.error
            return
        assert len(ours.files) == 2
        our_enabled, our_dirs = cri_cdi_settings(ours)
        assert (DEFAULT_ON[version] if our_enabled is NativeCdi.UNKNOWN
                else our_enabled is NativeCdi.ON,
                list(our_dirs)) == (enabled, dirs)
        # Where both merge rules agree, the version need not be known.
        if case == "another plugin's section":
            assert read_containerd_config(str(ctrd.config_path), None).data == ours.data
    finally:
        ctrd.close()


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_specs(tmp_path_factory.mktemp("cfg") / "cdi",
                       {"x.yaml": simple_spec("cfg.example/dev", "a", env="A=1")})


@pytest.mark.containerd_versions("2.1")
def test_the_plugin_not_told_reads_the_running_containerds_file(
        containerd: ContainerdFactory, specs: Path, tmp_path: Path) -> None:
    # The defect's set-up: containerd 2.1 started with --config elsewhere than
    # /etc/containerd/config.toml, its own CDI turned off there (in a drop-in, here), and
    # the plugin given no --containerd-config.
    ctrd = containerd(enable_cdi=True, drop_ins={"50-off.toml": V3 + "  enable_cdi = false\n"})
    assert _effective(ctrd)[0] is False
    plugin = PluginProcess(ctrd.nri_socket, [specs], tmp_path / "plugin.log")
    assert "--containerd-config" not in plugin.command()
    plugin.start()
    try:
        log = plugin.log()
        line = next(x for x in log.splitlines() if "connected to containerd" in x)
        assert "runtime's own CDI off" in line, line
        assert f"read from {ctrd.config_path} (+ {ctrd.workdir / 'conf.d/50-off.toml'})" in line
        assert "not read" not in log
    finally:
        plugin.kill()
    found = locate(None, ctrd.nri_socket)
    assert found.path == str(ctrd.config_path) and ctrd.pid is not None
    assert f"(pid {ctrd.pid})" in found.source


@pytest.mark.containerd_versions("2.1")
def test_doctor_not_told_reads_the_running_containerds_file(
        containerd: ContainerdFactory, tmp_path: Path) -> None:
    ctrd = containerd(enable_cdi=True, drop_ins={"50-off.toml": V3 + "  enable_cdi = false\n"})
    done = subprocess.run(
        [sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--json", "--no-generate",
         "--config", "/dev/null", "--socket", ctrd.nri_socket,
         "--status-dir", str(tmp_path / "status"), "--spec-dir", str(tmp_path / "cdi")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    settings = checks["containerd's settings"]
    assert settings["status"] == "ok", settings
    assert settings["detail"].startswith(f"read {ctrd.config_path} (+ ")
    assert f"the running containerd serving {ctrd.nri_socket} (pid {ctrd.pid})" in \
        settings["detail"]
    assert checks["NRI enabled in containerd"]["status"] == "ok"
    # enable_cdi is off (the drop-in), and the version is the running binary's (2.1):
    # DRA claims would not reach a CDI injector.
    assert "enable_cdi is off" in checks["DRA claims reach a CDI injector"]["detail"]
