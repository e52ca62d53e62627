"""From a ttrpc request on the Plugin service to a ``Plugin`` method and back. Pure: bytes in,
bytes out, so it runs without sockets or an event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from nri_plugin.nri.api import (
    LEGACY_VALID_EVENTS,
    PLUGIN_SERVICE,
    VALID_EVENTS,
    Event,
    EventMask,
    nri_pb2,
)
from nri_plugin.nri.crio import fill_name
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.wire import Code, bound_message

log = logging.getLogger(__name__)

_EMPTY = b""  # nri_pb2.Empty() serializes to nothing


class RpcError(NRIPluginError):
    """Raise from a handler to answer its request with this status code.

    The message is bounded (``bound_message``: long lists summarized, then cut at
    2048 characters): it travels in one ttrpc frame and ends up in CRI clients and logs.
    """

    def __init__(self, code: Code, message: str) -> None:
        message = bound_message(message)
        super().__init__(message)
        self.code = code
        self.message = message


# Which Plugin method handles each lifecycle event: the event's name in lower case
# (docs/developer/nri-protocol.md §3.4 table). Validation (event 14) is not supported: we
# never subscribe to it.
EVENT_HANDLERS: dict[Event, str] = {
    e: e.name.lower() for e in Event if e is not Event.VALIDATE_CONTAINER_ADJUSTMENT
}
# Each event's own RPC (RUN_POD_SANDBOX: RunPodSandbox), as NRI v0.12 names them.
_EVENT_OF_RPC: dict[str, Event] = {
    "".join(word.capitalize() for word in e.name.split("_")): e for e in EVENT_HANDLERS
}


def implemented(plugin: Plugin, name: str) -> bool:
    """A handler counts as implemented when the plugin's class overrides it."""
    return getattr(type(plugin), name) is not getattr(Plugin, name)


def implemented_events(plugin: Plugin) -> EventMask:
    return EventMask.of(e for e, name in EVENT_HANDLERS.items() if implemented(plugin, name))


def subscription(
    plugin: Plugin, requested: EventMask | None = None, *, valid: EventMask = LEGACY_VALID_EVENTS
) -> EventMask:
    """The mask to send in ConfigureResponse: never 0, never a bit outside ``valid``.

    0 would subscribe us to everything, validation included, and a bit the
    runtime does not know makes it drop us (docs/developer/nri-protocol.md §3.4).
    """
    have = implemented_events(plugin)
    mask = have if requested is None else EventMask(requested)
    if mask & ~have:
        raise RpcError(
            Code.INVALID_ARGUMENT, f"subscription to events without a handler: {mask & ~have!r}"
        )
    mask &= valid
    if not mask:
        raise RpcError(
            Code.FAILED_PRECONDITION,
            f"none of the implemented events {have!r} is supported by this runtime",
        )
    return mask


def _call(plugin: Plugin, event: Event, req: Any) -> Message:
    """Call the plugin's handler for ``event`` with what ``req`` carries; the reply."""
    if event is Event.CREATE_CONTAINER:
        result = plugin.create_container(req.pod, req.container)
        if isinstance(result, nri_pb2.ContainerAdjustment):
            return nri_pb2.CreateContainerResponse(adjust=result)
        return nri_pb2.CreateContainerResponse() if result is None else result
    if event is Event.UPDATE_CONTAINER:
        updates = plugin.update_container(req.pod, req.container, req.linux_resources)
        return nri_pb2.UpdateContainerResponse(update=list(updates or ()))
    if event is Event.STOP_CONTAINER:
        updates = plugin.stop_container(req.pod, req.container)
        return nri_pb2.StopContainerResponse(update=list(updates or ()))
    # The rest are notifications: nothing to return.
    handler = getattr(plugin, EVENT_HANDLERS[event])
    if event is Event.UPDATE_POD_SANDBOX:
        handler(req.pod, req.overhead_linux_resources, req.linux_resources)
    elif event.name.endswith("_POD_SANDBOX"):
        handler(req.pod)
    else:
        handler(req.pod, req.container)
    return nri_pb2.Empty()


