"""Optional dependencies: what each feature needs, and the one-line error when it is missing.

The core (CDI library, generator in procfs mode, hooks, NRI plugin) needs only PyYAML,
protobuf and inotify_simple. Heavier packages that only some users need are extras of the
``nri-cdi`` distribution; ``pip install 'nri-cdi[test]'`` pulls all of them.
"""

from __future__ import annotations

# importable module -> (extra, distribution on PyPI); a vendor's extras are passed by the
# vendor's code (``extra=``), so this table names none.
EXTRAS: dict[str, tuple[str, str]] = {
    "prometheus_client": ("metrics", "prometheus-client"),
    "jsonschema": ("schema", "jsonschema"),
    "grpc": ("e2e", "grpcio"),  # nri-cdi doctor --e2e (a CRI client)
}


class MissingDependencyError(ImportError):
    """A feature was used whose optional dependency is not installed."""

    def __init__(self, module: str, feature: str,
                 extra: tuple[str, str] | None = None) -> None:
        name, distribution = extra or EXTRAS[module]
        super().__init__(f"{feature} needs {distribution}, which is not installed: "
                         f"pip install 'nri-cdi[{name}]'", name=module)
