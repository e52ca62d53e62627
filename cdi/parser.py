"""Qualified device names ``vendor/class=name`` and their parts (CDI spec, names section).

Pure functions, no dependencies: every other module may import this one.
"""

import re

# vendor and class: a letter first, alphanumeric last, [A-Za-z0-9_.-] between.
_QUALIFIER_RE = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
# device name: alphanumeric at both ends, ':' allowed inside (MIG names such as 0:1).
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")

# Limits from the spec text (vendor is a DNS subdomain, class a DNS label); the Go
# library does not enforce them, we do, because a runtime keyed on DNS names may.
MAX_VENDOR_LENGTH = 253
MAX_CLASS_LENGTH = 63


def _kind_parts_error(vendor: str, class_: str) -> str | None:
    """Why ``vendor`` or ``class_`` is not valid, or None when both are."""
    return (_qualifier_error("vendor", vendor, MAX_VENDOR_LENGTH)
            or _qualifier_error("class", class_, MAX_CLASS_LENGTH))


def _qualifier_error(what: str, value: str, max_length: int) -> str | None:
    if not value:
        return f"{what} is empty"
    if len(value) > max_length:
        return f"{what} {value!r} is longer than {max_length} characters"
    if not value[0].isascii() or not value[0].isalpha():
        return f"{what} {value!r} must start with a letter"
    if not _QUALIFIER_RE.fullmatch(value):
        return (
            f"{what} {value!r} must end with a letter or digit and contain only "
            "letters, digits, '_', '.' and '-'"
        )
    return None


def device_name_error(name: str) -> str | None:
    """Why ``name`` is not a valid device name, or None when it is."""
    if not name:
        return "device name is empty"
    if not _NAME_RE.fullmatch(name):
        return (
            f"device name {name!r} must start and end with a letter or digit and contain "
            "only letters, digits, '_', '.', ':' and '-'"
        )
    return None


def parse_kind(kind: str) -> tuple[str, str]:
    """Split ``vendor/class`` at the first ``/``; ("", "") when it has no two parts."""
    vendor, sep, class_ = kind.partition("/")
    if not sep or not vendor or not class_:
        return "", ""
    return vendor, class_


def kind_error(kind: str) -> str | None:
    vendor, class_ = parse_kind(kind)
    if not vendor:
        return f"kind {kind!r} must have the form vendor/class"
    return _kind_parts_error(vendor, class_)


def split_device(device: str) -> tuple[str, str, str]:
    """Split a possibly qualified name; unqualified input comes back as ("", "", input).

    Anything empty or starting with '/' is a device path, not a CDI name.
    """
    kind, sep, name = device.partition("=")
    vendor, class_ = parse_kind(kind)  # no vendor for "" or a path: "/dev/x=y" is not a name
    if not sep or not name or not vendor:
        return "", "", device
    return vendor, class_, name


def qualified_name_error(device: str) -> str | None:
    """Why ``device`` is not a valid ``vendor/class=name``, or None when it is."""
    vendor, class_, name = split_device(device)
    problem = ("expected vendor/class=name" if not vendor
               else _kind_parts_error(vendor, class_) or device_name_error(name))
    return f"invalid CDI device name {device!r}: {problem}" if problem else None


def is_qualified_name(device: str) -> bool:
    return qualified_name_error(device) is None

