"""The one YAML writer for CDI specs, and YAML 1.1 implicit typing of plain scalars.

``dump_yaml(document)`` writes a spec document (mappings, lists, strings, integers,
booleans) as PyYAML's ``safe_dump(sort_keys=False, default_flow_style=False,
allow_unicode=True)`` does, with a ``---`` start, byte for byte (tests/cdi/test_yaml11.py);
``cdi.spec.dump_spec`` and ``nri-cdi generate`` both use it. It stands instead of PyYAML's
C dumper so that the generator imports no PyYAML and builds no node per value
(bench/reports/2026-11-27-generator-stdlib-2-cores).

``implicit_tag(text)`` is the tag PyYAML gives ``text`` read back as a plain (unquoted)
scalar, i.e. ``yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))``;
the writer quotes a string exactly when this is not ``str``. The types are those of
https://yaml.org/type/ (PyYAML adds ``yaml`` for a bare ``!``, ``&`` or ``*``), read the
way PyYAML reads them where that differs from the type pages:

* bool is only yes/no/true/false/on/off in lower, Capitalised or UPPER case (no ``y``/``n``);
* int and float allow ``_`` anywhere after the first digit, sexagesimal ``1:20:30`` forms,
  and a float needs a ``.``: its exponent is optional but must carry a sign (``1.0e+5``
  is a float, ``1e5`` and ``1.0e5`` are strings);
* a sign may precede ``.inf`` but neither ``.nan`` nor a float starting with ``.``
  (``-.5`` is a string);
* like PyYAML's ``$``, a match may be followed by one final newline (``"yes\\n"`` is bool).

Each pattern below starts only with a character PyYAML registered for its type, and no
string matches two types, so one combined pattern answers as PyYAML's per-character lookup
does (the empty null, tried on ``""`` but not on ``"\\n"``, is handled apart).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_PREFIX = "tag:yaml.org,2002:"
STR = _PREFIX + "str"

# ASCII digits spelled out: ``\d`` would also accept other scripts' digits.
_SIGN = "[-+]?"
_DEC = "[0-9][0-9_]*"  # digits; PyYAML lets ``_`` follow the first one anywhere
_BASE60 = "(?::[0-5]?[0-9])"  # one ``:ss`` group of a sexagesimal number
_EXP = "(?:[eE][-+][0-9]+)"  # PyYAML requires the sign

_TYPES: dict[str, str] = {
    "bool": "yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
    "null": "~|null|Null|NULL",
    "int": (
        f"{_SIGN}(?:0b[01_]+|0x[0-9a-fA-F_]+|0[0-7_]*"  # binary, hex, octal (and 0)
        f"|[1-9][0-9_]*{_BASE60}*)"  # decimal, sexagesimal
    ),
    "float": (
        f"{_SIGN}(?:{_DEC}(?:\\.[0-9_]*{_EXP}?|{_BASE60}+\\.[0-9_]*)|\\.(?:inf|Inf|INF))"
        f"|\\.[0-9][0-9_]*{_EXP}?|\\.(?:nan|NaN|NAN)"
    ),
    # A bare date needs two-digit month and day; with a time either may have one digit.
    "timestamp": (
        "[0-9]{4}-(?:[0-9]{2}-[0-9]{2}"
        "|[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]*)?"
        "(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)"
    ),
    "merge": "<<",
    "value": "=",
    # Not a YAML type: PyYAML registers it "for documentation", and a plain scalar cannot
    # start with these indicators, but the resolver still answers it for the bare string.
    "yaml": "[!&*]",
}

_IMPLICIT = re.compile(
    "(?:{})\n?".format("|".join(f"(?P<{name}>{regex})" for name, regex in _TYPES.items())))


def implicit_tag(text: str) -> str:
    """The tag PyYAML's default resolver gives ``text`` as a plain scalar."""
    if not text:
        return _PREFIX + "null"
    match = _IMPLICIT.fullmatch(text)
    return STR if match is None else _PREFIX + str(match.lastgroup)


