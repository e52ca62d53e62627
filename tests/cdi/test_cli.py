"""`nri-cdi list`, `validate` and `inject` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nri_plugin.ops.cli import main
from tests.helpers import simple_spec, write_specs

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "specs" / "examples"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nri_plugin.ops.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )


def test_list_sorted_with_errors_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    low = write_specs(
        tmp_path / "etc",
        {
            "b.yaml": simple_spec("b.com/xy", "1", "0"),
            "bad.yaml": "cdiVersion: 9.9.9\nkind: a/b\ndevices: []\n",
        },
    )
    high = write_specs(tmp_path / "run", {"a.yaml": simple_spec("a.com/xy", "z")})
    assert main(["list", "--spec-dir", str(low), "--spec-dir", str(high)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["a.com/xy=z", "b.com/xy=0", "b.com/xy=1"]
    assert err.splitlines() == [
        f"{low}/bad.yaml: cdiVersion: invalid version '9.9.9': known versions are 0.3.0, 0.4.0, "
        "0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0",
        f"{low}/bad.yaml: devices: a spec must define at least one device",
    ]
    assert main(["list", "--strict", "--spec-dir", str(low)]) == 1


def test_list_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_specs(tmp_path / "etc", {"b.yaml": simple_spec("b.com/xy", "0"), "c.json": "[]"})
    assert main(["list", "--json", "--spec-dir", str(folder)]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing == {
        "devices": [{"name": "b.com/xy=0", "spec": f"{folder}/b.yaml"}],
        "errors": [{"file": f"{folder}/c.json", "error": "must be a mapping, not list"}],
        "warnings": [],
    }


def test_validate_reports_each_error_on_one_line_with_file_and_field() -> None:
    result = run_cli(
        "validate", str(EXAMPLES / "fpga.json"), "specs/cases/invalid/device-node-type.json"
    )
    assert result.returncode == 1
    assert result.stdout == f"{EXAMPLES / 'fpga.json'}: valid\n"
    assert result.stderr.splitlines() == [
        "specs/cases/invalid/device-node-type.json: "
        f"devices[0].containerEdits.deviceNodes[{i}].type: must be one of b, c, u, p"
        for i in range(3)
    ]


def test_validate_all_examples_with_schema() -> None:
    result = run_cli("validate", "--schema", *map(str, sorted(EXAMPLES.iterdir())))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": valid") == len(list(EXAMPLES.iterdir()))


def test_validate_schema_flag_adds_schema_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "cdiVersion: 0.3.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n"
        "    env: [A=1]\n    hooks: [{hookName: nope, path: /x}]\n"
    )
    plain = run_cli("validate", str(bad))
    schema = run_cli("validate", "--schema", str(bad))
    assert plain.returncode == schema.returncode == 1
    assert f"{bad}: schema: devices[0].containerEdits.hooks[0].hookName:" in schema.stderr
    assert "schema:" not in plain.stderr


def test_validate_missing_file() -> None:
    result = run_cli("validate", "/nonexistent/x.yaml")
    assert result.returncode == 1
    assert result.stderr == "/nonexistent/x.yaml: cannot read: No such file or directory\n"


def test_inject_prints_the_edited_oci_spec() -> None:
    oci = {"process": {"env": ["PATH=/bin"]}, "root": {"path": "rootfs"}}
    result = run_cli(
        "inject",
        "--spec-dir",
        str(EXAMPLES),
        "--device",
        "vendor.example/device=dev1",
        "-",
        stdin=json.dumps(oci),
    )
    assert result.returncode == 0, result.stderr
    edited = json.loads(result.stdout)
    assert edited["process"]["env"] == [
        "PATH=/bin",
        "VENDOR_EXAMPLE_SPEC=1",
        "VENDOR_EXAMPLE_DEVICE=dev1",
    ]
    assert edited["linux"]["devices"] == [
        {"path": "/dev/vendor-example1", "type": "c", "major": 1, "minor": 5, "fileMode": 0o666}
    ]
    assert edited["mounts"] == [
        {
            "destination": "/etc/vendor-example-release",
            "source": "/etc/os-release",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]


def test_inject_unknown_device_fails_naming_it(tmp_path: Path) -> None:
    oci_file = tmp_path / "config.json"
    oci_file.write_text("{}")
    result = run_cli(
        "inject",
        "--spec-dir",
        str(EXAMPLES),
        "--device",
        "vendor.example/device=nine",
        "--device",
        "vendor.example/device=dev0",
        str(oci_file),
    )
    assert result.returncode == 1
    assert "unresolvable CDI devices vendor.example/device=nine" in result.stderr
    assert result.stdout == ""


def test_inject_bad_oci_input() -> None:
    result = run_cli(
        "inject",
        "--spec-dir",
        str(EXAMPLES),
        "--device",
        "vendor.example/device=dev0",
        "-",
        stdin="[1, 2]",
    )
    assert result.returncode == 1
    assert "-: cannot read OCI runtime spec: not a JSON object" in result.stderr
