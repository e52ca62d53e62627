"""Hostile spec text: whatever the bytes, loading ends in our SpecError (one line per
problem, naming the file and the field) or in a spec that loads, resolves and injects.

A structure-aware fuzzer mutates a valid spec (fields dropped, duplicated, retyped; tags;
anchors and merge keys; nesting; NUL, surrogates, control characters; raw byte damage);
the deep-nesting cases run in a child process, so a crash of the parser would show as a
signal instead of taking the test run down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi.cache import _build_snapshot
from cdi.dirs import SpecFile
from cdi.edits import apply
from cdi.errors import SpecError
from cdi.spec import MAX_NESTING, Spec, parse_spec
from tests.helpers import run_generate

ROOT = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "cdiVersion": "0.7.0",
    "kind": "vendor.example/gpu",
    "annotations": {"vendor.example/a": "b"},
    "containerEdits": {"env": ["A=1"], "additionalGids": [5]},
    "devices": [
        {
            "name": "g0",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3,
                                 "permissions": "rw", "fileMode": 438}],
                "mounts": [{"hostPath": "/tmp", "containerPath": "/t", "options": ["ro"]}],
                "hooks": [{"hookName": "createContainer", "path": "/bin/true",
                           "args": ["true"], "timeout": 5}],
                "intelRdt": {"closID": "c1"},
            },
        }
    ],
}

# Values that are wrong in some way for any field, plus the YAML-only spellings below.
ODD_VALUES: list[Any] = [None, 0, -1, 2**64, 1.5, True, "", "x\0y", "\ud800", "a\nb",
                         "\x1b[31m", [], {}, ["\0"], {"": 1}, {"k\n": "v"}]
YAML_ODD = ["!!bool x", '!!int ""', '!!float ""', "!!timestamp x", "!!map [1]", "!!seq {a: 1}",
            "! 5", "!foo x", "!!null c", "!!binary aGk=", "!!set {a}", "!!omap [a: 1]",
            "!!python/object:os.system x", "&a [*a]", "1:30", "0o666", "1e3", "08", "+.5",
            "2001-01-01", "y", "n", "~", "'\\0'", '"\\ud800"', '"\\0"', "*nosuchanchor",
            "{<<: {a: 1}, b: 2}", "[" * 40 + "]" * 40, '"' + "\x07" + '"']


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (dict keys and list indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


ALL_PATHS = [p for p in _paths(BASE) if p]


def _mutate(document: Any, path: tuple[Any, ...], action: str, value: Any) -> Any:
    doc = json.loads(json.dumps(document))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "drop":
        del parent[last]
    elif action == "retype":
        parent[last] = value
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(parent[last])
    elif action == "duplicate":
        parent[f"{last}"] = parent[last]
    elif action == "unknown" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else str(value)] = 1
    return doc


def _yaml_text(document: Any, indent: int = 0) -> str:
    """Block YAML with every string double-quoted (JSON escapes are YAML escapes)."""
    pad = " " * indent
    if isinstance(document, dict) and document:
        return "".join(
            f"{pad}{json.dumps(str(k))}:" + (
                "\n" + _yaml_text(v, indent + 2) if isinstance(v, (dict, list)) and v
                else " " + _scalar(v) + "\n")
            for k, v in document.items()
        )
    if isinstance(document, list) and document:
        return "".join(
            f"{pad}-" + ("\n" + _yaml_text(v, indent + 2) if isinstance(v, (dict, list)) and v
                         else " " + _scalar(v) + "\n")
            for v in document
        )
    return pad + _scalar(document) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, str) and value.startswith("\x00RAW:"):
        return value[5:]
    return json.dumps(value)


def _check(data: bytes, name: str) -> None:
    """The property: SpecError with good lines, or a spec that loads, resolves, injects."""
    try:
        spec = parse_spec(data, name)
    except SpecError as exc:
        assert exc.errors
        for line in exc.lines():
            assert line.startswith(f"{name}: ")
            assert line.isprintable(), line  # one line, no escape sequences, no surrogates
        return
    _loads_resolves_injects(spec)


def _loads_resolves_injects(spec: Spec) -> None:
    loaded = [(SpecFile(spec.path, 0, (0, 0, 0, 0, 0)), spec)]
    snapshot = _build_snapshot((), loaded, 1, warnings={})
    assert not snapshot.errors, snapshot.errors
    edits = snapshot.resolve(sorted(snapshot.devices))
    oci = apply({"ociVersion": "1.0.2", "process": {"env": []}, "linux": {}}, edits)
    json.dumps(oci, ensure_ascii=False).encode("utf-8")  # what goes to the runtime


mutations = st.builds(
    lambda path, action, value: (path, action, value),
    st.sampled_from(ALL_PATHS),
    st.sampled_from(["drop", "retype", "duplicate", "unknown"]),
    st.sampled_from(ODD_VALUES),
)
yaml_scalars = st.sampled_from(YAML_ODD).map(lambda text: "\x00RAW:" + text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations, min_size=1, max_size=3), st.booleans())
def test_structural_mutations_end_in_a_spec_error_or_a_usable_spec(
    changes: list[tuple[tuple[Any, ...], str, Any]], as_json: bool
) -> None:
    document: Any = BASE
    for path, action, value in changes:
        try:
            document = _mutate(document, path, action, value)
        except (KeyError, IndexError, TypeError):
            continue  # the path went away with an earlier change
    if as_json:
        _check(json.dumps(document).encode("utf-8", "surrogatepass"), "hostile.json")
    else:
        _check(_yaml_text(document).encode("utf-8", "surrogatepass"), "hostile.yaml")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_PATHS), yaml_scalars, st.sampled_from(["", "&x ", "!!str "]))
def test_yaml_tags_anchors_and_odd_scalars_end_in_a_spec_error_or_a_usable_spec(
    path: tuple[Any, ...], raw: str, prefix: str
) -> None:
    document = _mutate(BASE, path, "retype", raw)
    text = _yaml_text(document)
    if prefix and raw[5:6] not in "!&*":
        text = text.replace(raw[5:], prefix + raw[5:], 1)
    _check(text.encode("utf-8", "surrogatepass"), "hostile.yaml")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_byte_damage_ends_in_a_spec_error_or_a_usable_spec(data: Any, as_json: bool) -> None:
    text = bytearray((json.dumps(BASE) if as_json else _yaml_text(BASE)).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(text) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        if action == "flip":
            text[index] = data.draw(st.sampled_from(b"\x00\x07\x1b\n\r\t\xff\xc3:-[]{}!&*'\"#%"))
        elif action == "cut":
            del text[index:]
            if not text:
                break
        elif action == "insert":
            text[index:index] = data.draw(st.sampled_from(
                [b"\x00", b"\xed\xa0\x80", b"\n  ", b"!!int ", b"<<: *a\n", b"%YAML 1.2\n---\n",
                 b"\n---\n", b"\"\\ud800\"", b"\\0"]))
        else:
            text[index:index] = text[index:index + 20]
    _check(bytes(text), "hostile.json" if as_json else "hostile.yaml")


@pytest.mark.parametrize("text, field", [
    ("- name: !!bool x", "devices[0].name"),
    ('- name: !!int ""', "devices[0].name"),
    ('- name: !!float ""', "devices[0].name"),
    ("- name: !!timestamp x", "devices[0].name"),
    ("- name: !!null c", "devices[0].name"),
    ("- name: !foo x", "devices[0].name"),
    ("- name: a\n  containerEdits: !!map [1]", "devices[0].containerEdits"),
    ("- name: a\n  containerEdits: {env: !!seq {a: 1}}", "devices[0].containerEdits.env"),
    ('- name: a\n  containerEdits: {env: ["A=\\0"]}', "devices[0].containerEdits.env[0]"),
    ('- name: a\n  containerEdits: {deviceNodes: [{path: "/dev/x\\0y"}]}',
     "devices[0].containerEdits.deviceNodes[0].path"),
])
def test_explicit_tags_and_nul_are_field_errors(text: str, field: str) -> None:
    spec = f"cdiVersion: 0.5.0\nkind: vendor.com/cls\ndevices:\n{text}\n"
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, "t.yaml")
    assert any(line.startswith(f"t.yaml: {field}: ") for line in caught.value.lines()), \
        caught.value.lines()


@pytest.mark.parametrize("where", ["path", "env", "annotation"])
def test_lone_surrogates_in_json_are_field_errors(where: str) -> None:
    document = json.loads(json.dumps(BASE))
    edits = document["devices"][0]["containerEdits"]
    if where == "path":
        edits["deviceNodes"][0]["path"] = "/dev/\ud800"
    elif where == "env":
        document["containerEdits"]["env"] = ["A=\ud800"]
    else:
        document["annotations"] = {"vendor.example/a": "\ud800"}
    with pytest.raises(SpecError) as caught:
        parse_spec(json.dumps(document), "s.json")
    assert all(line.isprintable() for line in caught.value.lines())
    assert "lone surrogate" in str(caught.value)


def test_odd_keys_are_quoted_one_error_per_line() -> None:
    spec = ('cdiVersion: 0.5.0\nkind: vendor.com/cls\n"": 1\n"k\\n\\e[31m": 2\ndevices:\n'
            "- name: a\n  containerEdits: {env: [A=1], \"x y\": 1}\n")
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, "k.yaml")
    assert caught.value.lines() == [
        "k.yaml: ['']: unknown field",
        "k.yaml: ['k\\n\\x1b[31m']: unknown field",
        "k.yaml: devices[0].containerEdits['x y']: unknown field",
    ]


def test_yaml_version_and_bare_tag_are_refused_like_the_reference() -> None:
    body = ("cdiVersion: 0.5.0\nkind: vendor.com/cls\ndevices:\n- name: a\n"
            "  containerEdits: {env: [A=1]}\n")
    parse_spec("%YAML 1.1\n---\n" + body, "v.yaml")
    with pytest.raises(SpecError, match=r"YAML version 1\.2 is not supported"):
        parse_spec("%YAML 1.2\n---\n" + body, "v.yaml")
    with pytest.raises(SpecError, match="non-specific tag"):
        parse_spec(body.replace("name: a", "name: ! a"), "v.yaml")
    # the bare tag's error names its field, as every other field error does
    nested = {"name: ! a": "devices[0].name: ",
              "env: [A=1]": "devices[0].containerEdits.env[1]: ",
              "{env: [A=1]}": "devices[0].containerEdits.mounts[0]['x y']: "}
    texts = {"name: ! a": body.replace("name: a", "name: ! a"),
             "env: [A=1]": body.replace("env: [A=1]", "env: [A=1, ! B=2]"),
             "{env: [A=1]}": body.replace("{env: [A=1]}", "{mounts: [{\"x y\": ! 1}]}")}
    for case, prefix in nested.items():
        with pytest.raises(SpecError) as caught:
            parse_spec(texts[case], "v.yaml")
        assert caught.value.lines()[0].startswith(f"v.yaml: {prefix}the non-specific tag '!'")
    # sexagesimal numbers and dates are strings, as the reference reads them
    spec = parse_spec(body.replace("name: a", "name: 1:30"), "v.yaml")
    assert spec.devices[0].name == "1:30"
    spec = parse_spec(body.replace("name: a", "name: 2001-01-01"), "v.yaml")
    assert spec.devices[0].name == "2001-01-01"


DEEP_CASES = {
    "flow.yaml": "cdiVersion: 0.3.0\nkind: vendor.com/cls\ndevices: " + "[" * 30000 + "]" * 30000,
    "block.yaml": "cdiVersion: 0.3.0\nkind: vendor.com/cls\ndevices:\n"
    + "".join(" " * i + "- \n" for i in range(1, 3000)),
    "keys.yaml": "cdiVersion: 0.3.0\nkind: vendor.com/cls\ndevices:\n" + "? [" * 5000 + "]" * 5000,
    "deep.json": '{"cdiVersion": "0.3.0", "devices": ' + "[" * 100000 + "]" * 100000 + "}",
    "objects.json": '{"a": ' * 50000 + "1" + "}" * 50000,
    "quoted.json": '{"a": "' + "[" * 5000 + '", "devices": ' + "[" * 600 + "]" * 600 + "}",
}


@pytest.mark.parametrize("name", sorted(DEEP_CASES))
def test_deep_nesting_is_a_spec_error_not_a_crash(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(DEEP_CASES[name])
    result = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "validate", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result  # not -11 (SIGSEGV)
    lines = result.stderr.splitlines()
    assert lines == [f"{path}: spec nests deeper than {MAX_NESTING} levels"], lines


def test_depth_bound_leaves_real_specs_alone() -> None:
    for golden in sorted((ROOT / "specs" / "golden").glob("*.yaml")):
        parse_spec(golden.read_bytes(), str(golden))  # no false "nests too deeply"


def test_validate_warns_about_what_breaks_other_runtimes(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("cdiVersion: 0.7.0\nkind: v/c\ndevices:\n- name: a\n  containerEdits:\n"
                    "    intelRdt: {enableCMT: true}\n")
    result = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "validate", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout == f"{path}: valid\n"
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"{path}: kind: warning: a one-letter vendor or class")
    assert warnings[1].startswith(
        f"{path}: devices[0].containerEdits.intelRdt.enableCMT: warning: dropped by the Go CDI"
    )


@pytest.mark.parametrize("flag", ["--vendor", "--class"])
def test_generate_refuses_one_letter_vendor_or_class(flag: str) -> None:
    rc, _, err = run_generate([flag, "x", "--mode", "procfs", "--driver-root", "/nonexistent"])
    assert rc != 0
    assert f"{flag} 'x': one-letter names crash runtimes" in err
