"""The asyncio shell around the sans-IO core: socket, lifecycle, reconnects.

``Stub`` connects (inherited fd from the runtime, or the NRI socket), registers,
serves the Plugin service until the connection ends, and calls ``on_close``.
Requests are dispatched inline in ``data_received``: handlers are plain,
I/O-free functions, so a reply leaves in the same loop iteration its request
arrived in, far inside the runtime's request timeout (docs/nri-protocol.md §6).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from nri_plugin.api import RUNTIME_SERVICE, nri_pb2
from nri_plugin.dispatch import SERVICES, Configuration, Dispatcher, RpcError, SyncStalledError
from nri_plugin.plugin import Plugin
from nri_plugin.wire import (
    Code,
    Connection,
    ConnectionClosed,
    MessageTooLargeError,
    ProtocolError,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
)

DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"  # NRI v0.3.0+ (§3.1)
DEFAULT_REGISTRATION_TIMEOUT = 5.0  # runtime default (§3.2); we wait no longer
# Warn when a handler uses more than this share of the runtime's request timeout.
SLOW_HANDLER_SHARE = 0.25

Callback = Callable[["Stub"], Awaitable[None] | None]
CloseCallback = Callable[["Stub", BaseException | None], Awaitable[None] | None]

_NAME_WITH_INDEX = re.compile(r"^(\d\d)-(.+)$")


class RegistrationError(Exception):
    """The runtime refused RegisterPlugin, or did not answer in time."""


def plugin_identity(
    name: str | None, idx: str | None, env: Mapping[str, str], argv0: str
) -> tuple[str, str]:
    """Name and index: arguments, then NRI_PLUGIN_NAME/IDX, then ``NN-name`` argv[0].

    NRI v0.3.0 (containerd 1.7.0-1.7.6) passes the full ``NN-name`` as the
    name (§3.1), so a leading ``NN-`` is stripped whatever the source.
    """
    base = os.path.basename(argv0)
    from_argv = _NAME_WITH_INDEX.match(base)
    name = name or env.get("NRI_PLUGIN_NAME") or (from_argv.group(2) if from_argv else base)
    if (m := _NAME_WITH_INDEX.match(name)) is not None:
        name = m.group(2)
        idx = idx or env.get("NRI_PLUGIN_IDX") or m.group(1)
    idx = idx or env.get("NRI_PLUGIN_IDX") or (from_argv.group(1) if from_argv else "")
    if not name:
        raise ValueError("plugin name is empty")
    if not re.fullmatch(r"\d\d", idx):
        raise ValueError(f"plugin index must be two digits, got {idx!r}")
    return name, idx


async def _maybe_await(result: Awaitable[None] | None) -> None:
    if inspect.isawaitable(result):
        await result


class _Session(asyncio.Protocol):
    """One connection: feeds ``Connection``, runs handlers, resolves our calls."""

    def __init__(self, plugin: Plugin, log: logging.Logger) -> None:
        self.log = log
        self.conn = Connection(services=SERVICES, logger=log)
        self.dispatcher = Dispatcher(plugin)
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, asyncio.Future[ResponseReceived]] = {}
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.shutdown_requested = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._feed(data)

    def eof_received(self) -> bool:
        self._feed(b"")
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    # --- the driver ---

    def _feed(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except ProtocolError as exc:
            self.log.error("protocol error, dropping the connection: %s", exc)
            self._abort(exc)
            return
        for event in events:
            if isinstance(event, RequestReceived):
                self._serve(event)
            elif isinstance(event, ResponseReceived):
                future = self.calls.pop(event.stream_id, None)
                if future is not None and not future.done():
                    future.set_result(event)
            elif isinstance(event, RequestRejected):
                self.log.warning("rejected %s/%s: %s", event.service, event.method, event.message)
            elif isinstance(event, ConnectionClosed):
                self._finish(None)
        self.flush()
        if self.shutdown_requested and self.transport is not None:
            self.transport.close()

    def _serve(self, event: RequestReceived) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            payload = self.dispatcher.dispatch(event.method, event.payload)
            try:
                self.conn.send_response(event.stream_id, payload)
            except MessageTooLargeError as exc:
                self.conn.send_response(
                    event.stream_id, code=Code.RESOURCE_EXHAUSTED, message=str(exc)
                )
        except RpcError as err:
            if not isinstance(err, SyncStalledError):  # the dispatcher logged it in full
                self.log.warning("%s failed: %s", event.method, err.message)
            self.conn.send_response(event.stream_id, code=err.code, message=err.message)
        if event.method == "Shutdown":
            self.shutdown_requested = True
        self._check_latency(event, loop.time() - started)

    def _check_latency(self, event: RequestReceived, elapsed: float) -> None:
        conf = self.dispatcher.configuration
        budget = conf.request_timeout if conf else Configuration.DEFAULT_REQUEST_TIMEOUT_MS / 1000
        if event.timeout_nano:
            budget = min(budget, event.timeout_nano / 1e9)
        if elapsed > budget * SLOW_HANDLER_SHARE:
            self.log.warning(
                "%s took %.0f ms of a %.0f ms budget", event.method, elapsed * 1e3, budget * 1e3
            )

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def call(self, method: str, request: Any, timeout: float | None) -> ResponseReceived:
        stream_id = self.conn.send_request(RUNTIME_SERVICE, method, request.SerializeToString())
        future: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
        self.calls[stream_id] = future
        self.flush()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            self.calls.pop(stream_id, None)

    def _abort(self, exc: BaseException) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        for future in self.calls.values():
            if not future.done():
                future.set_exception(ConnectionError("NRI connection closed"))
        self.calls.clear()
        if not self.closed.done():
            self.closed.set_result(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Stub:
    """Runs a ``Plugin`` against a container runtime over NRI.

    Connection source, in order: ``sock``; the fd in NRI_PLUGIN_SOCKET (we were
    launched by the runtime: no reconnects, ``run()`` returns on disconnect);
    else ``socket_path`` (external plugin: reconnect with capped exponential
    backoff until ``stop()``).
    """

    def __init__(
        self,
        plugin: Plugin,
        *,
        name: str | None = None,
        idx: str | None = None,
        socket_path: str = DEFAULT_SOCKET_PATH,
        sock: socket.socket | None = None,
        env: Mapping[str, str] | None = None,
        on_connected: Callback | None = None,
        on_close: CloseCallback | None = None,
        registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
        reconnect_initial: float = 0.5,
        reconnect_max: float = 30.0,
        logger: logging.Logger | None = None,
    ) -> None:
        env = os.environ if env is None else env
        Dispatcher(plugin)  # fail now, not on connect, if nothing is implemented
        self.plugin = plugin
        self.name, self.idx = plugin_identity(name, idx, env, sys.argv[0] if sys.argv else "")
        self.socket_path = socket_path
        self._sock = sock
        self._fd = (
            int(env["NRI_PLUGIN_SOCKET"]) if sock is None and "NRI_PLUGIN_SOCKET" in env else None
        )
        self.on_connected = on_connected
        self.on_close = on_close
        self.registration_timeout = registration_timeout
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.log = logger or logging.getLogger("nri_plugin.stub")
        self._session: _Session | None = None
        self._registered = False
        self._stopping = False

    @property
    def launched(self) -> bool:
        """True when we have a one-shot connection (runtime-launched or given ``sock``)."""
        return self._sock is not None or self._fd is not None

    @property
    def connected(self) -> bool:
        """Registered with the runtime on the current connection."""
        return self._registered

    @property
    def configuration(self) -> Configuration | None:
        """What Configure said on the current connection (timeouts, runtime, events)."""
        return self._session.dispatcher.configuration if self._session else None

    async def run(self) -> None:
        """Serve until the runtime goes away (one-shot) or ``stop()`` is called."""
        backoff = self.reconnect_initial
        while not self._stopping:
            try:
                session = await self._connect()
            except OSError as exc:
                if self.launched:
                    raise
                self.log.warning("cannot connect to %s: %s", self.socket_path, exc)
            else:
                if await self._serve(session):
                    backoff = self.reconnect_initial  # a good session resets the backoff
                if self.launched or session.shutdown_requested:
                    return
            if self._stopping:
                return
            self.log.info("reconnecting in %.1f s", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.reconnect_max)

    def stop(self) -> None:
        """Close the connection and make ``run()`` return instead of reconnecting."""
        self._stopping = True
        if self._session is not None:
            self._session.close()

    async def update_containers(
        self,
        updates: Iterable[nri_pb2.ContainerUpdate],
        evictions: Iterable[nri_pb2.ContainerEviction] = (),
        *,
        timeout: float | None = None,
    ) -> list[nri_pb2.ContainerUpdate]:
        """Ask the runtime to update (or evict) containers; returns the failed updates."""
        if self._session is None or not self._registered:
            raise ConnectionError("not registered with a runtime")
        request = nri_pb2.UpdateContainersRequest(update=list(updates), evict=list(evictions))
        reply = await self._session.call("UpdateContainers", request, timeout)
        if not reply.ok:
            raise RpcError(Code(reply.code), reply.message)
        return list(nri_pb2.UpdateContainersResponse.FromString(reply.payload).failed)

    # --- one connection ---

    async def _connect(self) -> _Session:
        loop = asyncio.get_running_loop()
        sock = self._sock
        if sock is None and self._fd is not None:
            sock = socket.socket(fileno=self._fd)
        factory = lambda: _Session(self.plugin, self.log)  # noqa: E731
        if sock is not None:
            _, session = await loop.create_unix_connection(factory, sock=sock)
        else:
            _, session = await loop.create_unix_connection(factory, path=self.socket_path)
        return session

    async def _serve(self, session: _Session) -> bool:
        """Register and wait for the end of the connection; True if we got registered."""
        self._session = session
        error: BaseException | None = None
        try:
            await self._register(session)
            self._registered = True
            self.log.info("registered as %s-%s", self.idx, self.name)
            if self.on_connected is not None:
                await _maybe_await(self.on_connected(self))
            error = await session.closed
        except (RegistrationError, ConnectionError, asyncio.TimeoutError) as exc:
            self.log.error("registration failed: %s", exc)
            error = exc
            session.close()
        finally:
            registered, self._registered = self._registered, False
            self._session = None
        self.log.info("connection closed%s", f": {error}" if error else "")
        if self.on_close is not None:
            await _maybe_await(self.on_close(self, error))
        # A session whose Synchronize cannot complete (paging stalled, or a frame over the
        # protocol's 4 MiB from an NRI < 0.7 runtime that cannot page) is not a good one:
        # the next ones would fail the same way, so they back off instead of looping.
        return (registered and session.dispatcher.sync_stalled is None
                and not isinstance(error, ProtocolError))

    async def _register(self, session: _Session) -> None:
        request = nri_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx)
        reply = await session.call("RegisterPlugin", request, self.registration_timeout)
        if not reply.ok:
            raise RegistrationError(f"runtime refused registration: {reply.message}")
