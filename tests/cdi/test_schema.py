"""Our JSON Schema (specs/cdi-spec.schema.json) agrees with the code on every spec case."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from cdi import schema as schema_module
from cdi.errors import SpecError
from cdi.model import spec_from_dict
from cdi.schema import load_schema, schema_errors
from cdi.spec import load_document, read_spec
from cdi.validate import validate_spec
from tests.cdi.test_spec_cases import minimum_version

# Rule ids of specs/cases/expected.yaml that the schema cannot check (see its $comment).
UNEXPRESSIBLE_RULES: frozenset[str] = frozenset(
    {
        # Never reach a schema validator: the text does not parse into a document, or the
        # parsed document keeps only one value per key.
        "syntax.yaml",
        "syntax.json",
        "syntax.not-utf8",
        "syntax.duplicate-yaml-key",
        "syntax.duplicate-json-key",
        # Relations between values that JSON Schema has no keyword for.
        "device.name-duplicate",
        "net-device.duplicate-host-interface",
        "net-device.duplicate-name",
        "annotations.total-size",
    }
)

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
CASES = SPECS / "cases"
EXPECTED: dict[str, Any] = yaml.safe_load((CASES / "expected.yaml").read_text(encoding="utf-8"))
EXAMPLES = sorted(p.name for p in (SPECS / "examples").iterdir()
                  if p.suffix in (".yaml", ".json"))

CASE_IDS = [f"valid/{name}" for name in sorted(EXPECTED["valid"])] + [
    f"invalid/{name}" for name in sorted(EXPECTED["invalid"])
]


def _document(path: Path) -> Any:
    return load_document(path.read_bytes(), json_format=path.suffix == ".json")


def _paths(lines: list[str]) -> set[str]:
    return {line.split(": ", 1)[0] if ": " in line else "" for line in lines}


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_schema_ships_in_the_package_as_a_link_to_specs() -> None:
    packaged = ROOT / "cdi" / "schema" / "cdi-spec.schema.json"
    assert packaged.is_symlink()
    assert packaged.resolve() == (SPECS / "cdi-spec.schema.json").resolve()
    assert load_schema() == json.loads((SPECS / "cdi-spec.schema.json").read_text())


def test_schema_is_loaded_once_and_callers_get_copies() -> None:
    assert schema_module._validator() is schema_module._validator()
    copy = load_schema()
    copy["properties"].clear()
    assert load_schema()["properties"]


def test_every_object_in_the_schema_is_closed() -> None:
    schema = load_schema()
    objects = [schema] + [
        schema["$defs"][name] for name in
        ("device", "containerEdits", "deviceNode", "mount", "hook", "intelRdt", "netDevice")
    ]
    for item in objects:
        assert item["additionalProperties"] is False
        assert set(item.get("required", ())) <= set(item["properties"])


def test_unexpressible_rules_are_known_rules_and_documented() -> None:
    assert set(UNEXPRESSIBLE_RULES) <= set(EXPECTED["rules"])
    comment = load_schema()["$comment"]
    for words in ("duplicate keys", "device names unique", "hostInterfaceName", "256 KiB"):
        assert words in comment


@pytest.mark.parametrize("case", CASE_IDS)
def test_schema_agrees_with_the_code(case: str) -> None:
    kind, name = case.split("/")
    try:
        document = _document(CASES / kind / name)
    except SpecError:
        rule = EXPECTED["invalid"][name]["rule"]
        assert rule in UNEXPRESSIBLE_RULES
        pytest.skip(f"never parses into a document, so no schema can see it ({rule})")
    errors = schema_errors(document)
    if kind == "valid":
        assert errors == []
        return
    expected = EXPECTED["invalid"][name]
    if expected["rule"] in UNEXPRESSIBLE_RULES:
        # Keeps the list honest: a rule the schema can check does not belong there.
        assert errors == [], f"{expected['rule']} is checked by the schema after all"
        return
    assert errors, "the code rejects this spec but the schema accepts it"
    # Not the same words, but the same places.
    assert _paths(expected["errors"]) <= {error.path for error in errors}


def test_schema_errors_are_sorted_and_unique() -> None:
    document = _document(CASES / "invalid" / "wrong-type-strings.yaml")
    errors = schema_errors(document)
    assert errors == sorted(set(errors), key=lambda e: (e.path, e.message))
    assert len(errors) > 10


def test_schema_error_paths_use_the_code_format() -> None:
    document = {
        "cdiVersion": "0.6.0", "kind": "vendor.example/device", "annotations": {"a b": "x"},
        "devices": [
            {"name": "ok", "containerEdits": {"env": ["A=1"]}},
            {"name": "d", "containerEdits": {"deviceNodes": [{"path": "/x", "type": "q"}]},
             "extra": 1},
            {"containerEdits": {"env": ["A=1"]}},
        ],
    }
    lines = [str(error) for error in schema_errors(document)]
    assert "devices[1].extra: unknown field" in lines
    assert "devices[2].name: required field is missing" in lines
    assert any(line.startswith("devices[1].containerEdits.deviceNodes[0].type: ")
               for line in lines)
    assert any(line.startswith("annotations['a b']: invalid key: ") for line in lines)


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_pass_the_code_and_the_schema(name: str) -> None:
    path = SPECS / "examples" / name
    spec = read_spec(path)
    assert spec.data.cdi_version == minimum_version(spec.data)
    assert schema_errors(_document(path)) == []


def test_there_are_examples_in_both_formats() -> None:
    assert 3 <= len(EXAMPLES) <= 5
    assert {Path(name).suffix for name in EXAMPLES} == {".yaml", ".json"}


# A few hundred random mutations of the valid cases: the schema and the code must still
# agree, except for the rules the schema cannot express. Seeded, so failures reproduce.
_VALUES: list[Any] = [
    None, "", "a", "A=1", "/x", ".", "..", "/", "0", "0.3.0", "v1.1.0", "1.2.0", "c", "x",
    "rw", "none", "q", "prestart", "vendor.example/dev.x", "a b", "1abc", "example.com/k",
    "gpu\n", 0, 1, -1, 2**32, 2**63, 1.0, True, False, [], {}, ["a"], [1], {"a": "b"}, [{}],
]
_KEYS = [
    "env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids", "netDevices",
    "annotations", "hostPath", "type", "name", "closID", "schemata", "enableMonitoring",
    "enableCMT", "timeout", "extra",
]


def _containers(node: Any, found: list[Any]) -> list[Any]:
    if isinstance(node, (dict, list)) and node:
        found.append(node)
        for child in node.values() if isinstance(node, dict) else node:
            _containers(child, found)
    return found


def _mutate(document: Any, rng: random.Random) -> Any:
    for _ in range(rng.randint(1, 3)):
        containers = _containers(document, [])
        if not containers:
            break
        node = rng.choice(containers)
        value = copy.deepcopy(rng.choice(_VALUES))
        if isinstance(node, list):
            node[rng.randrange(len(node))] = value
        elif rng.random() < 0.3:
            node[rng.choice(_KEYS)] = value
        else:
            node[rng.choice(list(node))] = value
    return document


def test_schema_agrees_with_the_code_on_mutated_specs() -> None:
    rng = random.Random(20260821)
    documents = [_document(CASES / "valid" / name) for name in sorted(EXPECTED["valid"])]
    for _ in range(300):
        document = _mutate(copy.deepcopy(rng.choice(documents)), rng)
        try:
            validate_spec(spec_from_dict(document))
            problems: list[str] = []
        except SpecError as exc:
            problems = [error.message for error in exc.errors]
        unexpressible = problems and all(
            "duplicate" in p or "bytes in all" in p for p in problems
        )
        if not unexpressible:
            assert (not problems) == (not schema_errors(document)), (document, problems)
