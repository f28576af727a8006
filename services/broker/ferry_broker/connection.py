"""One client connection of the wire server: decode, admit, dispatch, answer.

`BrokerProtocol` is the asyncio protocol of one connection (the limits and
failure handling are described in `server.py`, which accepts connections and
tracks them). It reaches the server through `ConnectionHost` only, so this
module does not import the server.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol, cast

from ferry.cork import Cork
from ferry.errors import FerryError, SystemError_, UnknownCodeError
from ferry.log_limit import LogLimiter
from ferry.wire import (
    Flag,
    Frame,
    FrameDecoder,
    MalformedFrameError,
    encode_frame_parts,
    error_response,
)

from ferry_broker.auth import BrokerAuth
from ferry_broker.context import BrokerContext, ConnInfo, Handler
from ferry_broker.eager_start import start_eager
from ferry_broker.limits import (
    FRAMES_MALFORMED,
    PENDING_FRAMES_WAITED,
    READING_PAUSED_INFLIGHT,
    READING_PAUSED_UNWRITTEN,
    RESPONSES_IGNORED,
    SMALL_FRAME_BYTES,
)

log = logging.getLogger(__name__)
#: Every line a client can cause here is rate-limited per kind (ferry.log_limit).
limited = LogLimiter(log)

# Plain ints: testing an int against an IntFlag member goes through enum machinery.
_RESPONSE = int(Flag.RESPONSE)
_ONEWAY = int(Flag.ONEWAY)


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it."""

    ctx: BrokerContext
    handlers: dict[int, Handler]
    auth: BrokerAuth | None
    connections: set[BrokerProtocol]


class BrokerProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: ConnectionHost, conn_id: int) -> None:
        self.server = server
        self.conn_id = conn_id
        # Bodies as views: a SEND body goes to the store without another copy.
        self.decoder = FrameDecoder(server.ctx.config.max_frame_bytes, body_views=True)
        self._limits = server.ctx.limits
        self._host: str | None = None  # set once admitted: its connection counts against it
        self.tasks: set[asyncio.Task[None]] = set()
        self.info = ConnInfo(conn_id, "")
        self.transport: asyncio.Transport | None = None
        self._closed = False
        self._reading_paused = False
        self._writing_paused = False
        self._stopped = False
        # Responses finished in one loop turn go out in one write (ferry.cork).
        self._cork = Cork(self._write_out)
        self._max_unwritten = server.ctx.config.max_unwritten_bytes_per_conn
        # Requests waiting for unwritten bytes to drain, in arrival order.
        self._turns: deque[asyncio.Future[None]] = deque()
        self._backlog: deque[tuple[Handler, Frame]] = deque()
        self._max_inflight = server.ctx.config.max_inflight_per_conn
        # The pending-frame budget (limits.py): what this connection's incomplete large
        # frame has reserved, since when, or what it waits for.
        self._pending = server.ctx.limits.pending
        self._reserved = 0
        self._frame_started = 0.0
        self._budget_wait = 0
        #: When the last frame was completed (or the connection opened): the server's
        #: idle sweep reads it, so the read path pays one clock read per socket read.
        self.last_frame_at = time.monotonic()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.info = ConnInfo(self.conn_id, f"{peer[0]}:{peer[1]}" if peer else "", self.push)
        host = str(peer[0]) if peer else ""
        refused = self._limits.admit(host)
        if refused is not None:
            self._limits.refuse(refused, "refusing connection from %s: %d connections open",
                                self.info.peer, self._limits.open_connections)
            self._closed = True
            self.transport.abort()
            return
        self._host = host
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cork.clear()
        self._backlog.clear()
        self._turns.clear()  # their tasks are cancelled just below
        self.server.connections.discard(self)
        if self._host is not None:
            self._limits.release(self._host)
            self._host = None
        if self._budget_wait:
            self._pending.forget(self)
            self._budget_wait = 0
        if self._reserved:
            reserved, self._reserved = self._reserved, 0
            self._pending.give(reserved)
        # A check must never be pushed to a closed connection.
        self.server.ctx.producers.connection_closed(self.conn_id)
        # Nobody is left to answer: free parked pulls (and their slots) now rather
        # than at their deadline. Stored messages are unaffected: a SEND's write
        # happened before its first await.
        for task in list(self.tasks):
            task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except MalformedFrameError as exc:
            self._limits.refuse(FRAMES_MALFORMED, "malformed frame from %s, closing the "
                                "connection: %s", self.info.peer, exc)
            self.close()
            return
        if frames:
            self.last_frame_at = time.monotonic()
            with self._cork:  # the answers made for this read leave in one write, after it
                for frame in frames:
                    self._dispatch(frame)
        if not self._closed:
            self._account_pending(bool(frames))

    # -- the pending-frame budget ----------------------------------------------------------

    def _account_pending(self, new_frame: bool) -> None:
        """Reserve budget for the incomplete large frame held, or wait for room (unread)."""
        need = self.decoder.pending_frame_bytes
        if need <= SMALL_FRAME_BYTES:
            need = 0
        if self._budget_wait:
            if need == self._budget_wait and not new_frame:
                return
            self._pending.forget(self)
            self._budget_wait = 0
        elif need == self._reserved and not new_frame:
            return  # the same frame goes on arriving
        if self._reserved:
            reserved, self._reserved = self._reserved, 0
            self._pending.give(reserved)
        if need and self._pending.take(need):
            self._reserved = need
            self._frame_started = time.monotonic()
        elif need:
            self._budget_wait = need
            self._pending.wait(self, need)
            self._limits.refuse(PENDING_FRAMES_WAITED, "connection %d from %s waits to "
                                "receive a frame of %d bytes: incomplete frames hold %d bytes",
                                self.conn_id, self.info.peer, need, self._pending.reserved)
        self._update_reading()

    def budget_granted(self, reserved: int) -> None:
        """The budget has room for the frame this connection waited with: read on."""
        self._budget_wait = 0
        self._reserved = reserved
        self._frame_started = time.monotonic()
        self._update_reading()

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def frame_overdue(self, now: float, timeout_s: float) -> bool:
        """Whether a large frame has been arriving for longer than `timeout_s`."""
        return bool(self._reserved) and now - self._frame_started > timeout_s

    def idle_overdue(self, now: float, timeout_s: float) -> bool:
        """Whether no frame completed (and no request ended) for `timeout_s` while nothing of this connection runs
        or waits (a large frame arriving, or waiting for the budget, is `frame_overdue`'s)."""
        return (now - self.last_frame_at > timeout_s and not self.tasks and not self._backlog
                and not self._reserved and not self._budget_wait)

    def pause_writing(self) -> None:
        # The peer is not reading its responses: stop taking requests from it.
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._release_turn()
        self._start_backlog()
        self._update_reading()

    # -- requests --------------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        if frame.flags & _RESPONSE:
            self._limits.refuse(RESPONSES_IGNORED, "connection %d sent a response frame "
                                "(code %d); ignored", self.conn_id, frame.code)
            return
        auth = self.server.auth
        if auth is not None:
            # Before any work, even before the code is looked up: an unauthenticated
            # peer learns nothing and costs no task.
            try:
                auth.check(frame)
            except FerryError as exc:
                limited.info(f"refused:{type(exc).__name__}", "request refused: %s", exc, extra={
                    "conn": self.conn_id, "peer": self.info.peer, "code": frame.code,
                    "request_id": frame.request_id, "error": exc.code})
                self._reply(frame, error_response(frame, exc))
                return
        handler = self.server.handlers.get(frame.code)
        if handler is None:
            self._reply(frame, error_response(
                frame, UnknownCodeError(f"unknown request code {frame.code}")))
            return
        if self._backlog or not self._may_start():
            # One read can hold thousands of small frames: past the limit they
            # wait here, in order, instead of all becoming tasks at once.
            self._backlog.append((handler, frame))
            self._update_reading()
            return
        self._start(handler, frame)

    def _start(self, handler: Handler, frame: Frame) -> None:
        task = start_eager(self._run(handler, frame))  # a task only if it waits
        if task is None:
            return
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        if len(self.tasks) >= self._max_inflight:
            self._update_reading()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        # Idle counts from the last frame or the last request's end, whichever is later:
        # an answer to a pull that waited past the timeout does not close its connection.
        self.last_frame_at = time.monotonic()
        if self._closed:
            return
        self._release_turn()
        self._start_backlog()
        if self._reading_paused:
            self._update_reading()

    def _budget_ok(self) -> bool:
        """Whether the responses not yet written leave room for another one."""
        if self._writing_paused:
            return False
        buffered = self._cork.nbytes
        if self.transport is not None:
            buffered += self.transport.get_write_buffer_size()
        return buffered < self._max_unwritten

    def _may_start(self) -> bool:
        """Whether one more request of this connection may become a task now."""
        return len(self.tasks) < self._max_inflight and self._budget_ok()

    async def _wait_turn(self) -> None:
        turn = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        await turn

    def _release_turn(self) -> None:
        # One at a time: the released request makes its response before the next
        # check, so a burst of requests cannot all answer into memory at once.
        while self._turns and self._turns[0].done():
            self._turns.popleft()  # its task was cancelled
        if self._turns and self._budget_ok():
            self._turns.popleft().set_result(None)

    def _start_backlog(self) -> None:
        while self._backlog and self._may_start():
            self._start(*self._backlog.popleft())

    @property
    def busy(self) -> bool:
        """Whether requests of this connection are running or waiting to run."""
        return bool(self.tasks or self._backlog)

    async def _run(self, handler: Handler, frame: Frame) -> None:
        if self._turns or not self._budget_ok():
            # Waiting here keeps arrival order: later requests queue behind this one.
            await self._wait_turn()
        try:
            resp = await handler(self.server.ctx, self.info, frame)
        except FerryError as exc:
            limited.info(f"failed:{type(exc).__name__}", "request failed: %s: %s",
                         type(exc).__name__, exc,
                         extra={"conn": self.conn_id, "peer": self.info.peer, "code": frame.code,
                                "request_id": frame.request_id, "error": exc.code})
            resp = error_response(frame, exc)
        except Exception:
            limited.log(logging.ERROR, "crashed", "request crashed", exc_info=True, extra={
                "conn": self.conn_id, "peer": self.info.peer, "code": frame.code,
                "request_id": frame.request_id})
            resp = error_response(frame, SystemError_("internal error; see the broker log"))
        if resp is not None:
            self._reply(frame, resp)

    def _reply(self, req: Frame, resp: Frame) -> None:
        if req.flags & _ONEWAY:
            if resp.error:
                limited.info("oneway-failed", "one-way request %d (code %d) failed: %s",
                             req.request_id, req.code, resp.message)
            return
        if self._closed or self.transport is None:
            return
        try:
            parts = encode_frame_parts(resp)
        except FerryError as exc:
            log.error("cannot encode response to request %d: %s", req.request_id, exc)
            parts = encode_frame_parts(error_response(req, exc))
        if len(self.tasks) > 1:  # others will answer too: the turn's answers leave together
            self._cork.add(parts)
        else:  # alone (a woken PULL): now, unless corked while a read is handled
            self._cork.add_now(parts)

    def _write_out(self, out: list[bytes | memoryview]) -> None:
        if out and not self._closed and self.transport is not None:
            self.transport.writelines(out)
        self._release_turn()
        if self._backlog:
            self._start_backlog()

    # -- server-to-client requests ---------------------------------------------------------

    def push(self, frame: Frame) -> bool:
        """Send a one-way request to the client (a CHECK_TRANSACTION); False if it cannot go.

        It shares the corked write path and the unwritten-bytes budget with the
        responses: a client that does not read gets no further pushes.
        """
        if self._closed or self.transport is None or not frame.flags & _ONEWAY:
            return False
        if not self._budget_ok():
            return False
        try:
            parts = encode_frame_parts(frame)
        except FerryError as exc:
            log.error("cannot encode a request to connection %d: %s", self.conn_id, exc)
            return False
        self._cork.add(parts)
        return True

    # -- flow control and closing ----------------------------------------------------------

    def _update_reading(self) -> None:
        if self._closed or self.transport is None:
            return
        pause = (self._stopped or bool(self._budget_wait) or bool(self._backlog)
                 or not self._may_start())
        if pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
            if not self._stopped and not self._budget_wait:
                self._limits.count(READING_PAUSED_INFLIGHT if self._budget_ok()
                                   else READING_PAUSED_UNWRITTEN)
        elif not pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    def stop_reading(self) -> None:
        """Take no more requests (shutdown); responses still go out."""
        self._stopped = True
        self._update_reading()

    def close(self) -> None:
        """Close after writing the responses already made (corked ones included)."""
        if not self._closed and self.transport is not None:
            self._cork.flush()
            self._closed = True
            self.transport.close()

    def close_idle(self) -> None:
        """Close an idle connection; drop it at once if its peer left answers unread."""
        if self.transport is not None and self.transport.get_write_buffer_size():
            self._closed = True
            self.transport.abort()  # close() would wait for a reader that is not there
        else:
            self.close()