# --- writer --------------------------------------------------------------------------------
# A spec is only mappings, lists, strings and integers, so this writes PyYAML's block style
# directly: strings are left plain exactly when PyYAML's resolver would read them back as
# strings, single-quoted when they would read as another type (like PyYAML), and
# double-quoted (JSON escapes are valid YAML) when they hold characters that plain scalars
# cannot. Only in that last case may the bytes differ from PyYAML's (which picks between
# single and double quotes by its own rules); both read back as the same string.

_PLAIN = re.compile(r"[A-Za-z0-9_./+-][A-Za-z0-9_./:+=,@~-]*")
# Left raw by json.dumps(ensure_ascii=False) but not printable in YAML, or read as a line
# break inside a quoted scalar (NEL, LS, PS).  ensure_ascii=True is no answer: it writes
# astral characters as surrogate pairs, which YAML readers take as two lone surrogates.
# re.sub compiles it when a string first needs double quotes, which a generated spec
# rarely has.
_YAML_UNPRINTABLE = "[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]"


def dump_yaml(document: dict[str, Any]) -> str:
    """``document`` as a YAML stream of one document, starting with ``---``."""
    lines = ["---"]
    _emit_mapping(document, "", "", lines)
    return "\n".join(lines) + "\n"


# A spec repeats the same paths and names many times, most of all on nodes with many MIG
# devices (bench/reports/2026-11-27-generator-stdlib-2-cores).
@functools.lru_cache(maxsize=4096)
def _string(text: str) -> str:
    if not _PLAIN.fullmatch(text) or text.endswith(":") or text == "-":
        return _double_quoted(text)
    # PyYAML also quotes a string that starts like a document marker, wherever it stands.
    if implicit_tag(text) != STR or text.startswith(("---", "...")):
        return f"'{text}'"
    return text


def _double_quoted(text: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX for controls) are all valid YAML escapes.
    quoted = json.dumps(text, ensure_ascii=False)
    return re.sub(_YAML_UNPRINTABLE, _escape, quoted)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# Two mutually recursive walkers: one for mappings, one for lists.


def _emit_mapping(mapping: dict[str, Any], pad: str, lead: str, lines: list[str]) -> None:
    """Append ``mapping``'s entries indented by ``pad``; the first line starts with
    ``lead`` instead (``pad`` with ``- `` in it when the mapping is a list item)."""
    for key, item in mapping.items():
        prefix = f"{lead}{_string(key)}:"  # annotation keys are free text too
        lead = pad
        kind = type(item)
        if kind is dict and item:
            lines.append(prefix)
            _emit_mapping(item, pad + "  ", pad + "  ", lines)
        elif kind is list and item:
            lines.append(prefix)  # block lists sit at their key's indent, as PyYAML's do
            _emit_list(item, pad, pad, lines)
        else:
            lines.append(f"{prefix} {_leaf(item)}")


def _emit_list(items: list[Any], pad: str, lead: str, lines: list[str]) -> None:
    """Append ``items`` as a block list at indent ``pad``; the first line starts with
    ``lead`` instead (a list in a list starts on its parent's ``- `` line, as in PyYAML)."""
    for item in items:
        kind = type(item)
        if kind is dict and item:
            _emit_mapping(item, pad + "  ", lead + "- ", lines)
        elif kind is list and item:
            _emit_list(item, pad + "  ", lead + "- ", lines)
        else:
            lines.append(f"{lead}- {_leaf(item)}")
        lead = pad


def _leaf(item: Any) -> str:
    if type(item) is str:
        return _string(item)
    if type(item) is dict:
        return "{}"
    if type(item) is list:
        return "[]"
    if item is True or item is False:
        return "true" if item else "false"
    if type(item) is int:
        return str(item)
    return _string(str(item))
