"""Reading the runtime's own CDI set-up (containerd's config.toml) for the plugin.

Done once when the plugin starts (never on the request path). ``runtime_cdi.enabled`` and
``runtime_cdi.spec_dirs`` in the plugin's settings win over the file; a missing file means
containerd's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nri_plugin.ops.containerd_config import CRI_V2_SECTION, CRI_V3_SECTION, read_containerd_config
from nri_plugin.plugins.cdi_injector.delegation import LIBRARY_DEFAULT_DIRS, RuntimeCdiConfig

if TYPE_CHECKING:
    from nri_plugin.ops.settings import Settings


def cri_cdi_settings(data: Mapping[str, Any] | None) -> tuple[bool | None, tuple[str, ...]]:
    """(enable_cdi or None when unset, cdi_spec_dirs or the defaults) of a parsed
    containerd config (None: no file)."""
    if not data:
        return None, LIBRARY_DEFAULT_DIRS
    name = CRI_V3_SECTION if data.get("version") == 3 else CRI_V2_SECTION
    plugins = data.get("plugins", {})
    section = plugins.get(name, {}) if isinstance(plugins, Mapping) else {}
    if not isinstance(section, Mapping):
        section = {}
    enabled = section.get("enable_cdi")
    dirs = section.get("cdi_spec_dirs")
    return (bool(enabled) if isinstance(enabled, bool) else None,
            tuple(str(d) for d in dirs) if isinstance(dirs, list) and dirs
            else LIBRARY_DEFAULT_DIRS)


def runtime_cdi_config(settings: Settings) -> RuntimeCdiConfig:
    path = settings.runtime_cdi.containerd_config
    wanted = settings.runtime_cdi
    cfg = read_containerd_config(path, None)
    enabled, dirs = cri_cdi_settings(cfg.data)
    why = f"unreadable: {cfg.error}" if cfg.error else "absent"
    origin = path if cfg.data is not None else f"containerd's defaults: {path} {why}"
    if wanted.enabled != "auto":
        enabled = wanted.enabled == "on"
        origin += "; runtime_cdi.enabled set"
    if wanted.spec_dirs is not None:
        dirs = tuple(wanted.spec_dirs)
        origin += "; runtime_cdi.spec_dirs set"
    return RuntimeCdiConfig(enabled=enabled, spec_dirs=dirs, origin=origin)
