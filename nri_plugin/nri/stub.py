"""The asyncio shell around the sans-IO core: socket, lifecycle, reconnects. Requests are
dispatched inline in ``data_received``, so a reply leaves in the loop iteration its request
arrived in (docs/developer/nri-protocol.md §6).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nri_plugin.nri.api import RUNTIME_SERVICE, nri_pb2
from nri_plugin.nri.dispatch import SERVICES, Configuration, Dispatcher, RpcError
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.plugin import Plugin
from nri_plugin.nri.versions import (
    DEFAULT_SOCKET_PATH,
    PLUGIN_IDX_ENV,
    PLUGIN_NAME_ENV,
    PLUGIN_SOCKET_ENV,
)
from nri_plugin.nri.wire import (
    Code,
    Connection,
    ConnectionClosed,
    MessageTooLargeError,
    ProtocolError,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
)

# runtime default (docs/developer/nri-protocol.md §3.2); we wait no longer
DEFAULT_REGISTRATION_TIMEOUT = 5.0
# While the socket is absent or refuses connections (the runtime restarts), try this often:
# a failed connect costs the runtime nothing, and reconnecting within 1 s of the socket
# coming back is the goal.
POLL_INTERVAL = 0.05
# A connection that ends before Synchronize (registration refused, Configure failed, closed
# at once) is a failure: those back off from RETRY_INITIAL, doubling up to RETRY_MAX, so a
# runtime that keeps refusing us is not hammered. A completed handshake resets it.
RETRY_INITIAL = 0.1
RETRY_MAX = 5.0
# Back-pressure: stop reading requests while this much of our replies is unsent, and give
# up on a peer that has not read anything for STALL_TIMEOUT (its replies are late anyway:
# the runtime's request timeout is 2 s by default).
WRITE_HIGH_WATER = 1 << 20
STALL_TIMEOUT = 10.0
# Warn when a handler uses more than this share of the runtime's request timeout.
SLOW_HANDLER_SHARE = 0.25

Callback = Callable[["Stub"], Awaitable[None] | None]
CloseCallback = Callable[["Stub", BaseException | None], Awaitable[None] | None]

_NAME_WITH_INDEX = re.compile(r"^(\d\d)-(.+)$")


class RegistrationError(NRIPluginError):
    """The runtime refused RegisterPlugin, or did not answer in time."""


def plugin_identity(
    name: str | None, idx: str | None, env: Mapping[str, str], argv0: str
) -> tuple[str, str]:
    """Name and index: arguments, then NRI_PLUGIN_NAME/IDX, then ``NN-name`` argv[0].

    NRI v0.3.0 (containerd 1.7.0-1.7.6) passes the full ``NN-name`` as the
    name (docs/developer/nri-protocol.md §3.1), so a leading ``NN-`` is stripped whatever the
    source.
    """
    base = os.path.basename(argv0)
    name = name or env.get(PLUGIN_NAME_ENV) or base
    if (m := _NAME_WITH_INDEX.match(name)) is not None:
        name = m.group(2)
    m = m or _NAME_WITH_INDEX.match(base)
    idx = idx or env.get(PLUGIN_IDX_ENV) or (m.group(1) if m else "")
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

    def __init__(self, plugin: Plugin, log: logging.Logger,
                 on_synchronized: Callable[[], object] | None = None) -> None:
        self.log = log
        self.on_synchronized = on_synchronized
        self.loop = asyncio.get_running_loop()
        self.conn = Connection(services=SERVICES)
        self.dispatcher = Dispatcher(plugin)
        self.transport: asyncio.Transport | None = None
        # The runtime's answer to our one call, RegisterPlugin.
        self.registered: asyncio.Future[ResponseReceived] = self.loop.create_future()
        self.closed: asyncio.Future[BaseException | None] = self.loop.create_future()
        self.shutdown_requested = False
        self._stalled: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    def pause_writing(self) -> None:
        # The peer does not read our replies: read no more requests until it does, so
        # that what we hold stays bounded (the write buffer plus one read's replies).
        if self.transport is not None:
            self.transport.pause_reading()
        self._stalled = self.loop.call_later(STALL_TIMEOUT, self._give_up_on_reader)

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _give_up_on_reader(self) -> None:
        self._stalled = None
        size = self.transport.get_write_buffer_size() if self.transport else 0
        self.log.error("the runtime has not read our replies for %.0f s (%d bytes waiting); "
                       "dropping the connection", STALL_TIMEOUT, size)
        self._abort(ConnectionError("peer stopped reading"))

    def eof_received(self) -> bool:
        self.data_received(b"")
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    # --- the driver ---

    def data_received(self, data: bytes) -> None:
        try:
            self._handle(self.conn.receive_data(data))
        except ProtocolError as exc:
            self.log.error("protocol error, dropping the connection: %s", exc)
            self._abort(exc)
            return
        except Exception as exc:  # a bug: never let it escape data_received half-done
            self.log.exception("unexpected error, dropping the connection")
            self._abort(exc)
            return
        self.flush()
        if self.shutdown_requested and self.transport is not None:
            self.transport.close()

    def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, RequestReceived):
                self._serve_request(event)
            elif isinstance(event, ResponseReceived) and not self.registered.done():
                self.registered.set_result(event)
            elif isinstance(event, RequestRejected):
                self.log.warning("rejected %s/%s: %s", event.service, event.method, event.message)
            elif isinstance(event, ConnectionClosed):
                self._finish(None)

    def _serve_request(self, event: RequestReceived) -> None:
        started = self.loop.time()
        try:
            payload = self.dispatcher.dispatch(event.method, event.payload)
        except RpcError as err:
            # The plugin said why, where it refused (its own log line); a bug was logged
            # by the dispatcher in full.
            self.log.debug("%s answered with an error: %s", event.method, err.message)
            self._reply(event, b"", err.code, err.message)
        else:
            self._reply(event, payload)
        # The reply leaves now: the runtime waits on it.
        self.flush()
        if event.method == "Shutdown":
            self.shutdown_requested = True
        elif (event.method == "Synchronize" and self.dispatcher.synchronized
              and self.on_synchronized is not None):
            # Once per connection, on a later loop iteration: not inside this read's work.
            self.loop.call_soon(self.on_synchronized)
            self.on_synchronized = None
        self._check_latency(event, self.loop.time() - started)

    def _reply(self, event: RequestReceived, payload: bytes, code: int = Code.OK,
               message: str = "") -> None:
        """Answer, whatever the size: a reply over the 4 MiB frame limit becomes a short
        RESOURCE_EXHAUSTED error (never an exception out of data_received, which would
        drop the connection and let the container be created without us)."""
        try:
            self.conn.send_response(event.stream_id, payload, code=code, message=message)
        except MessageTooLargeError:
            self.log.error("%s: the reply (%d bytes) is over the 4 MiB ttrpc limit; "
                           "answering RESOURCE_EXHAUSTED", event.method, len(payload))
            self.conn.send_response(
                event.stream_id, code=Code.RESOURCE_EXHAUSTED,
                message=f"{event.method}: the reply is {len(payload)} bytes, over the "
                        "4 MiB ttrpc message limit",
            )

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

    async def register(self, name: str, idx: str) -> None:
        request = nri_pb2.RegisterPluginRequest(plugin_name=name, plugin_idx=idx)
        self.conn.send_request(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString())
        self.flush()
        reply = await asyncio.wait_for(self.registered, DEFAULT_REGISTRATION_TIMEOUT)
        if not reply.ok:
            raise RegistrationError(f"runtime refused registration: {reply.message}")

    def _abort(self, exc: BaseException) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if not self.registered.done():
            self.registered.set_exception(ConnectionError("NRI connection closed"))
        if not self.closed.done():
            self.closed.set_result(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class StubOptions:
    """How a ``Stub`` connects, and whom it tells (every field has a default).

    Connection source, in order: ``sock``; the fd in NRI_PLUGIN_SOCKET of ``env`` (None:
    the process's; we were launched by the runtime: no reconnects, ``run()`` returns on
    disconnect); else ``socket_path`` (external plugin: reconnect until ``stop()``, polling
    an absent socket every ``poll_interval``).
    """

    name: str | None = None
    idx: str | None = None
    socket_path: str = DEFAULT_SOCKET_PATH
    sock: socket.socket | None = None
    env: Mapping[str, str] | None = None
    # Called once registered.
    on_connected: Callback | None = None
    # Called (not awaited) once per connection, when the runtime's Synchronize has been
    # answered: from then on the runtime asks the plugin about every container.
    on_synchronized: Callable[[Stub], object] | None = None
    on_close: CloseCallback | None = None
    # Awaited before every connection attempt: a plugin that must not register before
    # something else is in place (another connection of its own) waits here.
    before_connect: Callback | None = None
    poll_interval: float = POLL_INTERVAL
    logger: logging.Logger | None = None


class Stub:
    """Runs a ``Plugin`` against a container runtime over NRI, as ``options`` say."""

    def __init__(self, plugin: Plugin, options: StubOptions | None = None) -> None:
        opts = options if options is not None else StubOptions()
        env = os.environ if opts.env is None else opts.env
        Dispatcher(plugin)  # fail now, not on connect, if nothing is implemented
        self.plugin = plugin
        self.name, self.idx = plugin_identity(opts.name, opts.idx, env,
                                              sys.argv[0] if sys.argv else "")
        self.options = opts
        self._sock = opts.sock
        self._fd = (int(env[PLUGIN_SOCKET_ENV])
                    if opts.sock is None and PLUGIN_SOCKET_ENV in env else None)
        # A one-shot connection (runtime-launched or given ``sock``): no reconnects.
        self.launched = self._sock is not None or self._fd is not None
        self.log = opts.logger or logging.getLogger("nri_plugin.nri.stub")
        self._session: _Session | None = None
        self._stopping = False
        self._wake = asyncio.Event()

    @property
    def configuration(self) -> Configuration | None:
        """What Configure said on the current connection (timeouts, runtime, events)."""
        return self._session.dispatcher.configuration if self._session else None

    async def run(self) -> None:
        """Serve until the runtime goes away (one-shot) or ``stop()`` is called."""
        failures = 0  # connections in a row that ended before Synchronize
        unreachable: str | None = None  # the error we last logged for an absent socket
        while not self._stopping:
            if self.options.before_connect is not None:
                await _maybe_await(self.options.before_connect(self))
                if self._stopping:
                    return
            try:
                session = await self._connect()
            except (OSError, asyncio.TimeoutError) as exc:
                if self.launched:
                    raise
                # Logged once per outage, not every poll_interval.
                if str(exc) != unreachable:
                    unreachable = str(exc)
                    self.log.warning("cannot connect to %s: %s; retrying every %.0f ms",
                                     self.options.socket_path, exc or "timed out",
                                     self.options.poll_interval * 1e3)
                await self._pause(self.options.poll_interval)
                continue
            unreachable = None
            # Our part of a reconnection ends here; registering waits on the runtime (a
            # containerd restoring its tasks answers only once CRI is up again).
            self.log.info("connected to %s; registering", self.options.socket_path or "the runtime")
            served_socket = _socket_identity(self.options.socket_path)
            await self._serve_connection(session)
            if self.launched or session.shutdown_requested or self._stopping:
                return
            if session.dispatcher.synchronized:
                failures = 0
                # The runtime went away after a good session: back at once. But a runtime
                # that is shutting down still listens for a moment, and connecting to its
                # socket again would wait out the registration timeout on a dying daemon
                # while the new one's socket is already there: wait (briefly) for a new one.
                await self._await_new_socket(served_socket)
                continue
            failures += 1
            delay = min(RETRY_INITIAL * 2 ** (failures - 1), RETRY_MAX)
            self.log.info("reconnecting in %.1f s (%d connection%s in a row ended before "
                          "Synchronize)", delay, failures, "s" if failures > 1 else "")
            await self._pause(delay)

    async def _await_new_socket(self, served: tuple[int, int] | None) -> None:
        """Until the socket file is not the one we were served on (a new runtime's, or
        none yet), for at most a second: after that the same socket is tried again (the
        runtime only dropped the connection)."""
        if served is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        while (not self._stopping and loop.time() < deadline
               and _socket_identity(self.options.socket_path) == served):
            await self._pause(self.options.poll_interval / 5)

    async def _pause(self, seconds: float) -> None:
        """Sleep, or less if ``stop()`` is called meanwhile."""
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def stop(self) -> None:
        """Close the connection and make ``run()`` return instead of reconnecting."""
        self._stopping = True
        self._wake.set()
        if self._session is not None:
            self._session.close()

    # --- one connection ---

    async def _connect(self) -> _Session:
        loop = asyncio.get_running_loop()
        sock = self._sock
        if sock is None and self._fd is not None:
            sock = socket.socket(fileno=self._fd)
        synchronized = (None if self.options.on_synchronized is None
                        else functools.partial(self.options.on_synchronized, self))
        factory = functools.partial(_Session, self.plugin, self.log, synchronized)
        if sock is not None:
            _, session = await loop.create_unix_connection(factory, sock=sock)
        else:
            # Bounded: a runtime that is frozen with its socket open must not hold us.
            _, session = await asyncio.wait_for(
                loop.create_unix_connection(factory, path=self.options.socket_path),
                DEFAULT_REGISTRATION_TIMEOUT)
        return session

    async def _serve_connection(self, session: _Session) -> None:
        """Register and wait for the end of the connection."""
        self._session = session
        error: BaseException | None = None
        try:
            await session.register(self.name, self.idx)
            self.log.info("registered as %s-%s", self.idx, self.name)
            if self.options.on_connected is not None:
                await _maybe_await(self.options.on_connected(self))
            error = await session.closed
        except (RegistrationError, ConnectionError, asyncio.TimeoutError) as exc:
            self.log.error("registration failed: %s", str(exc) or type(exc).__name__)
            error = exc
            session.close()
        finally:
            self._session = None
        self.log.info("connection closed%s", f": {error}" if error else "")
        if self.options.on_close is not None:
            await _maybe_await(self.options.on_close(self, error))

def _socket_identity(path: str | None) -> tuple[int, int] | None:
    """(inode, ctime) of the socket file: a restarted runtime makes a new one."""
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns
