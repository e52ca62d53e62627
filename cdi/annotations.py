"""The ``cdi.k8s.io/`` annotation convention (CDI spec, annotations section).

Kubernetes device plugins ask the runtime for CDI devices with annotations whose key is
``cdi.k8s.io/<plugin>_<device id>`` and whose value is a comma-separated list of
qualified device names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from cdi.errors import AnnotationError, QualifiedNameError
from cdi.parser import parse_qualified_name

ANNOTATION_PREFIX = "cdi.k8s.io/"
MAX_KEY_SUFFIX_LENGTH = 63
_KEY_SUFFIX_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")


def key_suffix_error(suffix: str) -> str | None:
    """Why the part after ``cdi.k8s.io/`` is not valid, or None."""
    if not suffix:
        return "the part after 'cdi.k8s.io/' is empty"
    if len(suffix) > MAX_KEY_SUFFIX_LENGTH:
        return f"the part after 'cdi.k8s.io/' is longer than {MAX_KEY_SUFFIX_LENGTH} characters"
    if not _KEY_SUFFIX_RE.fullmatch(suffix):
        return (
            "the part after 'cdi.k8s.io/' must start and end with a letter or digit and "
            "contain only letters, digits, '_', '.' and '-'"
        )
    return None


def annotation_key(plugin_name: str, device_id: str) -> str:
    """``cdi.k8s.io/<plugin>_<device id>``, with every '/' of the id replaced by '_'."""
    if not plugin_name:
        raise AnnotationError("invalid CDI annotation key: plugin name is empty")
    if not device_id:
        raise AnnotationError("invalid CDI annotation key: device id is empty")
    suffix = f"{plugin_name}_{device_id.replace('/', '_')}"
    key = ANNOTATION_PREFIX + suffix
    problem = key_suffix_error(suffix)
    if problem:
        raise AnnotationError(f"invalid CDI annotation key {key!r}: {problem}")
    return key


def annotation_value(devices: Iterable[str]) -> str:
    """The comma-joined value, every element checked to be a qualified name."""
    names = list(devices)
    if not names:
        raise AnnotationError("invalid CDI annotation value: no devices")
    return ",".join(_checked_names(names, "invalid CDI annotation value"))


def _checked_names(names: list[str], where: str) -> list[str]:
    for name in names:
        try:
            parse_qualified_name(name)
        except QualifiedNameError as exc:
            raise AnnotationError(f"{where}: {exc}") from None
    return names


def add_annotation(
    annotations: Mapping[str, str], plugin_name: str, device_id: str, devices: Iterable[str]
) -> dict[str, str]:
    """A copy of ``annotations`` with the request added; never overwrites a key."""
    key = annotation_key(plugin_name, device_id)
    if key in annotations:
        raise AnnotationError(f"CDI annotation {key!r} already set (value {annotations[key]!r})")
    return {**annotations, key: annotation_value(devices)}


def parse_annotation(key: str, value: str) -> list[str]:
    """The device names of one ``cdi.k8s.io/`` annotation; the error names the key."""
    problem = key_suffix_error(key[len(ANNOTATION_PREFIX) :])
    if problem:
        raise AnnotationError(f"annotation {key!r}: invalid key: {problem}")
    return _checked_names(value.split(","), f"annotation {key!r}")


def parse_annotations(annotations: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """Every ``cdi.k8s.io/`` key (sorted, so the result is stable) and the devices they ask
    for, in key order then value order. Other keys are ignored."""
    keys = sorted(k for k in annotations if k.startswith(ANNOTATION_PREFIX))
    devices: list[str] = []
    for key in keys:
        devices.extend(parse_annotation(key, annotations[key]))
    return keys, devices
