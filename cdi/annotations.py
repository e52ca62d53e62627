"""The ``cdi.k8s.io/`` annotation convention (CDI spec, annotations section).

Kubernetes device plugins ask the runtime for CDI devices with annotations whose key is
``cdi.k8s.io/<plugin>_<device id>`` and whose value is a comma-separated list of
qualified device names.
"""

from __future__ import annotations

import re

from cdi.errors import AnnotationError
from cdi.parser import qualified_name_error

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


def parse_annotation(key: str, value: str) -> list[str]:
    """The device names of one ``cdi.k8s.io/`` annotation; the error names the key."""
    problem = key_suffix_error(key[len(ANNOTATION_PREFIX) :])
    if problem:
        raise AnnotationError(f"annotation {key!r}: invalid key: {problem}")
    names = value.split(",")
    for name in names:
        problem = qualified_name_error(name)
        if problem:
            raise AnnotationError(f"annotation {key!r}: {problem}")
    return names
