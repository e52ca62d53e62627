"""The runtime peer's adjustment application, NRI version by version (test-only).

What a runtime does with a plugin's ContainerAdjustment, written from containerd/nri's
generator (``pkg/runtime-tools/generate``: ``Adjust`` and its helpers) at v0.6.1, v0.8.0,
v0.10.0, v0.11.0 and v0.12.0, which containerd (``internal/cri/nri``) and CRI-O
(``server/nri-api.go``) both call with the NRI version they vendor. Only the parts the
CDI injector uses: env, hooks, CDI_devices, linux.devices, linux.resources.devices,
mounts, in ``Adjust``'s order. Independent of the plugin's code on purpose.

Checked against real runtimes (tests/test_nri_wire_model.py): for every container the
plugin adjusted in the NRI wire recordings (tests/data/nri-wire/), the container NRI showed
the plugin, with the recorded adjustment applied here, is the OCI spec the runtime made
(env, mounts in order, device nodes, device rules, hooks). Where a recording disagrees,
the recording is right and this model changes. What they taught it: CRI-O 1.35.6 hands NRI
a container whose env holds PATH twice (the image's, then its default), and the runtime's
spec after an env adjustment holds it once: NRI re-adds every old entry through
runtime-tools' AddProcessEnv, which replaces a name already added (the model kept both).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

from nri_plugin.nri.api import nri_pb2

Version = tuple[int, int, int]
# resolves CDI device names into the spec, as the runtime's own CDI does
CdiInjector = Callable[[dict[str, Any], list[str]], dict[str, Any]]
# A container as the runtime made it before NRI: deny all devices, then its defaults.
CONTAINER_BEFORE_NRI: dict[str, Any] = {
    "process": {"env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
    "mounts": [{"destination": "/proc", "source": "proc", "type": "proc"}],
    "linux": {"devices": [], "resources": {"devices": [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]}},
}
_HOOKS = (("prestart", "prestart"), ("poststart", "poststart"), ("poststop", "poststop"),
          ("create_runtime", "createRuntime"), ("create_container", "createContainer"),
          ("start_container", "startContainer"))


def before_nri(container: nri_pb2.Container) -> dict[str, Any]:
    """The OCI spec (the parts an adjustment changes) of a container as NRI shows it to a
    plugin in CreateContainer: what the runtime made before NRI."""
    from google.protobuf import json_format

    linux = container.linux
    spec: dict[str, Any] = {
        "process": {"env": list(container.env)},
        "mounts": [{"destination": m.destination, **({"type": m.type} if m.type else {}),
                    "source": m.source, **({"options": list(m.options)} if m.options else {})}
                   for m in container.mounts],
        "linux": {"devices": [_oci_device(d) for d in linux.devices],
                  "resources": {"devices": [_oci_rule(r) for r in linux.resources.devices]}},
    }
    hooks = json_format.MessageToDict(container.hooks, preserving_proto_field_name=True)
    for field, oci in _HOOKS:
        if hooks.get(field):
            spec.setdefault("hooks", {})[oci] = hooks[field]
    return spec


def _oci_device(d: nri_pb2.LinuxDevice) -> dict[str, Any]:
    oci: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
    if d.HasField("file_mode"):
        oci["fileMode"] = d.file_mode.value
    if d.HasField("uid"):
        oci["uid"] = d.uid.value
    if d.HasField("gid"):
        oci["gid"] = d.gid.value
    return oci


def _oci_rule(r: nri_pb2.LinuxDeviceCgroup) -> dict[str, Any]:
    rule: dict[str, Any] = {"allow": r.allow}
    if r.type:
        rule["type"] = r.type
    if r.HasField("major"):
        rule["major"] = r.major.value
    if r.HasField("minor"):
        rule["minor"] = r.minor.value
    if r.access:
        rule["access"] = r.access
    return rule


def apply_adjustment(spec: dict[str, Any], adjust: nri_pb2.ContainerAdjustment,
                     nri_version: Version, cdi: CdiInjector | None) -> dict[str, Any]:
    """A copy of ``spec`` as the runtime leaves it after ``adjust``. ``cdi``: the runtime's
    CDI injection for CDI_devices, None where the runtime does not act on them (it then
    drops them silently)."""
    out = copy.deepcopy(spec)
    _env(out, adjust.env)
    _hooks(out, adjust.hooks)
    names = [d.name for d in adjust.CDI_devices]
    if names and nri_version >= (0, 7, 0) and cdi is not None:
        out = cdi(out, names)
    _devices(out, adjust.linux.devices)
    if nri_version >= (0, 10, 0):  # before 0.10, explicit rules never reach the spec
        rules = out.setdefault("linux", {}).setdefault("resources", {}).setdefault(
            "devices", [])
        for r in adjust.linux.resources.devices:
            rules.append({"allow": r.allow, "type": r.type, "major": r.major.value,
                          "minor": r.minor.value, "access": r.access})
    _mounts(out, adjust.mounts)
    return out


def _env(spec: dict[str, Any], env: Any) -> None:
    """NRI's AdjustEnv: the old entries again, each through runtime-tools' AddProcessEnv
    (a name already there is replaced where it first stood: duplicates fold into one),
    those the adjustment names replaced or removed, then the new ones in its order."""
    if not env:
        return
    mod = {kv.key.lstrip("-"): kv for kv in env}
    process = spec.setdefault("process", {})
    out: list[str] = []
    where: dict[str, int] = {}

    def add(name: str, value: str) -> None:
        if name in where:
            out[where[name]] = f"{name}={value}"
        else:
            where[name] = len(out)
            out.append(f"{name}={value}")

    for entry in process.get("env", []):
        name, sep, value = entry.partition("=")
        if not sep:
            continue
        if name in mod:
            kv = mod.pop(name)
            if not kv.key.startswith("-"):
                add(kv.key, kv.value)
            continue
        add(name, value)
    for kv in env:  # the rest are new, in the adjustment's order
        if not kv.key.startswith("-") and kv.key in mod:
            add(kv.key, kv.value)
    process["env"] = out


def _hooks(spec: dict[str, Any], hooks: nri_pb2.Hooks) -> None:
    for field, oci in _HOOKS:
        for h in getattr(hooks, field):
            hook: dict[str, Any] = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.HasField("timeout"):
                hook["timeout"] = h.timeout.value
            spec.setdefault("hooks", {}).setdefault(oci, []).append(hook)


def access_string(device: nri_pb2.LinuxDevice) -> str:
    """NRI's LinuxDevice.AccessString: r and w whatever the mode, m for block devices."""
    return "rwm" if device.type == "b" else "rw"


