"""Every spec case in specs/cases against its expectation in specs/cases/expected.yaml.

Valid cases must parse and need exactly the expected minimum version; invalid ones must
fail with exactly the expected error lines. The case set itself is checked for coverage:
enough files, both formats, every version, every rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi import spec as spec_module
from cdi.errors import SpecError
from cdi.model import SpecData
from cdi.spec import dump_spec, load_document, parse_spec
from cdi.version import EARLIEST_SUPPORTED, KNOWN_VERSIONS, minimum_requirement, version_key

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "specs" / "cases"
EXPECTED: dict[str, Any] = yaml.safe_load((CASES / "expected.yaml").read_text(encoding="utf-8"))
RULES: dict[str, str] = EXPECTED["rules"]
VALID: dict[str, dict[str, str]] = EXPECTED["valid"]
INVALID: dict[str, dict[str, Any]] = EXPECTED["invalid"]

# Messages of a third-party parser: exact only with the parser they were recorded with.
_LIBYAML = spec_module._strict_loader().__mro__[1] is getattr(yaml, "CSafeLoader", None)


def minimum_version(spec: SpecData) -> str:
    requirement = minimum_requirement(spec)
    return requirement.version if requirement else EARLIEST_SUPPORTED


def _files(kind: str) -> list[str]:
    return sorted(p.name for p in (CASES / kind).iterdir() if p.suffix in (".yaml", ".json"))


def _parse(kind: str, name: str) -> SpecData:
    # The name is the label that picks the format (.json or .yaml), as for files on disk.
    return parse_spec((CASES / kind / name).read_bytes(), name).data


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_case_parses_and_needs_its_minimum_version(name: str) -> None:
    data = _parse("valid", name)
    expected = VALID[name]["minimum"]
    assert minimum_version(data) == expected
    assert version_key(data.cdi_version) >= version_key(expected)


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("json_format", [False, True], ids=["yaml", "json"])
def test_valid_case_round_trips_through_dump(name: str, json_format: bool) -> None:
    data = _parse("valid", name)
    text = dump_spec(data, json_format=json_format)
    assert parse_spec(text, "again.json" if json_format else "again.yaml").data == data


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_case_fails_with_exactly_the_expected_errors(name: str) -> None:
    case = INVALID[name]
    with pytest.raises(SpecError) as caught:
        _parse("invalid", name)
    lines = [str(error) for error in caught.value.errors]
    if case["rule"] == "syntax.yaml" and not _LIBYAML:
        assert len(lines) == 1 and lines[0].startswith("invalid YAML: ")
        return
    assert lines == case["errors"]


def test_every_case_file_has_an_expectation_and_every_expectation_a_file() -> None:
    assert _files("valid") == sorted(VALID)
    assert _files("invalid") == sorted(INVALID)


def test_every_rule_is_targeted_and_every_target_is_a_known_rule() -> None:
    targeted = {case["rule"] for case in INVALID.values()}
    assert targeted <= set(RULES), targeted - set(RULES)
    assert set(RULES) <= targeted, set(RULES) - targeted


def test_rule_list_covers_each_kind_of_check() -> None:
    # One rule id per check of model.py (strictness), spec.py (syntax), version.py
    # (each minimum-version trigger) and validate.py; a new check needs a new id here.
    families = {rule.split(".")[0] for rule in RULES}
    assert families == {
        "syntax", "structure", "version", "kind", "annotations", "device", "env",
        "device-node", "mount", "hook", "intel-rdt", "net-device", "errors",
    }
    triggers = {rule for rule in RULES if rule.startswith("version.min-0") or
                rule.startswith("version.min-1")}
    assert len(triggers) == 11  # mount type, hostPath, digit name, 3 x 0.6.0, 2 x 0.7.0, 3 x 1.1.0


def test_case_set_is_large_and_uses_both_formats() -> None:
    names = [*VALID, *INVALID]
    assert len(names) >= 60
    json_count = sum(name.endswith(".json") for name in names)
    assert json_count >= len(names) // 4
    for group in (VALID, INVALID):
        assert {Path(name).suffix for name in group} == {".yaml", ".json"}


def _declared_versions(kind: str, names: list[str]) -> set[str]:
    found = set()
    for name in names:
        try:
            document = load_document((CASES / kind / name).read_bytes(),
                                     json_format=name.endswith(".json"))
        except SpecError:
            continue
        if isinstance(document, dict) and isinstance(document.get("cdiVersion"), str):
            found.add(document["cdiVersion"])
    return found


def test_cases_cover_every_version() -> None:
    valid = _declared_versions("valid", list(VALID))
    invalid = _declared_versions("invalid", list(INVALID))
    supported = set(KNOWN_VERSIONS) - {"0.1.0", "0.2.0"}
    assert {v.removeprefix("v") for v in valid} >= supported
    assert any(v.startswith("v") for v in valid)
    assert {"0.1.0", "0.2.0", "1.2.0"} <= invalid
    # Every version that some content can need is the computed minimum of a valid case.
    assert {case["minimum"] for case in VALID.values()} == supported - {"0.8.0", "1.0.0"}


# ------------------------------------------------------------------------------------
# Two bugs found while writing the cases, kept as regression tests.

_BASE = """\
cdiVersion: 0.6.0
kind: vendor.example/device
devices:
  - name: dev0
    containerEdits:
      env: [A=1]
"""


def test_yaml_merge_key_is_plain_yaml() -> None:
    text = _BASE + """\
  - name: dev1
    containerEdits:
      <<: {env: [B=2]}
"""
    assert [d.name for d in parse_spec(text).data.devices] == ["dev0", "dev1"]


def test_annotation_size_limit_counts_bytes() -> None:
    # 100,000 two-byte characters: 200,000 bytes, under the limit; 140,000: 280,000 bytes,
    # over the 262,144-byte limit although only 140,000 characters.
    text = _BASE + f"annotations:\n  k: {'é' * 140_000}\n"
    with pytest.raises(SpecError):
        parse_spec(text)


def test_dump_spec_writes_a_golden_spec_byte_for_byte() -> None:
    golden = Path(__file__).resolve().parents[2] / "specs" / "golden" / "one-gpu.yaml"
    text = golden.read_text()
    dumped = dump_spec(parse_spec(text).data)
    assert dumped.startswith("---\n")
    assert text.endswith(dumped.removeprefix("---\n"))  # after the generator's comments
