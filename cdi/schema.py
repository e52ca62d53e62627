"""Our JSON Schema for CDI specs (``specs/cdi-spec.schema.json``) and a validator for it.

The schema is a second, declarative statement of the rules in ``model.py``,
``validate.py`` and ``version.py``, written by us from the spec text; the tests check that
it agrees with the code on every spec in ``specs/cases``. It ships inside the package as
``cdi/schema/cdi-spec.schema.json``, a link to the file in ``specs/``.

``schema_errors`` runs the draft 2020-12 validator of the ``jsonschema`` package with two
adjustments that make Python agree with the schema's intent:

* ``pattern`` is matched with ECMA-262 semantics for a final ``$`` (the end of the text;
  Python's ``$`` also matches before a trailing newline, so ``"gpu\\n"`` would pass);
* ``integer`` means an int, not a float with no fraction (the code rejects ``1.0``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cdi.errors import FieldError
from cdi.extras import MissingDependencyError

try:
    from jsonschema import Draft202012Validator, ValidationError, validators
except ImportError as exc:
    raise MissingDependencyError("jsonschema", "checking specs against the JSON schema") from exc
from cdi.model import key_path

SCHEMA_PATH = Path(__file__).with_name("schema") / "cdi-spec.schema.json"

def load_schema() -> dict[str, Any]:
    """The schema document (read afresh: callers may change it)."""
    document: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return document


def _compile(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compile(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _is_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@functools.cache
def _validator() -> Any:
    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    return _Validator(schema)


def schema_errors(document: Any) -> list[FieldError]:
    """Every way ``document`` (parsed JSON/YAML) breaks the schema, with field paths like
    the code's (``devices[2].containerEdits.deviceNodes[0].type``); sorted, no repeats."""
    found: set[FieldError] = set()
    for error in _validator().iter_errors(document):
        found.update(_field_errors(error, document))
    return sorted(found, key=lambda e: (e.path, e.message))


def _field_errors(error: ValidationError, document: Any) -> Iterator[FieldError]:
    path = _render_path(document, list(error.absolute_path))
    instance: Any = error.instance
    value: Any = error.validator_value
    schema: Any = error.schema
    if error.validator == "required":
        present = instance if isinstance(instance, dict) else {}
        for key in value:
            if key not in present:
                yield FieldError(_join(path, key, in_map=False), "required field is missing")
        return
    if error.validator == "additionalProperties" and value is False:
        known = schema.get("properties", {})
        for key in instance:
            if key not in known:
                yield FieldError(key_path(path, key), "unknown field")
        return
    schema_path = list(error.relative_schema_path)
    if len(schema_path) >= 2 and schema_path[-2] == "propertyNames":
        # About one key of a mapping: name it as the code does, annotations['key'].
        where = _join(path, instance, in_map=True) if isinstance(instance, str) else path
        yield FieldError(where, f"invalid key: {error.message}")
        return
    message = error.message
    # A "$comment" on a subschema says in words what the failed keyword means; the root's
    # "$comment" is documentation.
    comment = schema.get("$comment") if isinstance(schema, Mapping) else None
    if isinstance(comment, str) and schema is not _validator().schema:
        message = f"{message} ({comment})"
    yield FieldError(path, message)


def _render_path(document: Any, parts: list[Any]) -> str:
    """Walk the document so that list indexes and mapping keys (even int keys) render
    as the code renders them; keys of an ``annotations`` map render as ``['key']``."""
    path = ""
    node = document
    in_map = False
    for part in parts:
        if isinstance(node, list) and isinstance(part, int):
            path = f"{path}[{part}]"
        else:
            path = _join(path, part, in_map=in_map)
        in_map = part == "annotations" and not in_map
        try:
            node = node[part]
        except (LookupError, TypeError):
            node = None
    return path


def _join(path: str, key: Any, *, in_map: bool) -> str:
    if in_map:
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else str(key)