def _devices(spec: dict[str, Any], devices: Any) -> None:
    linux = spec.setdefault("linux", {})
    for d in devices:
        path = d.path.lstrip("-")
        linux["devices"] = [x for x in linux.get("devices", []) if x["path"] != path]
        if d.path.startswith("-"):
            continue
        oci: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major,
                               "minor": d.minor}
        if d.HasField("file_mode"):
            oci["fileMode"] = d.file_mode.value
        if d.HasField("uid"):
            oci["uid"] = d.uid.value
        if d.HasField("gid"):
            oci["gid"] = d.gid.value
        linux["devices"].append(oci)
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": d.type, "major": d.major, "minor": d.minor,
             "access": access_string(d)})


def _mounts(spec: dict[str, Any], mounts: Any) -> None:
    if not mounts:
        return
    current = spec.setdefault("mounts", [])
    for m in mounts:
        dest = m.destination.lstrip("-")
        current[:] = [x for x in current if x["destination"] != dest]
        if m.destination.startswith("-"):
            continue
        oci: dict[str, Any] = {"destination": m.destination, "source": m.source}
        if m.type:
            oci["type"] = m.type
        if m.options:
            oci["options"] = list(m.options)
        current.append(oci)
    current.sort(key=lambda x: (os.path.normpath(x["destination"]).count("/"),
                                x["destination"]))
