"""The OCI state a runtime hands a hook on stdin, and the container root it leads to.

``{"bundle": DIR, ...}`` → ``DIR/config.json`` → ``root.path``, ``root.readonly``, the
``linux.devices`` paths and the mounts. Both documents are the container manager's on the
host: trusted, still read with a bound. Decoded by the C scanner ``json`` itself uses
(:func:`loads`): importing ``json`` compiles regular expressions, on every hook's start.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

_MAX_STATE = 1 << 20  # the state is a few hundred bytes; refuse to buffer a flood
_MAX_CONFIG = 64 << 20
_WHITESPACE = " \t\n\r"


class StateError(Exception):
    """The OCI state or the bundle's config cannot be used; says which and why."""


class ContainerRoot:
    """Where the container's root is, and what of its config the hook operations use."""

    __slots__ = ("container_id", "devices", "mounts", "path", "pid", "readonly")

    def __init__(self, *, path: str, readonly: bool, devices: frozenset[str] = frozenset(),
                 mounts: tuple[tuple[str, str, str, tuple[str, ...]], ...] = ()) -> None:
        self.path = path  # absolute host path of the root folder
        self.readonly = readonly  # root.readonly in config.json
        self.devices = devices  # container paths of linux.devices[].path
        self.mounts = mounts  # config.json mounts: (destination, type, source, options)
        # What the OCI state says besides the bundle, set where it is read
        self.pid = 0  # the container's init process, 0 when unknown
        self.container_id = ""


class _Context:
    """What the C scanner reads from a ``json.JSONDecoder``: plain JSON, strict strings."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity: accepted, as json.loads does


_SCAN: Any
try:
    import _json
except ImportError:  # another Python than CPython: the module is the fallback
    _SCAN = None
else:
    _SCAN = _json.make_scanner(_Context())  # type: ignore[arg-type]  # reads only those fields


def loads(text: str | bytes) -> Any:
    """``json.loads`` for a whole document (ValueError when it is not JSON)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # ValueError (UnicodeDecodeError) as json's would be
    if _SCAN is None:
        import json  # lazy: only off CPython (see above)

        return json.loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError(f"expecting a value at character {start}") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data at character {end}")
    return value


def root_from_config(bundle: str, config: Any) -> ContainerRoot:
    root = config.get("root") if isinstance(config, dict) else None
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(root, dict) or not isinstance(path, str) or not path:
        raise StateError(f"{bundle}/config.json has no root.path")
    return ContainerRoot(path=os.path.normpath(os.path.join(bundle, path)),
                         readonly=bool(root.get("readonly", False)), devices=_devices(config),
                         mounts=_mounts(config))


def _mounts(config: dict[str, Any]) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """``mounts`` of the config, as (destination, type, source, options); the hook asks
    them which mounts are the container's own (:mod:`cdi.hooks.mounts`)."""
    mounts = config.get("mounts")
    if not isinstance(mounts, list):
        return ()
    out = []
    for m in mounts:
        if not isinstance(m, dict) or not isinstance(m.get("destination"), str):
            continue
        options = m.get("options")
        out.append((m["destination"], str(m.get("type") or ""), str(m.get("source") or ""),
                    tuple(o for o in options if isinstance(o, str))
                    if isinstance(options, list) else ()))
    return tuple(out)


def _devices(config: dict[str, Any]) -> frozenset[str]:
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(devices, list):
        return frozenset()
    return frozenset(d["path"] for d in devices
                     if isinstance(d, dict) and isinstance(d.get("path"), str))


def read_state(stream: IO[bytes]) -> ContainerRoot:
    data = stream.read(_MAX_STATE + 1)
    if len(data) > _MAX_STATE:
        raise StateError(f"OCI state on stdin is larger than {_MAX_STATE} bytes")
    try:
        state = loads(data)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"OCI state on stdin is not JSON: {exc}") from None
    bundle = state.get("bundle") if isinstance(state, dict) else None
    if not isinstance(bundle, str) or not os.path.isabs(bundle):
        raise StateError("OCI state on stdin has no absolute 'bundle' path")
    config_path = os.path.join(bundle, "config.json")
    try:
        with open(config_path, "rb") as f:
            config = loads(f.read(_MAX_CONFIG))
    except OSError as exc:
        raise StateError(f"{config_path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{config_path}: not JSON: {exc}") from None
    container = root_from_config(bundle, config)
    container.container_id = str(state.get("id", ""))
    pid = state.get("pid")
    container.pid = pid if type(pid) is int and pid > 0 else 0
    return container
