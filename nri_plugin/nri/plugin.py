"""The ``Plugin`` base class: one plain method per NRI request, each a no-op.

Subclass it and override what you need: an overridden lifecycle method is what subscribes
the plugin to that event (docs/developer/writing-a-plugin.md). Handlers run inline on the
event loop and must be fast and free of I/O; raising fails that one request (an
``RpcError`` picks the code, anything else is UNKNOWN, as in Go).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nri_plugin.nri.api import EventMask, nri_pb2

PodSandbox = nri_pb2.PodSandbox
Container = nri_pb2.Container
ContainerAdjustment = nri_pb2.ContainerAdjustment
ContainerUpdate = nri_pb2.ContainerUpdate
CreateContainerResponse = nri_pb2.CreateContainerResponse
LinuxResources = nri_pb2.LinuxResources

Updates = Iterable[ContainerUpdate] | None


class Plugin:
    """Base class for NRI plugins. Every method is optional."""

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> EventMask | None:
        """Once per connection, with the runtime's config string: return a mask to subscribe
        to fewer events than implemented (a bit without a handler is an error), or ``None``
        for all (docs/developer/nri-protocol.md §3.4)."""
        return None

    def synchronize(self, pods: Sequence[PodSandbox], containers: Sequence[Container]) -> Updates:
        """The runtime's existing pods and containers, once per connection, pages joined
        (docs/developer/nri-protocol.md §3.5)."""
        return None

    def shutdown(self) -> None:
        """The runtime asked us to shut down (no released runtime sends this,
        docs/developer/nri-protocol.md §3.6)."""

    def run_pod_sandbox(self, pod: PodSandbox) -> None:
        """A pod sandbox was started."""

    def stop_pod_sandbox(self, pod: PodSandbox) -> None:
        """A pod sandbox was stopped."""

    def remove_pod_sandbox(self, pod: PodSandbox) -> None:
        """A pod sandbox was removed."""

    def update_pod_sandbox(
        self, pod: PodSandbox, overhead: LinuxResources, resources: LinuxResources
    ) -> None:
        """A pod's resources are being updated (NRI v0.10+, containerd 2.3+)."""

    def post_update_pod_sandbox(self, pod: PodSandbox) -> None:
        """A pod's resources were updated (NRI v0.10+)."""

    def create_container(
        self, pod: PodSandbox, container: Container
    ) -> ContainerAdjustment | CreateContainerResponse | None:
        """A container is being created: return changes to make to it, or ``None``.

        Return a ``CreateContainerResponse`` to also update other containers.
        """
        return None

    def post_create_container(self, pod: PodSandbox, container: Container) -> None:
        """A container was created."""

    def start_container(self, pod: PodSandbox, container: Container) -> None:
        """A container is being started; raising fails the start (docs/developer/nri-protocol.md
        §6)."""

    def post_start_container(self, pod: PodSandbox, container: Container) -> None:
        """A container was started."""

    def update_container(
        self, pod: PodSandbox, container: Container, resources: LinuxResources
    ) -> Updates:
        """A container's resources are being updated; return updates to apply."""
        return None

    def post_update_container(self, pod: PodSandbox, container: Container) -> None:
        """A container's resources were updated."""

    def stop_container(self, pod: PodSandbox, container: Container) -> Updates:
        """A container is being stopped; return updates for other containers."""
        return None

    def remove_container(self, pod: PodSandbox, container: Container) -> None:
        """A container was removed."""
