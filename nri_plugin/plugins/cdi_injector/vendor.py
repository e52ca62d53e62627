"""The one interface between the vendor-neutral injector and a vendor's rules.

The injector knows CDI: annotations, the registry, the policy, adjustments. What a vendor
adds on top (NVIDIA: ``NVIDIA_VISIBLE_DEVICES``, ``NVIDIA_REQUIRE_*``,
``NVIDIA_DRIVER_CAPABILITIES``, the facts its generator records beside a spec) comes in
through a ``VendorRules`` object handed to the injector by whoever wires the plugin
(``nri_plugin.ops.daemon``). With no vendor rules the injector serves any CDI vendor's
specs as the CDI convention says, and nothing else.

``Registry`` is what the injector reads on the CreateContainer path: a registry snapshot
and every vendor's facts for that very snapshot, built together in the refresher's thread
and swapped in with one assignment, so a container never sees new specs with old facts.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from cdi.cache import Snapshot
from cdi.model import ContainerEdits

if TYPE_CHECKING:
    from nri_plugin.plugins.cdi_injector.policy import Policy
    from nri_plugin.plugins.cdi_injector.requests import DeviceRequest


class EditFilter(Protocol):
    """Drops parts of the resolved edits a container did not ask for (pure)."""

    @property
    def cache_key(self) -> Hashable:
        """Equal keys filter equally (the injector caches plans by it)."""

    def apply(self, edits: ContainerEdits) -> ContainerEdits: ...


class VendorRules(Protocol):
    """A vendor's rules. Every method but ``load_facts`` is pure and must not do I/O: it
    runs on the CreateContainer path. Refusals are raised as ``nri_plugin.errors.Refusal``.
    """

    name: str
    # The policy request source (``Policy.sources`` key) that env requests fall under.
    env_source: str
    # Env entry prefixes ("NAME=") that may ask for devices: a cheap pre-filter for
    # fail-closed, which looks at every container of the node.
    env_request_prefixes: tuple[str, ...]
    # Env variables whose presence makes ``check``'s filter apply to the devices the
    # runtime's own CDI injected too (NVIDIA: NVIDIA_DRIVER_CAPABILITIES); without them
    # those devices keep the runtime's full edits, as its native CDI gave them.
    filter_env: tuple[str, ...]

    def load_facts(self, snapshot: Snapshot) -> object:
        """What the vendor needs to know about ``snapshot``'s specs (may do file I/O; runs in
        the refresher's thread). The result is handed back to the other methods."""

    def env_requests(self, env: Mapping[str, str], snapshot: Snapshot,
                     facts: object) -> list[DeviceRequest]:
        """Devices asked for through the container's environment (none: empty)."""

    def other_requests(self, *, pod_annotations: Mapping[str, str], container_name: str,
                       mounts: Sequence[tuple[str, str]], snapshot: Snapshot,
                       facts: object) -> list[tuple[str, list[DeviceRequest]]]:
        """Devices asked for by the vendor's other ways (NVIDIA: its NRI plugin's pod
        annotations, the device plugin's volume mounts; ``mounts`` are the container's
        (destination, source) pairs), as (policy source, requests) pairs. Like annotations, a source
        the policy does not allow here is a refusal."""

    def asks_extras(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` may ask for edits that belong to no device (NVIDIA: the driver
        without a GPU, MIG management and IMEX channel nodes); cheap, for the no-request
        path. ``check`` then returns a filter that adds them."""

    def decision_key(self, env: Mapping[str, str]) -> Hashable:
        """The part of ``env`` that ``check`` reads, hashable (for the decision cache)."""

    def check(self, policy: Policy, names: Sequence[str], env: Mapping[str, str],
              snapshot: Snapshot, facts: object, *, namespace: str = "",
              privileged: bool = False) -> EditFilter | None:
        """Refuse (raise Refusal) what the vendor's rules forbid for these devices, and
        return the filter for the edits (None: keep all). A filter may also add edits of
        no device (see ``asks_extras``)."""


class Registry(NamedTuple):
    """A registry snapshot and each vendor's facts for it (same order as the vendors)."""

    snapshot: Snapshot
    facts: tuple[object, ...] = ()

    def paired(self, vendors: Sequence[VendorRules]) -> list[tuple[VendorRules, object]]:
        """(vendor, its facts) for each vendor; None for a vendor with no facts loaded."""
        facts = self.facts + (None,) * (len(vendors) - len(self.facts))
        return list(zip(vendors, facts[:len(vendors)], strict=True))

    @classmethod
    def load(cls, snapshot: Snapshot, vendors: Sequence[VendorRules]) -> Registry:
        """The registry for ``snapshot`` with every vendor's facts loaded (I/O)."""
        return cls(snapshot, tuple(v.load_facts(snapshot) for v in vendors))


class RegistryHolder:
    """The current Registry, replaced whole by the refresher (one attribute assignment,
    atomic for readers on other threads)."""

    def __init__(self, vendors: Sequence[VendorRules], snapshot: Snapshot | None = None) -> None:
        self.vendors = tuple(vendors)
        self.current = Registry(snapshot or Snapshot(), tuple(None for _ in self.vendors))

    def get(self) -> Registry:
        return self.current

    def update(self, snapshot: Snapshot) -> Registry:
        """Load the vendors' facts for ``snapshot`` and swap both in together."""
        registry = Registry.load(snapshot, self.vendors)
        self.current = registry
        return registry
