"""Qualified device names and the cdi.k8s.io/ annotation convention."""

from __future__ import annotations

import pytest

from cdi.annotations import parse_annotation
from cdi.errors import AnnotationError
from cdi.parser import is_qualified_name, qualified_name_error, split_device


@pytest.mark.parametrize(
    "text, expected",
    [
        ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
        ("nvidia.com/gpu=0:1", ("nvidia.com", "gpu", "0:1")),
        ("nvidia.com/gpu=GPU-3f6d6c2e-1a2b", ("nvidia.com", "gpu", "GPU-3f6d6c2e-1a2b")),
        ("vendor.example/class.sub=all", ("vendor.example", "class.sub", "all")),
        ("a/b=c=d", None),  # split at the first '=': the name 'c=d' is invalid
    ],
)
def test_qualified_name(text: str, expected: tuple[str, str, str] | None) -> None:
    if expected is None:
        assert qualified_name_error(text) is not None
    else:
        assert qualified_name_error(text) is None
        assert split_device(text) == expected


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "expected vendor/class=name"),
        ("/dev/nvidia0", "expected vendor/class=name"),
        ("gpu0", "expected vendor/class=name"),
        ("nvidia.com=0", "expected vendor/class=name"),
        ("nvidia.com/gpu=", "expected vendor/class=name"),
        ("/gpu=0", "expected vendor/class=name"),
        ("1nvidia.com/gpu=0", "vendor '1nvidia.com' must start with a letter"),
        ("nvidia.com-/gpu=0", "must end with a letter or digit"),
        ("nvidia.com/gpu!=0", "class 'gpu!' must end"),
        ("nvidia.com/9gpu=0", "class '9gpu' must start with a letter"),
        ("nvidia.com/gpu=-0", "device name '-0' must start and end"),
        ("nvidia.com/gpu=0:", "device name '0:' must start and end"),
        ("nvidia.com/gpu=a b", "device name 'a b'"),
        ("v" * 254 + "/gpu=0", "longer than 253 characters"),
        ("nvidia.com/" + "c" * 64 + "=0", "longer than 63 characters"),
    ],
)
def test_invalid_qualified_names_say_why(text: str, reason: str) -> None:
    problem = qualified_name_error(text)
    assert problem is not None and problem.startswith(f"invalid CDI device name {text!r}: ")
    assert reason in problem
    assert not is_qualified_name(text)


def test_split_device_leaves_unqualified_input_alone() -> None:
    assert split_device("/dev/nvidia0") == ("", "", "/dev/nvidia0")
    assert split_device("gpu0") == ("", "", "gpu0")
    assert split_device("a/b=c") == ("a", "b", "c")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("cdi.k8s.io/gpu", "nvidia.com/gpu=0, nvidia.com/gpu=1", "' nvidia.com/gpu=1'"),
        ("cdi.k8s.io/gpu", "", "invalid CDI device name ''"),
        ("cdi.k8s.io/gpu", "/dev/nvidia0", "'/dev/nvidia0'"),
        ("cdi.k8s.io/", "nvidia.com/gpu=0", "invalid key: the part after 'cdi.k8s.io/' is empty"),
        ("cdi.k8s.io/_x", "nvidia.com/gpu=0", "must start and end with a letter or digit"),
        ("cdi.k8s.io/" + "p" * 64, "nvidia.com/gpu=0", "longer than 63"),
    ],
)
def test_malformed_annotations_name_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_annotation(key, value)
    assert str(info.value).startswith(f"annotation {key!r}: ")
    assert message in str(info.value)
