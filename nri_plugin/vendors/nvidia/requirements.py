"""NVIDIA_REQUIRE_* checks, with the toolkit's grammar (docs/usage/policy.md, "Requirements"),
against the node facts in the generator's sidecar. Pure. NVIDIA's CDI modes skip them
(nvidia-container-toolkit#1470): an image for a newer CUDA would fail later, obscurely.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeVersions

REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
IGNORED = frozenset({"NVIDIA_REQUIRE_JETPACK"})
DISABLE = "NVIDIA_DISABLE_REQUIRE"
NAMES = ("cuda", "driver", "arch", "brand")
# Longest first, so that "<=" is not read as "<" followed by "=value".
_OPS = {"<=": operator.le, ">=": operator.ge, "!=": operator.ne, "<": operator.lt,
        ">": operator.gt, "=": operator.eq}
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_VERSION = re.compile(r"^\d+(\.\d+)*$")


class RequirementError(Refusal):
    default_rule = "nvidia.requirements"


@dataclass(frozen=True, slots=True)
class Constraint:
    name: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"


@dataclass(frozen=True, slots=True)
class Requirement:
    env: str  # the variable it came from, e.g. NVIDIA_REQUIRE_CUDA
    text: str
    alternatives: tuple[tuple[Constraint, ...], ...]


def _version_key(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse_requirement(env: str, text: str) -> Requirement:
    alternatives = []
    for alternative in text.split():
        terms = tuple(_parse_constraint(env, term) for term in alternative.split(",") if term)
        if terms:
            alternatives.append(terms)
    return Requirement(env=env, text=" ".join(text.split()), alternatives=tuple(alternatives))


def _parse_constraint(env: str, term: str) -> Constraint:
    for op in _OPS:
        name, sep, value = term.partition(op)
        if sep and name and value:
            break
    else:
        raise RequirementError(f"{env}: cannot parse {term!r} (want NAME OP VALUE, OP one "
                               "of = != < <= > >=)")
    c = Constraint(name.strip().lower(), op, value.strip())
    if c.name not in NAMES:
        raise RequirementError(f"{env}: unknown name {c.name!r} in {c} (known: "
                               f"{', '.join(NAMES)})")
    if c.name == "brand":
        if c.op not in ("=", "!="):
            raise RequirementError(f"{env}: brand takes only = or !=, got {c}")
        return Constraint(c.name, c.op, c.value.lower())
    if not _VERSION.match(c.value):
        raise RequirementError(f"{env}: {c.value!r} in {c} is not a version (digits and dots)")
    return c


def requirements_from_env(env: Mapping[str, str]) -> list[Requirement]:
    """The container's requirements; none when NVIDIA_DISABLE_REQUIRE is true. A legacy
    image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset) requires cuda>=major.minor."""
    if env.get(DISABLE, "").strip() in _TRUE:
        return []
    found = [parse_requirement(key, value) for key, value in sorted(env.items())
             if key.startswith(REQUIRE_PREFIX) and key not in IGNORED and value.strip()]
    if "NVIDIA_REQUIRE_CUDA" not in env and env.get("CUDA_VERSION"):
        match = re.match(r"^(\d+)\.(\d+)", env["CUDA_VERSION"])
        if match:
            implicit = f"cuda>={match.group(1)}.{match.group(2)}"
            found.append(parse_requirement("CUDA_VERSION (legacy image)", implicit))
    return found


def check(requirements: Sequence[Requirement], node: NodeVersions,
          gpus: Sequence[DeviceFacts]) -> None:
    """Raise RequirementError for the first requirement not met. Evaluated once per GPU
    (arch and brand are per device); with no GPU, once with arch/brand taken as met."""
    for requirement in requirements:
        for gpu in gpus or (None,):
            # Each alternative's first term not met (None: it holds).
            failures = [next(filter(None, (_failure(c, node, gpu) for c in alternative)), None)
                        for alternative in requirement.alternatives]
            if requirement.alternatives and all(failures):
                raise RequirementError(_message(requirement, [f for f in failures if f]))


def _failure(c: Constraint, node: NodeVersions, gpu: DeviceFacts | None) -> str | None:
    if c.name == "cuda":
        have = node.cuda
        described = f"node driver {node.driver or '(unknown version)'} supports CUDA {have}"
    elif c.name == "driver":
        have, described = node.driver, f"node driver is {node.driver}"
    elif gpu is None:
        return None  # no GPU visible: arch and brand hold
    elif c.name == "arch":
        have, described = gpu.arch, f"GPU {gpu.name} has arch {gpu.arch}"
    else:
        have, described = gpu.brand, f"GPU {gpu.name} is brand {gpu.brand}"
    if have is None:
        return f"{c}: the node's {c.name} is not recorded (regenerate the spec in nvml mode)"
    if c.name == "brand":
        holds = (have.lower() == c.value) == (c.op == "=")
    else:
        holds = bool(_VERSION.match(have)) and _OPS[c.op](_version_key(have),
                                                          _version_key(c.value))
    return None if holds else f"{c} not met: {described}"


def _message(requirement: Requirement, failures: list[str]) -> str:
    # One alternative with one failing term: "requirement cuda>=12.8 not met: node ...".
    if len(failures) == 1:
        detail = f"requirement {failures[0]}"
    else:
        detail = (f"requirement {requirement.text!r} not met, no alternative holds: "
                  + "; ".join(failures))
    return (f"{detail} ({requirement.env}; NVIDIA_DISABLE_REQUIRE=true skips the check)")
