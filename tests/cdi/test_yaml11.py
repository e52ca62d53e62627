"""``cdi.yaml11``: ``implicit_tag`` gives exactly PyYAML's implicit tag for any string, and
``dump_yaml`` writes what PyYAML's C dumper writes."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi import yaml11
from cdi.yaml11 import STR, implicit_tag

ROOT = Path(__file__).resolve().parents[2]
_RESOLVER = yaml.resolver.Resolver()


def pyyaml_tag(text: str) -> str:
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))
    return tag


def assert_same(text: str) -> None:
    assert implicit_tag(text) == pyyaml_tag(text), repr(text)


# --- hand-written table ---------------------------------------------------------------------

BOOL_WORDS = ["yes", "no", "true", "false", "on", "off"]
NULL_WORDS = ["~", "null"]

TABLE = [
    # null, and what is not
    "", "~", "null", "Null", "NULL", "nULL", "nul", "nulls", "None", "none", "~~", " ~", "~ ",
    "Nil", "nil", "NUll",
    # bool near-misses (every spelling is added below, with case variants and suffixes)
    "y", "Y", "n", "N", "yES", "yeS", "YeS", "tRUE", "TRue", "fAlse", "oN", "oFF", "OfF",
    "Yes1", "NO_", "no.", "on_", "offf", "ye", "tru", "fals", "o", "of", "t", "f", "T", "F",
    # decimal int
    "0", "1", "-0", "+0", "-1", "+1", "12", "1_000", "1__", "1_", "_1", "+_1", "-", "+", "+-1",
    "--1", "1-", "1+", "01", "0_", "00", "007", "0_7", "08", "09", "0_8", "018",
    "\u0663", "\uff11", "1\u0663",  # non-ASCII digits: PyYAML only takes [0-9]
    "1 ", " 1", "1 0", "1,000", "12a",
    # binary, octal, hex
    "0b", "0b0", "0b1", "0b_", "0b2", "-0b1", "+0b1_0", "0B1", "b1", "0b1.0", "0x", "0x0",
    "0x_", "0xff", "0xFF", "0xfg", "-0x1F", "+0x_a", "0X1F", "x1", "0x1.0", "0o7", "0o",
    # sexagesimal
    "190:20:30", "1:2", "1:59", "1:60", "1:5:9", "0:1", "-1:30", "+1:30", "1:", ":1", "1::2",
    "1:2:", "1:123", "1_0:20", "1:2_0", "1:2:3:4:5", "190:20:30.15", "0:1.0", "1:60.0",
    "-190:20:30.15", "1:2.5e+3", "1:2.", "1:2.3.4",
    # float
    "1.", "1.0", ".5", "-.5", "+.5", "._5", ".5_", "._", ".", "..", "1..0", "1.0.0", "-1.5",
    "+1.5", "1_000.5", "1.0_0", "_1.0", "1e5", "1E5", "1e+5", "1.0e5", "1.0e+5", "1.0E-5",
    "1.e+5", ".5e+1", "-.5e+1", "1.0e+", "1.0e+5.0", "1.0e+_5", "1.0ee+5", "6.8523015e+5",
    "685.230_15e+03", "685_230.15", "-1.0e-1", "1.0 ", "1,5",
    # inf and nan
    ".inf", ".Inf", ".INF", ".iNf", "-.inf", "+.inf", "-.Inf", "+.INF", "inf", "-inf", "Infinity",
    ".infinity", ".nan", ".NaN", ".NAN", ".nAn", ".Nan", "-.nan", "+.NaN", "nan", "NaN", "..nan",
    # timestamps
    "2001-12-14", "2002-12-14", "0000-00-00", "9999-99-99", "2001-1-14", "2001-12-1",
    "2001-1-1", "01-12-14", "2001-12-14T", "2001-12-14t21:59:43.10-05:00",
    "2001-12-14T21:59:43.10Z", "2001-12-15T02:59:43.1Z", "2001-12-14 21:59:43.10 -5",
    "2001-12-14 21:59:43.10 +5:30", "2001-12-14\t21:59:43.10\t-5", "2001-12-14  21:59:43",
    "2001-1-1 1:00:00", "2001-1-1T1:00:00", "2001-12-14 21:59:43.", "2001-12-14 21:59:43.10",
    "2001-12-14 21:59", "2001-12-14 21:59:4", "2001-12-14 21:59:43 Z", "2001-12-14 21:59:43z",
    "2001-12-14 21:59:43+5:3", "2001-12-14 21:59:43+123", "2001-12-14 21:59:43 -", "2001-12-14 ",
    "2001-12-14x", "2001/12/14", "20011214", "2001-12-14 211:59:43", "2001-12-14 21:5:43",
    "2001-123-14 21:59:43", "2001-12-14T21:59:43.10-05:00:00",
    # merge and value
    "<<", "<", "<<<", "< <", "=", "==", "= ", "=1", "a=b",
    # the indicators PyYAML tags ``yaml``
    "!", "&", "*", "!\n", "!!", "&a", "*a", "!!str", "&*", " *",
    # whitespace, newlines, other text
    " ", "\t", "\n", "\n\n", "\r", "yes\n", "yes\n\n", "yes\r", "1\n", "\n1", "1.5\n", "~\n",
    "null\n", "<<\n", "=\n", "2001-12-14\n", "yes no", "a b", "a\nb", "/usr/lib", "nvidia.com/gpu",
    "--link", "a: b", "x #y", "foo:", "'q'", '"', "é", "🙂", "\x00", "0\x00",
]


def bool_variants() -> list[str]:
    out = []
    for word in BOOL_WORDS + NULL_WORDS:
        for form in {word, word.capitalize(), word.upper(), word.swapcase()}:
            out += [form, form + "1", form + "_", form + ".", "-" + form, form + " ", form[:-1]]
    return out


@pytest.mark.parametrize("text", TABLE + bool_variants())
def test_table_matches_pyyaml(text: str) -> None:
    assert_same(text)


# Readings the module documents; pinned so that the docstring stays true.
@pytest.mark.parametrize(
    ("text", "tag"),
    [("1e5", "str"), ("1.0e5", "str"), ("1.0e+5", "float"), ("-.5", "str"), ("-.inf", "float"),
     ("-.nan", "str"), ("y", "str"), ("yes\n", "bool"), ("\n", "str"), ("", "null"),
     ("190:20:30", "int"), ("0:1", "str"), ("2001-1-1", "str"), ("2001-1-1 1:00:00", "timestamp"),
     ("*", "yaml")],
)
def test_documented_readings(text: str, tag: str) -> None:
    assert implicit_tag(text) == pyyaml_tag(text) == f"tag:yaml.org,2002:{tag}"


# --- properties -----------------------------------------------------------------------------

RICH = "0123456789._:+-eExbotTZynalsrufON~=<!&* \t\n"
# Other text, drawn from the same sampled alphabet: one_of(characters()) is several times
# slower to draw, and general text has a test of its own below.
OTHER = "aAzYiIfF/#%@,'\"\\[]{}|?>`\r\x00\x85\u2028é\u0661\uff11🙂"
# Pieces that line up into numbers, timestamps and keywords far more often than characters do.
PIECES = [*RICH, "0x", "0b", "e+", "e-", "inf", "Inf", "nan", "NaN", "yes", "No", "TRUE", "off",
          "null", "<<", "2001", "12", "14", "59", ":59", "-05:00", "1_0", "ff", "Z", "T", " -5"]
SEEDS = ["2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
         "2001-1-1 1:00:00Z", "190:20:30", "190:20:30.15", "-1_000.5e+3", "0b1010", "0x_ff",
         "0777", ".inf", "-.Inf", ".NaN", "yes", "No", "OFF", "null", "~", "<<", "=", "1.", ".5",
         "+12", "1:2.5"]

rich_text = st.text(st.sampled_from(RICH + OTHER), max_size=24)
pieces = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@examples(3000)
@given(rich_text)
def test_rich_text_matches_pyyaml(text: str) -> None:
    assert_same(text)


@examples(1000)
@given(st.text(max_size=16))
def test_any_text_matches_pyyaml(text: str) -> None:
    assert_same(text)


@examples(3000)
@given(pieces)
def test_pieces_match_pyyaml(text: str) -> None:
    assert_same(text)


@st.composite
def mutated_seeds(draw: st.DrawFn) -> str:
    """A valid typed scalar with a few characters inserted, deleted or replaced."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        new = draw(st.sampled_from(RICH) | st.just(""))  # "" deletes when it replaces
        replaced = draw(st.integers(0, 1))  # characters the new one replaces: 0 inserts
        text = text[:at] + new + text[at + replaced:]
    return text


