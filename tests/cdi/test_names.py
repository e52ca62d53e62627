"""Qualified device names and the cdi.k8s.io/ annotation convention."""

from __future__ import annotations

import re

import pytest

from cdi.annotations import (
    add_annotation,
    annotation_key,
    annotation_value,
    parse_annotation,
    parse_annotations,
)
from cdi.errors import AnnotationError, QualifiedNameError
from cdi.parser import (
    QualifiedName,
    is_qualified_name,
    parse_qualified_name,
    qualified_name,
    split_device,
)


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
def test_parse_qualified_name(text: str, expected: tuple[str, str, str] | None) -> None:
    if expected is None:
        with pytest.raises(QualifiedNameError):
            parse_qualified_name(text)
    else:
        assert parse_qualified_name(text) == QualifiedName(*expected)
        assert str(parse_qualified_name(text)) == text


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
    with pytest.raises(QualifiedNameError, match="invalid CDI device name") as info:
        parse_qualified_name(text)
    assert reason in str(info.value)
    assert not is_qualified_name(text)


def test_split_device_leaves_unqualified_input_alone() -> None:
    assert split_device("/dev/nvidia0") == ("", "", "/dev/nvidia0")
    assert split_device("gpu0") == ("", "", "gpu0")
    assert split_device("a/b=c") == ("a", "b", "c")


def test_build_qualified_name_validates() -> None:
    assert qualified_name("nvidia.com", "gpu", "0") == "nvidia.com/gpu=0"
    with pytest.raises(QualifiedNameError):
        qualified_name("nvidia.com", "gpu", "")


def test_annotation_key_replaces_slashes_and_checks_rules() -> None:
    assert annotation_key("nvidia.gpu", "pod/ctr/0") == "cdi.k8s.io/nvidia.gpu_pod_ctr_0"
    with pytest.raises(AnnotationError, match="longer than 63"):
        annotation_key("p" * 40, "d" * 30)
    with pytest.raises(AnnotationError, match="start and end with a letter or digit"):
        annotation_key("-bad", "0")
    with pytest.raises(AnnotationError, match="plugin name is empty"):
        annotation_key("", "0")


def test_annotation_value_checks_every_name() -> None:
    assert annotation_value(["a.com/b=0", "a.com/b=1"]) == "a.com/b=0,a.com/b=1"
    with pytest.raises(AnnotationError, match=re.escape("'a.com/b=1 '")):
        annotation_value(["a.com/b=0", "a.com/b=1 "])


def test_add_annotation_never_overwrites() -> None:
    first = add_annotation({}, "nvidia.gpu", "0", ["nvidia.com/gpu=0"])
    assert first == {"cdi.k8s.io/nvidia.gpu_0": "nvidia.com/gpu=0"}
    with pytest.raises(AnnotationError, match="already set"):
        add_annotation(first, "nvidia.gpu", "0", ["nvidia.com/gpu=1"])


def test_parse_annotations_sorted_keys_and_order_of_values() -> None:
    keys, devices = parse_annotations(
        {
            "cdi.k8s.io/z": "v.com/c=3",
            "other/key": "ignored",
            "cdi.k8s.io/a": "v.com/c=1,v.com/c=2",
        }
    )
    assert keys == ["cdi.k8s.io/a", "cdi.k8s.io/z"]
    assert devices == ["v.com/c=1", "v.com/c=2", "v.com/c=3"]


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("cdi.k8s.io/gpu", "nvidia.com/gpu=0, nvidia.com/gpu=1", "' nvidia.com/gpu=1'"),
        ("cdi.k8s.io/gpu", "", "invalid CDI device name ''"),
        ("cdi.k8s.io/gpu", "/dev/nvidia0", "'/dev/nvidia0'"),
        ("cdi.k8s.io/", "nvidia.com/gpu=0", "invalid key: the part after 'cdi.k8s.io/' is empty"),
        ("cdi.k8s.io/_x", "nvidia.com/gpu=0", "invalid key"),
    ],
)
def test_malformed_annotations_name_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_annotation(key, value)
    assert str(info.value).startswith(f"annotation {key!r}: ")
    assert message in str(info.value)
