"""One CDI spec file: strict parsing (pure), reading, deterministic dumping, atomic writing."""

import contextlib
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from cdi.errors import FieldError, SpecError
from cdi.model import BadScalar, DeviceData, SpecData, key_path, spec_from_dict, to_dict
from cdi.validate import validate_spec

# A real spec for 8 GPUs x 7 MIG devices is well under 1 MiB; refuse to slurp anything
# absurd that happens to sit in a spec directory.
MAX_SPEC_BYTES = 32 * 1024 * 1024


# Deeper than any spec can be (a valid one nests 7 levels): past it the document is
# refused before a recursive parser (libyaml's composer, the json module) sees it.
MAX_NESTING = 512

_YAML = "tag:yaml.org,2002:"
# YAML 1.1 numbers without the sexagesimal forms (``1:30``), which the reference's YAML
# library reads as strings; the rest as PyYAML's resolver has them.
_INT = r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"""
_FLOAT = (
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"""
    r"""|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"""
)
_NULL_TEXTS = ("", "~", "null", "Null", "NULL")


def _yaml() -> Any:
    """PyYAML, imported on first use: the hooks and the plugin's start never read YAML."""
    import yaml

    return yaml


def dump_yaml(document: dict[str, Any]) -> str:
    """``document`` as a YAML stream of one document, starting with ``---``: PyYAML's
    dumper (libyaml's when present) in block style, keys in the document's order, no line
    folding. The one YAML writer of specs (``dump_spec`` and ``nri-cdi generate``)."""
    yaml = _yaml()
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return "---\n" + str(yaml.dump(document, Dumper=dumper, sort_keys=False,
                                    default_flow_style=False, allow_unicode=True,
                                    width=1 << 16))


def _bad(tag: str, node: Any, why: str) -> BadScalar:
    short = tag.replace(_YAML, "!!")
    text = node.value if isinstance(node.value, str) else f"<{node.id}>"
    return BadScalar(short, text, why)


def _checked(tag: str, kind: Any, build: Any) -> Any:
    """The base constructor for ``tag``, turned into a BadScalar on any failure."""

    def construct(loader: Any, node: Any) -> Any:
        if not isinstance(node, kind):
            return _bad(tag, node, f"not a {kind.id}")
        try:
            return build(loader, node)
        except Exception:  # the base constructors raise KeyError, ValueError, ...
            return _bad(tag, node, f"not a valid {tag.replace(_YAML, '!!')}")

    return construct


def _strict_mapping(yaml: Any) -> Any:
    """The mapping constructor: PyYAML's, with duplicate keys an error."""

    def construct_strict_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        if not isinstance(node, yaml.MappingNode):
            return _bad(node.tag, node, "not a mapping")
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _YAML + "merge":
                continue  # '<<' merge keys are expanded by the base constructor
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # reported later as a non-string key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    return construct_strict_mapping


