"""containerd's own configuration file (config.toml), read once: by ``nri-cdi doctor`` and
by the plugin at start-up (``runtime_cdi``), never on the request path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10: no TOML parser in the standard library
    tomllib = None  # type: ignore[assignment]

CRI_V2_SECTION = "io.containerd.grpc.v1.cri"  # containerd 1.7 (config version 2)
CRI_V3_SECTION = "io.containerd.cri.v1.runtime"  # containerd 2.x (config version 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerdConfig:
    path: str
    data: Mapping[str, Any] | None  # None: no file (containerd's defaults apply)
    major: int | None  # containerd major version, when known
    error: str | None = None

    def plugin(self, name: str) -> Mapping[str, Any]:
        plugins = (self.data or {}).get("plugins", {})
        section = plugins.get(name, {}) if isinstance(plugins, Mapping) else {}
        return section if isinstance(section, Mapping) else {}

    @property
    def v2_defaults(self) -> bool:
        """True when defaults are containerd 2.x's (NRI on, CDI on)."""
        if self.major is not None:
            return self.major >= 2
        return bool(self.data and self.data.get("version") == 3)


def read_containerd_config(path: str, major: int | None) -> ContainerdConfig:
    if tomllib is None:
        return ContainerdConfig(path=path, data=None, major=major,
                                error="no TOML parser (Python 3.11+ has tomllib)")
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return ContainerdConfig(path=path, data=None, major=major)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return ContainerdConfig(path=path, data=None, major=major, error=str(exc))
    return ContainerdConfig(path=path, data=data, major=major)
