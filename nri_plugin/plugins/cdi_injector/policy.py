"""The authorization policy (docs/usage/policy.md): loaded once from YAML, validated with
messages that name the key; evaluation is pure. The parser learns the vendors' request
sources and default denials from the vendors it is given (``VendorPolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from fnmatch import fnmatchcase
from typing import Any, Protocol

from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.wire import Code
from nri_plugin.plugins.cdi_injector.refusal import Refusal


def _key(key: str, default: Any = MISSING, check: str | tuple[str, ...] = "bool") -> Any:
    """A field the policy file sets: its key (``section.key`` inside a section) and how its
    value is checked (``_checked``: "bool", "patterns", or the choices of a string)."""
    return field(default=default, metadata={"key": key, "check": check})


class PolicyError(NRIPluginError):
    """The policy file is invalid; ``problems`` lists every error with its key path."""

    def __init__(self, problems: list[str], path: str = "") -> None:
        self.problems = problems
        where = f"{path}: " if path else ""
        super().__init__(f"invalid policy {where}" + "; ".join(problems))


class PolicyDenied(Refusal):
    """A request the policy does not allow; ``reason.rule`` names the rule
    (``sources.podAnnotations.namespaces``, ``devices[1]``)."""

    default_rule = "policy"
    default_code = Code.PERMISSION_DENIED


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRule:
    title: str  # how messages name the source, e.g. "pod annotations"
    enabled: bool = _key("enabled")
    namespaces: tuple[str, ...] = _key("namespaces", ("*",), "patterns")
    privileged_only: bool = _key("privilegedOnly", False)


class NamedSource(Protocol):
    """What the policy needs of a request source (``context.RequestSource``)."""

    @property
    def name(self) -> str: ...
    @property
    def default(self) -> SourceRule: ...


class VendorPolicy(Protocol):
    """What the policy needs of a vendor's rules (``vendor.VendorRules``)."""

    @property
    def sources(self) -> Sequence[NamedSource]: ...
    @property
    def default_denials(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRule:
    index: int
    namespaces: tuple[str, ...] = _key("namespaces", ("*",), "patterns")
    allow: tuple[str, ...] = _key("allow", (), "patterns")
    deny: tuple[str, ...] = _key("deny", (), "patterns")

    def describe(self) -> str:
        return f"devices[{self.index}] (namespaces {list(self.namespaces)})"


def _in_namespaces(namespace: str, patterns: tuple[str, ...]) -> bool:
    # "*" (the default) first: it matches every namespace, without a pattern match.
    return "*" in patterns or any(fnmatchcase(namespace, p) for p in patterns)


# Namespaces where pods may ask by annotation, by default: none. An annotation is not a
# resource the scheduler counts or a quota limits, and any pod can set one, so on a shared
# cluster the operator names the namespaces that may (docs/usage/policy.md).
NO_NAMESPACE: tuple[str, ...] = ()

# The injector's own sources (``asked.py`` reads them); vendors add theirs.
NEUTRAL_SOURCES: Mapping[str, SourceRule] = {
    # Set by the kubelet from a device plugin's or a DRA claim's allocation.
    "containerAnnotations": SourceRule(title="container annotations", enabled=True),
    "podAnnotations": SourceRule(title="pod annotations", enabled=True,
                                 namespaces=NO_NAMESPACE),
    # The other NRI CDI injectors' pod annotations: the same trust as ours.
    "nriPluginsAnnotations": SourceRule(
        title="nri-plugins CDI injector annotations (cdi.nri.io)", enabled=True,
        namespaces=NO_NAMESPACE)}


def default_sources(vendors: Sequence[VendorPolicy] = ()) -> dict[str, SourceRule]:
    """Every known source with its default rule: the injector's, then each vendor's."""
    out = dict(NEUTRAL_SOURCES)
    for vendor in vendors:
        out.update((source.name, source.default) for source in vendor.sources)
    return out


def default_device_rules(vendors: Sequence[VendorPolicy] = ()) -> tuple[DeviceRule, ...]:
    """Every device but the vendors' default denials, in every namespace."""
    deny = tuple(p for vendor in vendors for p in vendor.default_denials)
    return (DeviceRule(index=0, allow=("*",), deny=deny),)


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    sources: Mapping[str, SourceRule] = field(default_factory=default_sources)
    devices: tuple[DeviceRule, ...] = field(default_factory=default_device_rules)
    privileged_exempt: bool = _key("privilegedExempt", False)
    enforce_requirements: bool = _key("requirements.enforce", True)
    # A spec without sidecar facts: allow skips the checks.
    unknown_facts: str = _key("requirements.unknownFacts", "allow", ("allow", "deny"))
    filter_capabilities: bool = _key("capabilities.filter", True)
    mask_proc: bool = _key("procMasking.enabled", False)  # others' GPUs hidden in /proc
    # additionalGids NRI cannot carry and the runtime cannot take: drop (inject without
    # them, with a warning: narrower than the spec) or refuse the container.
    additional_gids: str = _key("additionalGids", "drop", ("drop", "refuse"))
    fail_closed_action: str = _key("failClosed.action", "evict", ("evict", "report"))
    origin: str = "built-in defaults"

    @classmethod
    def defaults(cls, vendors: Sequence[VendorPolicy] = (), *,
                 origin: str = "built-in defaults") -> Policy:
        return cls(sources=default_sources(vendors), devices=default_device_rules(vendors),
                   origin=origin)

    # --- evaluation (pure) ------------------------------------------------------------------

    def rule(self, source: str, default: SourceRule | None = None) -> SourceRule:
        """The rule of ``source``; ``default`` for a source this policy was made without."""
        rule = self.sources.get(source, default)
        if rule is None:
            raise KeyError(f"request source {source!r} is not known to this policy")
        return rule

    def source_allowed(self, source: str, namespace: str, privileged: bool,
                       default: SourceRule | None = None) -> str | None:
        """None if ``source`` may be used here, else why not (naming the rule)."""
        rule = self.rule(source, default)
        if not rule.enabled:
            return f"request source {rule.title} is disabled (sources.{source}.enabled)"
        if privileged and self.privileged_exempt:
            return None
        if rule.privileged_only and not privileged:
            return (f"request source {rule.title} is for privileged containers only "
                    f"(sources.{source}.privilegedOnly)")
        if not rule.namespaces:
            return (f"request source {rule.title} is allowed in no namespace on this node "
                    f"(sources.{source}.namespaces is empty: the node's operator lists the "
                    f"namespaces that may ask this way)")
        if not _in_namespaces(namespace, rule.namespaces):
            return (f"request source {rule.title} is not allowed in namespace {namespace!r} "
                    f"(sources.{source}.namespaces {list(rule.namespaces)})")
        return None

    def check_source(self, source: str, namespace: str, privileged: bool, *,
                     default: SourceRule | None = None, asked_by: str = "") -> None:
        """Raise PolicyDenied naming the rule (and what asked) when ``source`` may not be
        used here."""
        why = self.source_allowed(source, namespace, privileged, default)
        if why is None:
            return
        rule = self.rule(source, default)
        key = ("enabled" if not rule.enabled else
               "privilegedOnly" if rule.privileged_only and not privileged else "namespaces")
        raise PolicyDenied(f"{why}; asked for by {asked_by}" if asked_by else why,
                           rule=f"sources.{source}.{key}")

    def check_devices(self, names: Sequence[str], namespace: str, privileged: bool) -> None:
        """Raise PolicyDenied naming the rule for the first device not allowed here."""
        if privileged and self.privileged_exempt:
            return
        rules = [r for r in self.devices if _in_namespaces(namespace, r.namespaces)]
        for name in names:
            _check_device(name, namespace, rules)


def _check_device(name: str, namespace: str, rules: list[DeviceRule]) -> None:
    for rule in rules:
        for pattern in rule.deny:
            if fnmatchcase(name, pattern):
                raise PolicyDenied(
                    f"device {name} denied in namespace {namespace!r} by policy rule "
                    f"{rule.describe()} deny {pattern!r}",
                    rule=f"devices[{rule.index}]", device=name)
    if any(fnmatchcase(name, p) for rule in rules for p in rule.allow):
        return
    if not rules:
        raise PolicyDenied(f"device {name} denied: no policy devices rule applies to "
                           f"namespace {namespace!r}", rule="devices", device=name)
    raise PolicyDenied(
        f"device {name} denied in namespace {namespace!r}: no allow pattern matches in "
        f"policy rules {', '.join(r.describe() for r in rules)}", rule="devices", device=name)


# --- loading and validation ------------------------------------------------------------------


def load_policy(path: str, vendors: Sequence[VendorPolicy] = ()) -> Policy:
    """Read and validate a policy file (YAML); raises PolicyError naming every problem."""
    import yaml  # lazy: the built-in default policy never needs it

    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
    except OSError as exc:
        raise PolicyError([f"cannot read: {exc.strerror}"], path) from None
    except yaml.YAMLError as exc:
        raise PolicyError([f"not valid YAML: {exc}"], path) from None
    return parse_policy(doc, origin=path, vendors=vendors)


def parse_policy(doc: Any, *, origin: str = "", vendors: Sequence[VendorPolicy] = ()) -> Policy:
    problems: list[str] = []
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PolicyError(["the document must be a mapping"], origin)
    # The plain settings by section ("": the top level).
    sections: dict[str, dict[str, Field[Any]]] = {"": {}}
    for key, setting in _declared(Policy).items():
        section, _, name = key.rpartition(".")
        sections.setdefault(section, {})[name] = setting
    _keys(doc, "", {"version", "sources", "devices", *sections[""], *sections} - {""}, problems)
    if doc.get("version", 1) != 1:
        problems.append(f"version: unsupported {doc.get('version')!r} (want 1)")
    values: dict[str, Any] = {
        "sources": _sources(doc.get("sources", {}), default_sources(vendors), problems),
        "devices": _device_rules(doc.get("devices"), default_device_rules(vendors), problems)}
    for section, declared in sections.items():
        found = _section(doc, section, section, set(declared), problems) if section else doc
        values.update(_read(found, f"{section}." if section else "", declared, problems))
    if problems:
        raise PolicyError(problems, origin)
    return Policy(**values, origin=origin or "inline")


def _declared(cls: type) -> dict[str, Field[Any]]:
    """``cls``'s fields that the policy file sets, by key."""
    return {f.metadata["key"]: f for f in fields(cls) if "key" in f.metadata}


def _keys(doc: Mapping[str, Any], where: str, known: set[str], problems: list[str]) -> None:
    for key in doc:
        if key not in known:
            problems.append(f"{where}{key}: unknown key (known: {', '.join(sorted(known))})")


def _section(doc: Mapping[str, Any], key: str, where: str, known: set[str],
             problems: list[str]) -> Mapping[str, Any]:
    """The mapping ``doc[key]``, at ``where`` (empty when absent, null or not a mapping:
    a problem)."""
    value = doc.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping")
        return {}
    _keys(value, where + ".", known, problems)
    return value


def _read(doc: Mapping[str, Any], where: str, declared: Mapping[str, Field[Any]],
          problems: list[str]) -> dict[str, Any]:
    """The declared keys ``doc`` has, checked, by field name."""
    return {f.name: _checked(doc[key], where + key, f.metadata["check"], problems)
            for key, f in declared.items() if key in doc}


def _checked(value: Any, where: str, check: str | tuple[str, ...],
             problems: list[str]) -> Any:
    """``value`` as ``check`` wants it; None with a problem when it is not."""
    if check == "bool":
        if isinstance(value, bool):
            return value
        want = "true or false"
    elif check == "patterns":
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and all(isinstance(p, str) and p for p in value):
            return tuple(value)
        want = "a list of non-empty glob patterns"
    else:
        if value in check:
            return value
        want = f"one of {', '.join(check)}"
    problems.append(f"{where}: must be {want}, got {value!r}")
    return None


def _sources(doc: Any, defaults: Mapping[str, SourceRule],
             problems: list[str]) -> Mapping[str, SourceRule]:
    if not isinstance(doc, dict):
        problems.append("sources: must be a mapping")
        return defaults
    _keys(doc, "sources.", set(defaults), problems)
    declared = _declared(SourceRule)
    return {name: replace(rule, **_read(
        _section(doc, name, f"sources.{name}", set(declared), problems),
        f"sources.{name}.", declared, problems)) for name, rule in defaults.items()}


def _device_rules(doc: Any, defaults: tuple[DeviceRule, ...],
                  problems: list[str]) -> tuple[DeviceRule, ...]:
    if doc is None:
        return defaults
    if not isinstance(doc, list):
        problems.append("devices: must be a list of rules")
        return defaults
    declared = _declared(DeviceRule)
    rules = []
    for i, item in enumerate(doc):
        where = f"devices[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be a mapping")
            continue
        _keys(item, where + ".", set(declared), problems)
        if "allow" not in item and "deny" not in item:
            problems.append(f"{where}: needs allow or deny")
        none = {k: item.get(k) or [] for k in ("allow", "deny")}  # null or empty: none
        rules.append(DeviceRule(index=i, **_read({**item, **none}, where + ".", declared,
                                                 problems)))
    return tuple(rules)
