"""One CDI spec file: strict parsing (pure), reading, deterministic dumping, atomic writing."""

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from cdi.errors import FieldError, SpecError
from cdi.model import DeviceData, SpecData, spec_from_dict, to_dict
from cdi.parser import parse_kind
from cdi.validate import validate_spec

# A real spec for 8 GPUs x 7 MIG devices is well under 1 MiB; refuse to slurp anything
# absurd that happens to sit in a spec directory.
MAX_SPEC_BYTES = 32 * 1024 * 1024


@functools.cache
def _strict_loader() -> Any:
    """A safe YAML loader (libyaml's when present) that rejects duplicate mapping keys, as
    the reference's strict decoder does: a silently shadowed key is a bug in the spec.

    Built on first use: PyYAML is imported only by what reads or writes YAML, not by
    ``nri-cdi generate`` (its own emitter) or the hooks.
    """
    import yaml

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def construct_strict_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
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

    loader: Any = type("StrictLoader", (base,), {})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_strict_mapping)
    return loader


def _reject_duplicate_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def load_document(data: bytes | str, *, json_format: bool) -> Any:
    """Parse JSON or YAML strictly into plain data; raise SpecError on bad syntax."""
    import yaml

    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([FieldError("", f"spec is larger than {MAX_SPEC_BYTES} bytes")])
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if json_format:
            return json.loads(text, object_pairs_hook=_reject_duplicate_pairs)
        return yaml.load(text, Loader=_strict_loader())
    except UnicodeDecodeError as exc:
        raise SpecError([FieldError("", f"not UTF-8 text: {exc}")]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([FieldError("", f"invalid JSON: {exc}")]) from None
    except ValueError as exc:  # duplicate JSON key
        raise SpecError([FieldError("", f"invalid JSON: {exc}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([FieldError("", f"invalid YAML: {_one_line(str(exc))}")]) from None
    except RecursionError:
        raise SpecError([FieldError("", "spec nests too deeply")]) from None


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def parse_spec_data(data: bytes | str, *, json_format: bool = False) -> SpecData:
    """Bytes to a validated SpecData; SpecError lists every problem. Pure."""
    document = load_document(data, json_format=json_format)
    spec = spec_from_dict(document)
    validate_spec(spec)
    return spec


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
    def vendor(self) -> str:
        return parse_kind(self.data.kind)[0]

    @property
    def class_(self) -> str:
        return parse_kind(self.data.kind)[1]

    @property
    def devices(self) -> tuple[DeviceData, ...]:
        return self.data.devices


def parse_spec(data: bytes | str, path: str = "", priority: int = 0) -> Spec:
    """Parse a spec document; errors name ``path``. Pure: the path is only a label."""
    try:
        spec_data = parse_spec_data(data, json_format=is_json_path(path))
    except SpecError as exc:
        raise exc.with_file(path) if path else exc from None
    return Spec(data=spec_data, path=path, priority=priority)


def read_spec(path: str | os.PathLike[str], priority: int = 0) -> Spec:
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([FieldError("", f"cannot read: {exc.strerror}")], file=name) from None
    return parse_spec(data, name, priority)


def dump_spec(spec: SpecData, *, json_format: bool = False) -> str:
    """Deterministic text of a spec: fields in spec order, empty fields left out."""
    document = to_dict(spec)
    if json_format:
        return json.dumps(document, indent=2) + "\n"
    from cdi.yaml11 import dump_yaml

    return dump_yaml(document)


def write_spec(spec: SpecData, path: str | os.PathLike[str], *, mode: int = 0o644) -> None:
    """Validate, then write atomically: a temporary file in the same folder, fsync, rename.

    A failure at any point leaves the previous file untouched and no temporary behind.
    """
    validate_spec(spec)
    target = Path(path)
    text = dump_spec(spec, json_format=is_json_path(target))
    atomic_write(target, text.encode("utf-8"), mode=mode)


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
    _fsync_dir(target.parent)


def _create_temporary(folder: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp`` (a new 0600 file, never an existing one or a link) without
    importing tempfile, which brings shutil, random and the compression modules: a
    ``generate`` process writes one spec, and those imports cost more than the writing."""
    for _ in range(100):
        name = os.path.join(folder, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
