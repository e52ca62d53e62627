"""The OCI state a runtime hands a hook on stdin, and the container root it leads to.

``{"bundle": DIR, ...}`` → ``DIR/config.json`` → ``root.path`` (relative to the bundle when
not absolute) and ``root.readonly``.  The bundle and its config are written by the container
manager on the host, so they are trusted; only what lies *inside* the root is not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["ContainerRoot", "StateError", "parse_state", "read_state", "root_from_config"]

_MAX_STATE = 1 << 20  # the state is a few hundred bytes; refuse to buffer a flood
_MAX_CONFIG = 64 << 20


class StateError(Exception):
    """The OCI state or the bundle's config cannot be used; says which and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRoot:
    container_id: str
    bundle: str
    path: str  # absolute host path of the root folder
    readonly: bool  # root.readonly in config.json


def parse_state(text: str | bytes) -> str:
    """The absolute bundle folder named by an OCI state document."""
    try:
        state: Any = json.loads(text)
    except ValueError as exc:
        raise StateError(f"OCI state on stdin is not JSON: {exc}") from None
    bundle = state.get("bundle") if isinstance(state, dict) else None
    if not isinstance(bundle, str) or not os.path.isabs(bundle):
        raise StateError("OCI state on stdin has no absolute 'bundle' path")
    return bundle


def root_from_config(bundle: str, config: Any, *, container_id: str = "") -> ContainerRoot:
    root = config.get("root") if isinstance(config, dict) else None
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise StateError(f"{bundle}/config.json has no root.path")
    readonly = bool(root.get("readonly", False)) if isinstance(root, dict) else False
    return ContainerRoot(container_id=container_id, bundle=bundle,
                         path=os.path.normpath(os.path.join(bundle, path)), readonly=readonly)


def read_state(stream: IO[bytes]) -> ContainerRoot:
    data = stream.read(_MAX_STATE + 1)
    if len(data) > _MAX_STATE:
        raise StateError(f"OCI state on stdin is larger than {_MAX_STATE} bytes")
    bundle = parse_state(data)
    container_id = json.loads(data).get("id", "")
    config_path = os.path.join(bundle, "config.json")
    try:
        with open(config_path, "rb") as f:
            config = json.loads(f.read(_MAX_CONFIG))
    except OSError as exc:
        raise StateError(f"{config_path}: {exc.strerror}") from None
    except ValueError as exc:
        raise StateError(f"{config_path}: not JSON: {exc}") from None
    return root_from_config(bundle, config, container_id=str(container_id))