def _state_change_event(req: nri_pb2.StateChangeEvent) -> Event:
    # Pre-v0.12 runtimes deliver the nine notifications here (docs/developer/nri-protocol.md §3.6).
    try:
        event = Event(req.event)
    except ValueError:
        raise RpcError(Code.INVALID_ARGUMENT, f"unknown event {req.event}") from None
    if event not in EVENT_HANDLERS or event is Event.UPDATE_POD_SANDBOX:
        raise RpcError(Code.INVALID_ARGUMENT, f"event {event.name} is not a state change")
    if event in (Event.CREATE_CONTAINER, Event.UPDATE_CONTAINER, Event.STOP_CONTAINER):
        raise RpcError(Code.INVALID_ARGUMENT, f"event {event.name} has its own RPC")
    return event


# Every method of the Plugin service, with the request message it decodes; Configure,
# Synchronize and Shutdown carry connection state and the Dispatcher handles them itself.
_REQUESTS: dict[str, type[Message]] = {
    m.name: GetMessageClass(m.input_type)
    for m in nri_pb2.DESCRIPTOR.services_by_name["Plugin"].methods
}
METHODS: frozenset[str] = frozenset(_REQUESTS)


SERVICES: dict[str, frozenset[str]] = {PLUGIN_SERVICE: METHODS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """What the runtime told us in Configure (docs/developer/nri-protocol.md §3.4); timeouts in
    milliseconds."""

    config: str
    runtime_name: str
    runtime_version: str
    nri_version: str  # "" before NRI v0.12.0
    request_timeout_ms: int
    events: EventMask

    # pkg/api/timeouts.go default (docs/developer/nri-protocol.md §6)
    DEFAULT_REQUEST_TIMEOUT_MS = 2000

    @property
    def request_timeout(self) -> float:
        """Seconds the runtime waits for each reply."""
        return (self.request_timeout_ms or self.DEFAULT_REQUEST_TIMEOUT_MS) / 1000


SYNC_STALLED = (
    "Synchronize cannot complete: after {pods} pods and {containers} containers the runtime "
    "sent a page with nothing in it and more=true. NRI 0.7+ (containerd 1.7.26+ and 2.x) "
    "cannot split a Synchronize when one pod or container alone is over 4 MiB (huge "
    "annotations or labels): it sends such empty pages until its request timeout and then "
    "drops the plugin, on every reconnect. The page is refused at once and reconnects back "
    "off; the fix is to shrink or remove that pod (NRI 0.7 to 0.12 all page this way)")


# Synchronize pages kept until the last arrives (docs/developer/nri-protocol.md §3.5): four
# full pages, thousands of containers; pages beyond it are answered but only counted.
SYNC_MAX_BYTES = 16 << 20


class Dispatcher:
    """Per-connection dispatch state: the Configure result and Synchronize pages."""

    def __init__(self, plugin: Plugin) -> None:
        if not implemented_events(plugin):
            raise ValueError(f"{type(plugin).__name__} implements no event handler")
        self.plugin = plugin
        self.configuration: Configuration | None = None
        # A whole Synchronize was answered: the stub then reconnects at once after the
        # runtime goes away, without back-off.
        self.synchronized = False
        # This Synchronize's pages so far: those kept (and their bytes), and the sizes of
        # those over SYNC_MAX_BYTES.
        self._kept: list[nri_pb2.SynchronizeRequest] = []
        self._kept_bytes = 0
        self._dropped: list[int] = []

    def dispatch(self, method: str, payload: bytes) -> bytes:
        """Handle one Plugin-service request; return the serialized reply.

        Raises ``RpcError`` for an error status. A handler's exception fails
        only this request; the caller keeps serving others.
        """
        try:
            return self._dispatch(method, payload)
        except RpcError:
            raise
        except DecodeError as exc:
            raise RpcError(Code.INVALID_ARGUMENT, f"{method}: undecodable request") from exc
        except Exception as exc:
            # Go maps a plain error to UNKNOWN (docs/developer/nri-protocol.md §1.4); the runtime
            # then fails the operation (CreateContainer, StartContainer) or just logs it
            # (docs/developer/nri-protocol.md §6).
            log.exception("%s handler failed", method)
            raise RpcError(Code.UNKNOWN, f"{method}: {type(exc).__name__}: {exc}") from exc

    def _dispatch(self, method: str, payload: bytes) -> bytes:
        if method == "Configure":
            return self._configure(nri_pb2.ConfigureRequest.FromString(payload))
        if method == "Synchronize":
            return self._synchronize(nri_pb2.SynchronizeRequest.FromString(payload), len(payload))
        if method == "Shutdown":
            self.plugin.shutdown()
            return _EMPTY
        request_type = _REQUESTS.get(method)
        if request_type is None:
            raise RpcError(Code.UNIMPLEMENTED, f"method {method}")
        request: Any = request_type.FromString(payload)
        if "container" in request.DESCRIPTOR.fields_by_name:
            fill_name(request.container)
        event = (_state_change_event(request) if method == "StateChange"
                 else _EVENT_OF_RPC[method])
        if not implemented(self.plugin, EVENT_HANDLERS[event]):
            # Go stub behaviour: a missing handler is an empty reply, not an error.
            return _EMPTY
        return _call(self.plugin, event, request).SerializeToString()

    def _configure(self, req: nri_pb2.ConfigureRequest) -> bytes:
        requested = self.plugin.configure(req.config, req.runtime_name, req.runtime_version)
        # NRI_version is only sent from v0.12.0, whose runtimes accept events 12-14;
        # without it we must assume containerd 1.7-2.1 (ValidEvents 0x7FF,
        # docs/developer/nri-protocol.md §3.4).
        valid = VALID_EVENTS if req.NRI_version else LEGACY_VALID_EVENTS
        mask = subscription(self.plugin, requested, valid=valid)
        self.configuration = Configuration(
            config=req.config,
            runtime_name=req.runtime_name,
            runtime_version=req.runtime_version,
            nri_version=req.NRI_version,
            request_timeout_ms=req.request_timeout,
            events=mask,
        )
        return nri_pb2.ConfigureResponse(events=int(mask)).SerializeToString()

    def _synchronize(self, req: nri_pb2.SynchronizeRequest, size: int = 0) -> bytes:
        if req.more and not req.pods and not req.containers:
            # The runtime's pager advanced by zero objects (one over 4 MiB rounds its
            # objects per page down to 0): it would send this page until its timeout.
            stalled = SYNC_STALLED.format(pods=sum(len(p.pods) for p in self._kept),
                                          containers=sum(len(p.containers) for p in self._kept))
            self._kept, self._kept_bytes, self._dropped = [], 0, []
            log.error("%s", stalled)
            # An error reply makes the runtime give up at once (not a size error, so it does
            # not retry smaller) instead of 2 s of empty pages holding its lock.
            raise RpcError(Code.FAILED_PRECONDITION, stalled)
        if self._kept_bytes + size > SYNC_MAX_BYTES:
            self._dropped.append(size)
        else:
            self._kept_bytes += size
            self._kept.append(req)
        if req.more:
            # Every page but the last must be answered more=true and no updates
            # (docs/developer/nri-protocol.md §3.5).
            return nri_pb2.SynchronizeResponse(more=True).SerializeToString()
        pods = [pod for page in self._kept for pod in page.pods]
        containers = [container for page in self._kept for container in page.containers]
        for container in containers:
            fill_name(container)
        if self._dropped:
            log.error("Synchronize: %d of %d pages (%d bytes) were over the %d MiB cap and "
                      "were not examined; their containers are checked only when they start",
                      len(self._dropped), len(self._kept) + len(self._dropped),
                      sum(self._dropped), SYNC_MAX_BYTES >> 20)
        self._kept, self._kept_bytes, self._dropped = [], 0, []
        updates = self.plugin.synchronize(pods, containers)
        self.synchronized = True
        return nri_pb2.SynchronizeResponse(update=list(updates or ())).SerializeToString()
