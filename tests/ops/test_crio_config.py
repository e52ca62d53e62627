"""CRI-O's configuration as CRI-O 1.35.6 reads it (nri_plugin/ops/crio_config.py): the main
file, the drop-ins in order, the flags last; and which CRI-O's files, found through /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdi.dirs import DEFAULT_SPEC_DIRS
from nri_plugin.ops.crio_config import (
    locate_crio,
    parse_duration,
    read_crio_config,
)


def _files(tmp_path: Path, main: str, **drop_ins: str) -> tuple[Path, Path]:
    config, folder = tmp_path / "crio.conf", tmp_path / "crio.conf.d"
    tmp_path.mkdir(parents=True, exist_ok=True)
    config.write_text(main)
    folder.mkdir()
    for name, text in drop_ins.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return config, folder


def test_defaults_where_nothing_is_set(tmp_path: Path) -> None:
    cfg = read_crio_config(str(tmp_path / "absent.conf"), str(tmp_path / "absent.d"))
    assert cfg.error is None and cfg.files == ()
    assert (cfg.nri_enabled, cfg.nri_socket, cfg.cdi_spec_dirs) == (
        True, "/var/run/nri/nri.sock", DEFAULT_SPEC_DIRS)
    assert (cfg.registration_timeout, cfg.request_timeout) == (5.0, 2.0)


def test_drop_ins_override_key_by_key_in_path_order_then_flags(tmp_path: Path) -> None:
    config, folder = _files(
        tmp_path,
        '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n[crio.nri]\nenable_nri = false\n'
        'nri_plugin_request_timeout = "5s"\n',
        **{"10-nri.conf": '[crio.nri]\nenable_nri = true\nnri_listen = "/run/a.sock"\n',
           "20-sub__01.conf": '[crio.nri]\nnri_listen = "/run/b.sock"\n',
           "30-cdi.conf": '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/srv/cdi"]\n'})
    cfg = read_crio_config(str(config), str(folder))
    assert cfg.files == (str(config), str(folder / "10-nri.conf"),
                         str(folder / "20-sub" / "01.conf"), str(folder / "30-cdi.conf"))
    assert (cfg.nri_enabled, cfg.nri_socket, cfg.request_timeout) == (True, "/run/b.sock", 5.0)
    assert cfg.cdi_spec_dirs == ("/etc/cdi", "/srv/cdi")
    flagged = read_crio_config(str(config), str(folder), flags=(
        "--enable-nri=false", "--nri-listen", "/run/c.sock", "--cdi-spec-dirs", "/x,/y",
        "--nri-plugin-request-timeout=1m30s", "--cdi-spec-dirs=/z"))
    assert (flagged.nri_enabled, flagged.nri_socket, flagged.cdi_spec_dirs,
            flagged.request_timeout) == (False, "/run/c.sock", ("/x", "/y", "/z"), 90.0)


@pytest.mark.parametrize("text, why", [
    ("[crio.nri\n", "crio.conf"),
    ('[crio.nri]\nnri_plugin_request_timeout = "soon"\n', "not a duration: 'soon'"),
    ('[crio.runtime]\ncdi_spec_dirs = "/etc/cdi"\n', "cdi_spec_dirs: not a list of paths"),
    ('[crio.nri]\nenable_nri = "yes"\n', "[crio.nri] enable_nri: not a bool"),
    ("crio = 1\n", None),
])
def test_a_bad_file_is_said_not_read(tmp_path: Path, text: str, why: str | None) -> None:
    config, folder = _files(tmp_path, text)
    cfg = read_crio_config(str(config), str(folder))
    if why is None:  # not CRI-O's tables: its defaults, read
        assert cfg.error is None and cfg.nri_enabled
        return
    assert cfg.error is not None and why in cfg.error
    assert cfg.cdi_spec_dirs == DEFAULT_SPEC_DIRS  # CRI-O's defaults, said as assumed


def test_durations() -> None:
    assert parse_duration("2s") == 2.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1h1m1s") == 3661.0
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("2 s")


def _fake_proc(root: Path, pid: int, argv: list[str], environ: dict[str, str]) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "environ").write_bytes(
        b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


def test_the_running_crio_serving_our_socket_is_found(tmp_path: Path) -> None:
    ours, theirs = _files(tmp_path / "a", '[crio.nri]\nnri_listen = "/run/ours.sock"\n')[0], \
        _files(tmp_path / "b", '[crio.nri]\nnri_listen = "/run/other.sock"\n')[0]
    proc = tmp_path / "proc"
    _fake_proc(proc, 10, ["/usr/bin/crio", "--config", str(theirs)], {})
    _fake_proc(proc, 11, ["/usr/bin/crio", "-d", str(ours.parent / "crio.conf.d")],
               {"CONTAINER_CONFIG": str(ours)})
    _fake_proc(proc, 12, ["/usr/bin/containerd"], {})
    found = locate_crio("/var/run/ours.sock", environ={}, proc=str(proc))
    assert found is not None and found.pid == 11 and found.path == str(ours)
    assert found.nri_socket == "/run/ours.sock"
    assert locate_crio("/run/nobody.sock", environ={}, proc=str(proc)) is None


def test_doctor_says_what_crio_lacks(tmp_path: Path) -> None:
    from nri_plugin.ops.doctor import check_crio_cdi, check_crio_nri

    config, folder = _files(tmp_path, '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n'
                                      '[crio.nri]\nnri_listen = "/run/nri/nri.sock"\n')
    cfg = read_crio_config(str(config), str(folder))
    cdi = check_crio_cdi(cfg, ["/etc/cdi", "/var/run/nri-cdi"])
    assert cdi.status == "fail" and "not /var/run/nri-cdi" in cdi.detail
    assert cdi.fix.endswith('cdi_spec_dirs = ["/etc/cdi", "/var/run/nri-cdi"]')
    assert check_crio_cdi(cfg, ["/etc/cdi"]).status == "ok"
    assert check_crio_nri(cfg, "/var/run/nri/nri.sock").status == "ok"
    wrong = check_crio_nri(cfg, "/run/elsewhere.sock")
    assert wrong.status == "fail" and "plugin.socket: /run/nri/nri.sock" in wrong.fix
    off = read_crio_config(str(config), str(folder), flags=("--enable-nri=false",))
    assert check_crio_nri(off, "/run/nri/nri.sock").detail == "[crio.nri] enable_nri = false"


def test_doctor_runs_crios_checks_where_crio_serves_the_socket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nri_plugin.ops import doctor, runtime_cdi
    from nri_plugin.ops.inpod import ON_NODE
    from nri_plugin.ops.settings import Settings

    config, folder = _files(tmp_path, '[crio.nri]\nnri_listen = "/run/crio-nri.sock"\n')
    found = read_crio_config(str(config), str(folder), pid=7,
                             source="the running crio (pid 7)")
    monkeypatch.setattr(runtime_cdi, "locate_crio", lambda socket: found)
    settings = Settings().with_values({
        "plugin.socket": "/run/crio-nri.sock", "plugin.spec_dirs": [str(tmp_path / "cdi")],
        "doctor.plugin_registry": str(tmp_path / "registry"),
        "plugin.pod_resources_socket": ""})
    names = [c.name for c in doctor.run_checks(settings, check_generated=False, place=ON_NODE)]
    assert names[:2] == ["CRI-O's settings", "NRI enabled in CRI-O"]
    assert names[-4:] == ["CRI-O's own CDI", "spec kinds the runtime's CDI can load",
                          "kubelet allocations", "driver architecture"]
    assert not any("containerd" in n for n in names)
