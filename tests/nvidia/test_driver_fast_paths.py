"""The generator's fast paths (its own glob, its mig-minors reader) agree with the careful
versions they stand in for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=400, deadline=None)
@given(st.text("ab.*", max_size=7), st.text("ab.", max_size=8))
def test_star_matcher_is_fnmatch(pattern: str, name: str) -> None:
    import fnmatch

    from cdi.nvidia.driver import star_matcher

    match = star_matcher(pattern)
    assert match is not None and match(name) == fnmatch.fnmatchcase(name, pattern)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu0/gi1/access", "config", " x", "a\tb", ""]),
                          st.sampled_from(["1", "23", " 4", "x", "", "5 6", "٣"])), max_size=6))
def test_mig_minors_fast_path_agrees(lines: list[tuple[str, str]]) -> None:
    from cdi.nvidia import driver

    text = "".join(f"{k} {v}\n" for k, v in lines)
    fast = driver._mig_minors_fast(text)
    if fast is not None:
        slow = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            value = value.strip()
            if value.isascii() and value.isdigit():
                slow[key] = value
        assert fast == slow
