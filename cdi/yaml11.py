"""YAML 1.1 implicit typing of plain scalars, as PyYAML's default resolver does it.

``implicit_tag(text)`` is the tag PyYAML gives ``text`` read back as a plain (unquoted)
scalar, i.e. ``yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))``.
The YAML emitter of ``cdi.nvidia.cli`` quotes a string exactly when this is not ``str``;
having it here keeps PyYAML (about 26 ms to import) off the generator's start-up path.

The types are those of https://yaml.org/type/ (bool, null, int, float, timestamp, merge,
value; PyYAML adds ``yaml`` for a bare ``!``, ``&`` or ``*``), read the way PyYAML reads
them where that differs from the type pages:

* bool is only yes/no/true/false/on/off in lower, Capitalised or UPPER case (no ``y``/``n``);
* int and float allow ``_`` anywhere after the first digit, sexagesimal ``1:20:30`` forms,
  and a float needs a ``.``: its exponent is optional but must carry a sign (``1.0e+5``
  is a float, ``1e5`` and ``1.0e5`` are strings);
* a sign may precede ``.inf`` but neither ``.nan`` nor a float starting with ``.``
  (``-.5`` is a string);
* like PyYAML's ``$``, a match may be followed by one final newline (``"yes\\n"`` is bool).

PyYAML first picks candidate types by the scalar's first character.  Every pattern below
can only start with a character PyYAML registered for its type, and no string matches two
types (so PyYAML's order does not matter either): one combined pattern gives the same
answer, except for the empty null, which PyYAML only tries on ``""`` (not on ``"\\n"``)
and which is handled apart.
"""

from __future__ import annotations

import re

__all__ = ["STR", "implicit_tag"]

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

_pattern: re.Pattern[str] | None = None


def _compiled() -> re.Pattern[str]:
    # Compiled on first use: start-up only pays for it when something is rendered.
    global _pattern
    if _pattern is None:
        body = "|".join(f"(?P<{name}>{regex})" for name, regex in _TYPES.items())
        _pattern = re.compile(f"(?:{body})\n?")
    return _pattern


def implicit_tag(text: str) -> str:
    """The tag PyYAML's default resolver gives ``text`` as a plain scalar."""
    if not text:
        return _PREFIX + "null"
    match = _compiled().fullmatch(text)
    return STR if match is None else _PREFIX + str(match.lastgroup)