@functools.cache
def _strict_loader() -> Any:
    """A safe YAML loader (libyaml's when present) for specs.

    * duplicate mapping keys are errors, as in the reference's strict decoder;
    * plain scalars resolve as YAML 1.1 without sexagesimal numbers and without implicit
      timestamps (both stay strings, as the reference reads them);
    * an explicit tag never raises from inside the loader: a value its tag cannot make
      sense of, or an unknown tag, becomes a ``BadScalar`` that every field decoder
      refuses, so the error names the field.

    Built on first use, as PyYAML is imported on first use (``_yaml``).
    """
    yaml = _yaml()
    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def construct_null(loader: Any, node: Any) -> Any:
        if node.value not in _NULL_TEXTS:
            return _bad(node.tag, node, "not a null")
        return None

    def construct_timestamp(loader: Any, node: Any) -> Any:
        # The reference keeps a timestamp as the text written; an invalid one is refused.
        base.construct_yaml_timestamp(loader, node)
        return node.value

    def construct_unknown(loader: Any, node: Any) -> Any:
        return _bad(node.tag, node, "unknown tag")

    # (The bare tag '!' is found by ``_yaml_event_error`` before loading: libyaml resolves
    # it like an untagged node, so no constructor ever sees it.)
    class StrictLoader(base):  # type: ignore[misc,valid-type,unused-ignore]
        yaml_implicit_resolvers: dict[str, list[tuple[str, Any]]] = {}
        yaml_constructors: dict[Any, Any] = dict(base.yaml_constructors)

    patterns = {_YAML + "int": re.compile(_INT, re.X), _YAML + "float": re.compile(_FLOAT, re.X)}
    for first, resolvers in base.yaml_implicit_resolvers.items():
        StrictLoader.yaml_implicit_resolvers[first] = [
            (t, patterns.get(t, r)) for t, r in resolvers if t != _YAML + "timestamp"
        ]
    scalar, seq, mapping = yaml.ScalarNode, yaml.SequenceNode, yaml.MappingNode
    def construct_str(loader: Any, node: Any) -> Any:
        # The hot path (every string of a spec): no wrapper around it.
        if node.__class__ is scalar:
            return node.value
        return _bad(_YAML + "str", node, f"not a {scalar.id}")

    for name, kind in (
        ("bool", scalar), ("int", scalar), ("float", scalar), ("binary", scalar),
        ("seq", seq), ("set", mapping), ("omap", seq), ("pairs", seq),
    ):
        tag = _YAML + name
        StrictLoader.add_constructor(tag, _checked(tag, kind, base.yaml_constructors[tag]))
    StrictLoader.add_constructor(_YAML + "null", _checked(_YAML + "null", scalar, construct_null))
    StrictLoader.add_constructor(
        _YAML + "timestamp", _checked(_YAML + "timestamp", scalar, construct_timestamp)
    )
    StrictLoader.add_constructor(_YAML + "str", construct_str)
    StrictLoader.add_constructor(_YAML + "map", _strict_mapping(yaml))
    StrictLoader.add_constructor(None, construct_unknown)
    return StrictLoader


def _reject_duplicate_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


_LINE_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def nesting_error(text: str, *, json_format: bool) -> str | None:
    """Why ``text`` nests too deeply to be handed to a recursive parser; None if fine.

    Cheap bound first: JSON cannot nest deeper than its brackets; in YAML a block
    collection nested in another starts further right (an indentless sequence at most
    once in a row), so block depth is at most twice the longest line, plus the flow
    brackets. Only a text past the bound is scanned, without recursion.
    """
    openers = text.count("[") + text.count("{")
    bound = openers
    if not json_format and bound <= MAX_NESTING:
        bound += 2 * (_longest_line(text) + 1)
    if bound <= MAX_NESTING:
        return None
    depth = _json_depth(text) if json_format else _yaml_depth(text)
    if depth > MAX_NESTING:
        return f"spec nests deeper than {MAX_NESTING} levels"
    return None


def _longest_line(text: str) -> int:
    # Not str.splitlines, which also splits at \v, \f and \x1c-\x1e, as YAML does not.
    return max(map(len, _LINE_BREAKS.split(text)), default=0)


def _deepest(steps: Iterator[int]) -> int:
    """The deepest level reached by ``steps`` (+1 opens, -1 closes), counted up to just
    past MAX_NESTING."""
    depth = deepest = 0
    for step in steps:
        depth = max(depth + step, 0)
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
    return deepest


def _json_depth(text: str) -> int:
    tokens = (match.group() for match in _JSON_TOKENS.finditer(text))
    return _deepest(1 if token in "[{" else -1 if token in "]}" else 0 for token in tokens)


def _yaml_depth(text: str) -> int:
    yaml = _yaml()
    # libyaml's parser keeps its state on a heap stack: walking its events is safe at any
    # depth (its composer, which builds nodes, is the part that recurses).
    starts = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
    ends = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
    events = yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return _deepest(1 if isinstance(event, starts) else -1 if isinstance(event, ends) else 0
                    for event in events)


# A '!' that can only be the bare non-specific tag: after a separator, before one.
_BARE_TAG_TEXT = re.compile(r"(?:^|(?<=[\s\[{,]))!(?=[\s\]},]|$)", re.M)


def _yaml_event_error(text: str) -> FieldError | None:
    """What the reference refuses that PyYAML's loader lets through: a ``%YAML``
    directive for a version other than 1.1 (PyYAML only warns) and the bare tag ``!``
    on a scalar (libyaml resolves it like an untagged one). Events are walked only when
    the text could hold either."""
    if "%YAML" not in text and ("!" not in text or not _BARE_TAG_TEXT.search(text)):
        return None
    yaml = _yaml()

    for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(event, yaml.DocumentStartEvent):
            version = event.version
            if version is not None and tuple(version) != (1, 1):
                return FieldError("", f"YAML version {'.'.join(map(str, version))} is not "
                                  "supported (only 1.1)")
        if getattr(event, "tag", None) == "!":
            mark = event.start_mark
            return FieldError(_path_at(text, mark), "the non-specific tag '!' is not supported "
                              f"(line {mark.line + 1}, column {mark.column + 1})")
    return None