@examples(2000)
@given(mutated_seeds())
def test_mutated_seeds_match_pyyaml(text: str) -> None:
    assert_same(text)


@examples(1000)
@given(st.datetimes(), st.sampled_from(["T", "t", " ", "\t", "  "]),
       st.sampled_from(["", "Z", " Z", "-5", " +05:30", "\t-12:00", "+1"]), st.booleans())
def test_timestamps_match_pyyaml(when: datetime, sep: str, zone: str, short: bool) -> None:
    stamp = str(when).replace(" ", sep) + zone
    if short:  # one-digit month, day and hour are allowed only with a time
        stamp = stamp.replace("-0", "-").replace(sep + "0", sep)
    assert_same(stamp)
    assert_same(stamp.split(sep)[0])


# --- the emitter ----------------------------------------------------------------------------


def old_string(text: str) -> str | None:
    """``yaml11._string`` as it was when it asked PyYAML, for strings it left plain or
    single-quoted (those bytes must not change); None for double-quoted ones, whose
    escapes changed on purpose (astral and non-printable characters). Since the writer
    became the only one, it also quotes document markers (``---``, ``...``) as PyYAML's
    emitter does."""
    if not yaml11._PLAIN.fullmatch(text) or text.endswith(":") or text == "-":
        return None
    if pyyaml_tag(text) == STR and not text.startswith(("---", "...")):
        return text
    return f"'{text}'"


