"""The one interface between the vendor-neutral injector and a vendor's rules
(``VendorRules``), and ``Registry``: a registry snapshot and every vendor's facts for that
very snapshot, built together and swapped in with one assignment. With no vendor rules the
injector serves any CDI vendor's specs as the CDI convention says.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple, Protocol

from cdi.cache import Snapshot
from cdi.model import ContainerEdits
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource
from nri_plugin.plugins.cdi_injector.policy import Policy


class EditFilter(Protocol):
    """Drops parts of the resolved edits a container did not ask for, or adds edits of no
    device it asked for (pure)."""

    @property
    def cache_key(self) -> Hashable:
        """Equal keys filter equally, for the same registry and devices (the plan cache's
        key holds those)."""

    def apply(self, edits: ContainerEdits) -> ContainerEdits: ...


class VendorRules(Protocol):
    """A vendor's rules. ``verdict`` and the sources' readers are pure and do no I/O: they
    run on the CreateContainer path."""

    name: str
    sources: tuple[RequestSource, ...]
    # Device patterns denied in every namespace by the built-in policy.
    default_denials: tuple[str, ...]
    # The hook operations the verdict may add to a container (for the log and docs).
    hooks: tuple[str, ...]
    # Pod or container annotation key prefixes that may ask for devices, and env entry
    # prefixes ("NAME="): a cheap pre-filter for fail-closed, which looks at every
    # container of the node.
    annotation_prefixes: tuple[str, ...]
    env_request_prefixes: tuple[str, ...]
    # Prefixes of the env names the verdict reads: the context's env holds only the names
    # these declarations cover.
    verdict_env: tuple[str, ...]
    # Env names whose non-empty value may ask for edits of no device: a container that
    # asks for no device is only handed to the verdict when one is set.
    extras_env: tuple[str, ...]
    # Env variables whose presence makes the verdict's filter apply to the devices the
    # runtime's own CDI injected too (e.g. a driver-capabilities variable); without them
    # those devices keep the runtime's full edits, as its native CDI gave them.
    filter_env: tuple[str, ...]

    def load_facts(self, snapshot: Snapshot) -> object:
        """What the vendor needs to know about ``snapshot``'s specs, handed back to
        ``verdict`` and the readers (may do file I/O; runs in the refresher's thread)."""

    def verdict(self, context: ContainerContext, names: Sequence[str], policy: Policy,
                snapshot: Snapshot, facts: object) -> EditFilter | None:
        """The vendor's one word on a container that asks for ``names``: raise a Refusal
        for what its rules forbid, else return the filter for the edits (None: keep all),
        which may also add edits of no device (``extras_env``)."""

    def device_units(self, name: str, snapshot: Snapshot, facts: object) -> frozenset[str]:
        """The hardware a CDI device covers, as units ``allocations`` compares (paths: a
        unit under another shares its hardware, as a MIG device its GPU); empty: none the
        vendor knows."""

    def allocated_units(self, resource: str, device_id: str, snapshot: Snapshot,
                        facts: object) -> frozenset[str]:
        """The units of one device id a device plugin of ``resource`` allocated; empty:
        not the vendor's resource."""


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
    """The current Registry, replaced whole by the refresher (one assignment, atomic for
    readers on other threads)."""

    def __init__(self, vendors: Sequence[VendorRules]) -> None:
        self.vendors = tuple(vendors)
        self.current = Registry(Snapshot())  # no facts: None for each vendor

    def get(self) -> Registry:
        return self.current

    def update(self, snapshot: Snapshot) -> Registry:
        """Load the vendors' facts for ``snapshot`` and swap both in together."""
        self.current = Registry.load(snapshot, self.vendors)
        return self.current
