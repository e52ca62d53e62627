"""Renders deploy/helm/nri-cdi as ``helm template`` would, for the tests: no ``helm`` binary
can be installed here (Debian has none, PyPI ships none), so this module implements the small
part of Go's text/template and Helm's functions that the chart uses, and refuses anything
else: a template that uses more fails the tests instead of rendering differently from Helm.

Supported: text; ``{{ }}`` actions with ``{{-``/``-}}`` whitespace trimming; comments;
``if``/``else if``/``else``/``with``/``end``; pipelines of field paths (``.Values.a.b``,
``.``), string and number literals and the functions ``toYaml``, ``nindent``, ``indent``,
``quote``, ``default``, ``required``, ``eq``, ``ne``, ``not``; Go's truth (false, 0, "", an
empty list or map and nil are false). ``values.schema.json`` is checked, as Helm does, before
rendering.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "nri-cdi"
ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class RenderError(Exception):
    """The chart cannot be rendered: a failed ``required``, bad values, or a template
    construct this renderer does not implement."""


@dataclass
class _Node:
    kind: str  # "text", "expr", "if", "with"
    text: str = ""
    branches: list[tuple[str | None, list[_Node]]] = field(default_factory=list)


def _tokens(source: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) with Go's trimming applied to the neighbouring text."""
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for match in ACTION.finditer(source):
        text = source[pos:match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", match.group(2)))
        trim_next = bool(match.group(3))
        pos = match.end()
    tail = source[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _parse(tokens: list[tuple[str, str]]) -> list[_Node]:
    stack: list[tuple[_Node | None, list[_Node]]] = [(None, [])]
    for kind, value in tokens:
        body = stack[-1][1]
        if kind == "text":
            if value:
                body.append(_Node("text", value))
            continue
        if value.startswith("/*"):
            continue
        word, _, rest = value.partition(" ")
        if word in ("if", "with"):
            node = _Node(word)
            node.branches.append((rest, []))
            body.append(node)
            stack.append((node, node.branches[-1][1]))
        elif word == "else":
            node = stack[-1][0]
            if node is None:
                raise RenderError("else outside if/with")
            condition = rest[3:] if rest.startswith("if ") else None
            node.branches.append((condition, []))
            stack[-1] = (node, node.branches[-1][1])
        elif word == "end":
            if len(stack) == 1:
                raise RenderError("end without if/with")
            stack.pop()
        elif word in ("range", "define", "template", "include", "block"):
            raise RenderError(f"{word!r} is not implemented by tests/helm_render.py")
        else:
            body.append(_Node("expr", value))
    if len(stack) != 1:
        raise RenderError("if/with without end")
    return stack[0][1]


def _truth(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (
        isinstance(value, (list, dict, tuple)) and not value)


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(width: int, text: str) -> str:
    pad = " " * int(width)
    return "\n".join(pad + line for line in str(text).split("\n"))


def _required(message: str, value: Any) -> Any:
    if value is None or value == "":
        raise RenderError(message)
    return value


def _go_string(value: Any) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    return "" if value is None else str(value)


FUNCTIONS: dict[str, Any] = {
    "toYaml": _to_yaml,
    "nindent": lambda width, text: "\n" + _indent(width, text),
    "indent": _indent,
    "quote": lambda value: json.dumps(_go_string(value)),
    "default": lambda fallback, value: value if _truth(value) else fallback,
    "required": _required,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "not": lambda value: not _truth(value),
}


def _operand(word: str, dot: Any, root: Mapping[str, Any]) -> Any:
    if word == ".":
        return dot
    if word.startswith("."):
        value: Any = root
        for part in word[1:].split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value
    if word.startswith('"'):
        return json.loads(word)
    if re.fullmatch(r"-?\d+", word):
        return int(word)
    if word in ("true", "false"):
        return word == "true"
    raise RenderError(f"unsupported operand {word!r}")


def _evaluate(pipeline: str, dot: Any, root: Mapping[str, Any]) -> Any:
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', pipeline)  # outside string literals
    if "(" in code or "$" in code or ":=" in code:
        raise RenderError(f"unsupported pipeline {pipeline!r}")
    value: Any = None
    for i, command in enumerate(part.strip() for part in pipeline.split("|")):
        words = shlex.split(command, posix=False)
        head, args = words[0], [_operand(w, dot, root) for w in words[1:]]
        if i:
            args.append(value)
        if head in FUNCTIONS:
            value = FUNCTIONS[head](*args)
        elif head.startswith((".", '"')) or head in ("true", "false") or head[0].isdigit():
            if args:
                raise RenderError(f"{head!r} is not a function")
            value = _operand(head, dot, root)
        else:
            raise RenderError(f"function {head!r} is not implemented by tests/helm_render.py")
    return value


def _render(nodes: list[_Node], dot: Any, root: Mapping[str, Any]) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "expr":
            out.append(_go_string(_evaluate(node.text, dot, root)))
        else:
            for condition, body in node.branches:
                value = True if condition is None else _evaluate(condition, dot, root)
                if _truth(value):
                    out.append(_render(body, value if node.kind == "with" and condition
                                       is not None else dot, root))
                    break
    return "".join(out)


def merge_values(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of values: maps merge key by key, and a key set to null (``--set
    key=null``) is removed."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def render(values: Mapping[str, Any] | None = None, *, release: str = "nri-cdi",
           namespace: str = "kube-system", chart: Path = CHART) -> dict[str, str]:
    """template file name -> rendered text (``helm template RELEASE CHART -n NAMESPACE``
    with ``values`` given as ``--set``/``-f``)."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    merged = merge_values(yaml.safe_load((chart / "values.yaml").read_text()), values or {})
    schema = chart / "values.schema.json"
    if schema.is_file():
        try:
            jsonschema.validate(merged, json.loads(schema.read_text()))
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(values)"
            raise RenderError(f"values don't meet the schema: {where}: {exc.message}") from None
    root = {"Values": merged, "Release": {"Name": release, "Namespace": namespace},
            "Chart": {"Name": meta["name"], "Version": meta["version"],
                      "AppVersion": meta.get("appVersion", "")}}
    return {path.name: _render(_parse(_tokens(path.read_text())), root, root)
            for path in sorted((chart / "templates").glob("*.yaml"))}


def documents(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The rendered manifests, parsed."""
    return [doc for text in render(values, **kwargs).values()
            for doc in yaml.safe_load_all(text) if doc]


# deploy/kubernetes's plain manifests are this chart rendered: file -> (values, template).
PLAIN_IMAGE = "registry.example.com/nri-cdi"
PLAIN_MANIFESTS: dict[str, tuple[dict[str, Any], str]] = {
    "daemonset.yaml": ({}, "daemonset.yaml"),
    "configmap.yaml": ({}, "configmap.yaml"),
    "daemonset-host-driver.yaml": ({"driver": {"location": "host"}}, "daemonset.yaml"),
}


def plain_manifest_header(values: Mapping[str, Any]) -> str:
    sets = {"image.repository": PLAIN_IMAGE}
    if values.get("driver"):
        sets["driver.location"] = values["driver"]["location"]
    flags = " ".join(f"--set {key}={value}" for key, value in sets.items())
    return ("# Rendered from the Helm chart (do not edit here; tests/ops/test_helm_chart.py\n"
            "# compares): helm template nri-cdi deploy/helm/nri-cdi -n kube-system \\\n"
            f"#   {flags}\n"
            f"# {PLAIN_IMAGE} is a placeholder: build and push the image, then\n"
            "# replace it (docs/install/kubernetes.md).\n")


def plain_manifest(name: str) -> str:
    """What deploy/kubernetes/NAME must hold."""
    values, template = PLAIN_MANIFESTS[name]
    rendered = render(merge_values({"image": {"repository": PLAIN_IMAGE}}, values))[template]
    return plain_manifest_header(values) + rendered


if __name__ == "__main__":  # python -m tests.helm_render: rewrite deploy/kubernetes's copies
    for manifest in PLAIN_MANIFESTS:
        (CHART.parents[1] / "kubernetes" / manifest).write_text(plain_manifest(manifest))
        print(f"wrote deploy/kubernetes/{manifest}")
