"""Builders for a ``ContainerAdjustment``, as NRI's Go helpers fill it (``AddEnv``, ...,
the ``Remove*`` ones): the library's API for plugin authors (docs/developer/writing-a-plugin.md).
Removals use NRI's convention, a key prefixed with ``-`` (Go's ``MarkForRemoval``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nri_plugin.nri.api import nri_pb2

# OCI hook stages, as named by NRI's ``Hooks`` message.
HOOK_STAGES = tuple(field.name for field in nri_pb2.Hooks.DESCRIPTOR.fields)
_REMOVAL = "-"


def add_env(adjustment: nri_pb2.ContainerAdjustment, key: str, value: str) -> None:
    """Set environment variable ``key`` (replacing the image's or the pod's value)."""
    if not key or "=" in key:
        raise ValueError(f"environment variable name {key!r}: must be non-empty, without '='")
    adjustment.env.add(key=key, value=value)


def remove_env(adjustment: nri_pb2.ContainerAdjustment, key: str) -> None:
    """Unset environment variable ``key``."""
    adjustment.env.add(key=_REMOVAL + key)


def add_mount(
    adjustment: nri_pb2.ContainerAdjustment,
    destination: str,
    source: str,
    *,
    type: str = "bind",  # the OCI field's name
    options: Iterable[str] = ("rbind", "ro"),
) -> None:
    """Mount ``source`` at ``destination`` in the container (read-only bind by default)."""
    _absolute("mount destination", destination)
    adjustment.mounts.add(destination=destination, source=source, type=type,
                          options=list(options))


def remove_mount(adjustment: nri_pb2.ContainerAdjustment, destination: str) -> None:
    """Drop the container's mount at ``destination``."""
    adjustment.mounts.add(destination=_REMOVAL + destination)


@dataclass(frozen=True, slots=True)
class OciDevice:
    """A device node for ``add_device``, as the OCI spec's ``linux.devices[]`` entry
    (``type`` ``c``, ``b``, ``u`` or ``p``)."""

    path: str
    type: str  # the OCI field's name
    major: int
    minor: int
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


def add_device(adjustment: nri_pb2.ContainerAdjustment, node: OciDevice, *,
               access: str | None = "rwm") -> None:
    """Create device node ``node`` in the container and, unless ``access`` is None, allow
    it in the device cgroup with that access."""
    path, type, major, minor = node.path, node.type, node.major, node.minor
    _absolute("device path", path)
    if type not in ("c", "b", "u", "p"):
        raise ValueError(f"device {path}: type {type!r} is not one of c, b, u, p")
    adjustment.linux.devices.add(
        path=path, type=type, major=major, minor=minor,
        # permission bits only: NRI adds the type
        file_mode=None if node.file_mode is None else {"value": node.file_mode & 0o7777},
        uid=None if node.uid is None else {"value": node.uid},
        gid=None if node.gid is None else {"value": node.gid})
    if access is not None and type != "p":  # a FIFO has no device number to allow
        adjustment.linux.resources.devices.add(allow=True, type=type, access=access,
                                               major={"value": major}, minor={"value": minor})


def remove_device(adjustment: nri_pb2.ContainerAdjustment, path: str) -> None:
    """Drop the container's device node ``path``."""
    adjustment.linux.devices.add(path=_REMOVAL + path)


@dataclass(frozen=True, slots=True)
class OciHook:
    """A hook for ``add_hook``, as the OCI spec's: ``args`` include argv[0]; ``timeout``
    is in seconds."""

    path: str
    args: Iterable[str] = ()
    env: Iterable[str] = ()
    timeout: int | None = None


def add_hook(adjustment: nri_pb2.ContainerAdjustment, stage: str, hook: OciHook) -> None:
    """Run ``hook`` at ``stage`` (one of ``HOOK_STAGES``)."""
    if stage not in HOOK_STAGES:
        raise ValueError(f"hook stage {stage!r} is not one of {', '.join(HOOK_STAGES)}")
    _absolute("hook path", hook.path)
    getattr(adjustment.hooks, stage).add(
        path=hook.path, args=list(hook.args), env=list(hook.env),
        timeout=None if hook.timeout is None else {"value": hook.timeout})


def add_cdi_device(adjustment: nri_pb2.ContainerAdjustment, name: str) -> None:
    """Ask the runtime to inject CDI device ``name`` (``vendor/class=device``) itself.

    Only runtimes that resolve CDI act on this (containerd 2.1+ and 1.7.30+, CRI-O 1.34+);
    older ones ignore it silently: check ``nri_plugin.nri.versions.RuntimeInfo`` first.
    """
    kind, sep, device = name.partition("=")
    if not sep or "/" not in kind or not device:
        raise ValueError(f"CDI device {name!r}: want vendor/class=device")
    adjustment.CDI_devices.add(name=name)


def add_annotation(adjustment: nri_pb2.ContainerAdjustment, key: str, value: str) -> None:
    """Set container annotation ``key``."""
    adjustment.annotations[key] = value


def remove_annotation(adjustment: nri_pb2.ContainerAdjustment, key: str) -> None:
    """Drop container annotation ``key``."""
    adjustment.annotations[_REMOVAL + key] = ""


def _absolute(what: str, path: str) -> None:
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} is not absolute")