def _path_at(text: str, mark: Any) -> str:
    """The field path (as the decoder names it: ``devices[0].containerEdits.env[1]``) of
    the node that starts at ``mark``; a mapping key is named by its mapping's path."""
    yaml = _yaml()
    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return ""
    seen: set[int] = set()  # an alias repeats a node: walk it once

    def walk(node: Any, path: str) -> str | None:
        if (node.start_mark.line, node.start_mark.column) == (mark.line, mark.column):
            return path
        if isinstance(node, yaml.ScalarNode) or id(node) in seen:
            return None
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            children = [(item, f"{path}[{index}]") for index, item in enumerate(node.value)]
        else:
            children = []
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "<key>"
                children += [(key, path), (value, key_path(path, name))]
        for child, child_path in children:
            found = walk(child, child_path)
            if found is not None:
                return found
        return None

    return walk(root, "") or ""


def load_document(data: bytes | str, *, json_format: bool) -> Any:
    """Parse JSON or YAML strictly into plain data; raise SpecError on bad syntax."""
    yaml = _yaml()
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([FieldError("", f"spec is larger than {MAX_SPEC_BYTES} bytes")])
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        problem = nesting_error(text, json_format=json_format)
        if problem:
            raise SpecError([FieldError("", problem)])
        event_error = None if json_format else _yaml_event_error(text)
        if event_error:
            raise SpecError([event_error])
        if json_format:
            return json.loads(text, object_pairs_hook=_reject_duplicate_pairs)
        return yaml.load(text, Loader=_strict_loader())
    except UnicodeDecodeError as exc:
        raise SpecError([FieldError("", f"not UTF-8 text: {exc}")]) from None
    except ValueError as exc:  # JSONDecodeError, or a duplicate JSON key
        raise SpecError([FieldError("", f"invalid JSON: {exc}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([FieldError("", f"invalid YAML: {_one_line(str(exc))}")]) from None
    except RecursionError:
        raise SpecError([FieldError("", "spec nests too deeply")]) from None


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def is_json_path(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(".json")


class Spec(NamedTuple):
    """A valid spec with where it came from. Exists only if valid."""

    data: SpecData
    path: str = ""
    priority: int = 0

    @property
    def kind(self) -> str:
        return self.data.kind

    @property
    def devices(self) -> tuple[DeviceData, ...]:
        return self.data.devices


def parse_spec(data: bytes | str, path: str = "", priority: int = 0) -> Spec:
    """Parse and validate a spec document (JSON when ``path`` ends in ``.json``, else YAML);
    SpecError lists every problem, naming ``path``. Pure: the path is only a label."""
    try:
        spec_data = spec_from_dict(load_document(data, json_format=is_json_path(path)))
        validate_spec(spec_data)
    except SpecError as exc:
        raise SpecError(exc.errors, file=path) if path else exc from None
    return Spec(data=spec_data, path=path, priority=priority)


def read_spec(path: str | os.PathLike[str]) -> Spec:
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([FieldError("", f"cannot read: {exc.strerror}")], file=name) from None
    return parse_spec(data, name)


def dump_spec(spec: SpecData, *, json_format: bool = False) -> str:
    """Deterministic text of a spec: fields in spec order, empty fields left out."""
    document = to_dict(spec)
    if json_format:
        return json.dumps(document, indent=2) + "\n"
    return dump_yaml(document)


def atomic_write(target: Path, data: bytes, *, mode: int = 0o644) -> None:
    # The temporary name ends in .tmp so that spec-directory watchers ignore it.
    fd, tmp = _create_temporary(target.parent, f".{target.name}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)


def _create_temporary(folder: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp`` (a new 0600 file, never an existing one or a link) without
    importing tempfile, which brings shutil, random and the compression modules, all for
    the one spec a ``nri-cdi generate`` process writes
    (bench/reports/2026-11-27-generator-stdlib-2-cores)."""
    for _ in range(100):
        name = os.path.join(folder, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")