@examples(2000)
@given(rich_text | pieces)
def test_emitter_quoting_unchanged(text: str) -> None:
    expected = old_string(text)
    if expected is None:  # double-quoted: it must read back as the same string
        assert yaml11._string(text).startswith('"')
        assert yaml.safe_load(f"k: {yaml11._string(text)}") == {"k": text}
    else:
        assert yaml11._string(text) == expected


def test_rendering_never_imports_yaml() -> None:
    code = ("import cdi.yaml11, sys; "
            "cdi.yaml11.dump_yaml({'a': ['1', 'yes', 'x', '', '2001-12-14', '.inf']}); "
            "assert 'yaml' not in sys.modules, 'yaml imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- the writer against PyYAML's C dumper -------------------------------------------------------

_KEYS = st.text(st.sampled_from("abcxyzAZ09_-./"), min_size=1, max_size=6) | rich_text | pieces
_WORDS = st.one_of(rich_text, pieces, st.sampled_from(["yes", "1:20", "~", "0x1F", "a b", "x: y"]))
_LEAVES = st.one_of(_WORDS, st.integers(-(2**40), 2**40), st.booleans())
_DOCUMENTS = st.dictionaries(_KEYS, st.recursive(
    _LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20), max_size=5)


def pyyaml_dump(document: dict[str, object]) -> str:
    """What ``cdi.spec.dump_spec`` wrote when it called PyYAML's C dumper."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return "---\n" + yaml.dump(document, Dumper=dumper, sort_keys=False,
                               default_flow_style=False, allow_unicode=True, width=1 << 16)


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [*node, *(s for v in node.values() for s in _strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


@examples(500)
@given(_DOCUMENTS.filter(bool))
def test_writer_is_byte_identical_to_pyyaml_unless_it_double_quotes(doc: dict) -> None:
    ours = yaml11.dump_yaml(doc)
    assert yaml.safe_load(ours) == doc
    if not any(yaml11._string(s).startswith('"') for s in _strings(doc)):
        assert ours == pyyaml_dump(doc)


def test_dump_spec_uses_the_one_writer() -> None:
    from cdi.model import to_dict
    from cdi.spec import dump_spec, parse_spec

    text = (ROOT / "specs" / "golden" / "one-gpu.yaml").read_text()
    spec = parse_spec(text).data
    assert dump_spec(spec) == yaml11.dump_yaml(to_dict(spec)) == pyyaml_dump(to_dict(spec))
    assert text.endswith(dump_spec(spec).removeprefix("---\n"))  # the golden's own bytes
