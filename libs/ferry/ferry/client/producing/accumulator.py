"""The producer's accumulator: concurrent sends to one queue share one SEND frame.

There is one `QueueBatcher` per (broker, queue). A message joins the open
batch; the open batch goes out
- at once (on the next loop turn, so sends made in the same turn join it) when
  the queue has a free in-flight slot, and when a slot frees: low latency at
  low rates, and a waiter of a sync-flush broker never waits out `linger_ms`
  beside a free slot (`mesh.sync_flush` +30-60 %; `send_batch` streams make
  somewhat smaller frames, docs/performance.md);
- when it reaches `max_batch_bytes`;
- while every slot is busy, when `linger_ms` has passed since its first message;
always with at most `max_in_flight` batches of the queue on the wire, so that a
slow broker makes batches grow instead of requests pile up. The batch's result
(the first queue offset and a count) is fanned out to each message's future by
the caller-provided `send_batch` coroutine.

Every entry is encoded into its SEND-batch bytes once, when it is queued, so a
batch's body is the join of its entries' bytes. An entry is one message
(`PendingMessage`, from `send`) or the messages of one `send_batch` call
(`PendingGroup`): they travel together with one future, which saves the
per-message futures and bookkeeping when the caller batches already.

A plain message (`send` with no key, tags, properties, delay, trace, priority
or queue selector: the common case) makes no object of its own: `add_plain`
appends its body and future to the `PendingRun` at the end of the open batch,
and the run's SEND-batch bytes and message ids are made in one pass when the
batch goes out (`PendingRun.encode`; the entry kinds are in `pending`). Its
messages share one born timestamp, the time the run was opened (as a RocketMQ
batch's messages do). A run that fails is split into `PendingMessage`s, so
retries see no difference.

A burst: thousands of `await producer.send()` in a row, which never suspend, then
`asyncio.gather` of their futures (the aiokafka docs' pattern). The loop does not
turn during the burst, so "at once, on the next loop turn" would be after the
last send: the brokers would idle while the client queues, then the client idle
while they store. Instead, once an open batch that could go out (a free slot,
its send scheduled) has grown to BURST_YIELD_FRACTION of `max_batch_bytes`
meanwhile, `add_plain` returns True and `Producer.send` yields once to the loop:
that batch (and every other queue's waiting one) goes out while the burst goes on.
A send never yields more than once per that many bytes of one queue; a sender
whose loop turns anyway (a sliding window of futures, one send at a time) never
reaches it.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ferry.client.producing.pending import Entry, Pending, PendingRun

#: The broker refuses a SEND of more messages than this (handlers/send.py).
MAX_BATCH_MESSAGES = 10_000
#: The share of `max_batch_bytes` a batch that could go out grows to, in a burst of sends
#: with no loop turn, before `add_plain` asks the caller to yield (module doc).
BURST_YIELD_FRACTION = 1 / 8


@dataclass(slots=True)
class Batch:
    """The entries that travel in one SEND frame."""

    items: list[Entry] = field(default_factory=list)
    size_bytes: int = 0
    count: int = 0      # messages (a group counts all of its own)
    flags: int = 0      # the OR of its entries' flags: the SEND's `flags` field


SendBatch = Callable[[Batch], Awaitable[None]]


async def let_batches_go() -> None:
    """What a sender awaits when `add_plain` says so: two loop turns; in the first the
    scheduled sends close their batches and start their tasks, in the second those
    tasks encode and write them."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class QueueBatcher:
    """The accumulator of one (topic, broker, queue)."""

    def __init__(self, send_batch: SendBatch, *, linger_ms: int, max_batch_bytes: int,
                 max_in_flight: int = 2) -> None:
        self._send_batch = send_batch
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        #: an open batch this big, waiting for a loop turn to go out, asks the sender to yield
        self.yield_bytes = max(1, int(max_batch_bytes * BURST_YIELD_FRACTION))
        self._open = Batch()
        self._ready: deque[Batch] = deque()   # closed batches waiting for an in-flight slot
        self._in_flight = 0
        self._linger_handle: asyncio.TimerHandle | None = None
        self._soon_handle: asyncio.Handle | None = None
        self._open_run: PendingRun | None = None   # the open batch's last entry, if a run
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def pending(self) -> int:
        return len(self._open.items) + sum(len(b.items) for b in self._ready)

    def add(self, item: Pending, flags: int = 0) -> None:
        """Append to the open batch and arrange for it to be sent per the rules above.

        `flags` are the item's message flags: the caller knows them, so a plain
        message (0) costs nothing more here.
        """
        loop = asyncio.get_running_loop()
        size = item.size_bytes
        count = item.count
        batch = self._open
        if batch.items and (batch.size_bytes + size > self.max_batch_bytes
                            or batch.count + count > MAX_BATCH_MESSAGES):
            self._close_open()
            batch = self._open
        batch.items.append(item)
        self._open_run = None   # a plain message after this one starts a new run
        batch.size_bytes += size
        batch.count += count
        if flags:
            batch.flags |= flags
        self._idle.clear()
        if len(batch.items) == 1:
            self._linger_handle = loop.call_later(self.linger_ms / 1000, self._on_linger)
        if batch.size_bytes >= self.max_batch_bytes or batch.count >= MAX_BATCH_MESSAGES:
            self._close_open()
        if self._in_flight < self.max_in_flight and self._soon_handle is None:
            self._soon_handle = loop.call_soon(self._on_soon)
        else:
            self._pump()

    def add_plain(self, body: bytes, future: asyncio.Future[object], size: int) -> bool:
        """`add` for a plain message (`size`: its encoded size): its body and future join
        the open batch's run, with no object of its own (the producer's hot path).

        True when the caller should let the loop turn (`Producer.send` then yields once):
        the batch could have gone out at the next loop turn, and BURST_YIELD_FRACTION of
        `max_batch_bytes` piled up since without one (a burst of sends, see the module doc).
        """
        batch = self._open
        run = self._open_run
        if (run is None or batch.size_bytes + size > self.max_batch_bytes
                or batch.count >= MAX_BATCH_MESSAGES):
            run = self._new_run(size)
            batch = self._open
        run.bodies.append(body)
        run.futures.append(future)
        run.size_bytes += size
        batch.size_bytes += size
        batch.count += 1
        if batch.size_bytes >= self.max_batch_bytes or batch.count >= MAX_BATCH_MESSAGES:
            self._close_open()
            self._pump()
        elif self._soon_handle is None:
            if self._in_flight < self.max_in_flight:
                self._soon_handle = asyncio.get_running_loop().call_soon(self._on_soon)
        elif batch.size_bytes >= self.yield_bytes:
            return True
        return False

    def _new_run(self, size: int) -> PendingRun:
        """A run at the end of the open batch (closing the batch first when `size` won't fit)."""
        batch = self._open
        if batch.items and (batch.size_bytes + size > self.max_batch_bytes
                            or batch.count >= MAX_BATCH_MESSAGES):
            self._close_open()
            self._pump()
            batch = self._open
        run = self._open_run = PendingRun(int(time.time() * 1000))
        batch.items.append(run)
        if len(batch.items) == 1:
            self._idle.clear()
            self._linger_handle = asyncio.get_running_loop().call_later(
                self.linger_ms / 1000, self._on_linger)
        return run

    def _close_open(self) -> None:
        self._open_run = None
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        if self._open.items:
            self._ready.append(self._open)
            self._open = Batch()

    def _on_soon(self) -> None:
        self._soon_handle = None
        if self._in_flight < self.max_in_flight:
            self._close_open()
        self._pump()

    def _on_linger(self) -> None:
        self._linger_handle = None
        self._close_open()
        self._pump()

    def _pump(self) -> None:
        """Start sending closed batches while in-flight slots are free."""
        loop = asyncio.get_running_loop()
        while self._ready and self._in_flight < self.max_in_flight:
            batch = self._ready.popleft()
            # Batches closed by linger while the slots were busy travel together.
            while (self._ready
                   and batch.size_bytes + self._ready[0].size_bytes <= self.max_batch_bytes
                   and batch.count + self._ready[0].count <= MAX_BATCH_MESSAGES):
                nxt = self._ready.popleft()
                batch.items.extend(nxt.items)
                batch.size_bytes += nxt.size_bytes
                batch.count += nxt.count
                batch.flags |= nxt.flags
            self._in_flight += 1
            task = loop.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: Batch) -> None:
        try:
            await self._send_batch(batch)
        finally:
            self._in_flight -= 1
            if not self._ready:
                self._close_open()  # a slot is free: what waited goes now
            self._pump()
            if not self._open.items and not self._ready and self._in_flight == 0:
                self._idle.set()

    async def flush(self) -> None:
        """Send what is open now and wait until nothing is pending or in flight."""
        self._close_open()
        self._pump()
        await self._idle.wait()

    def cancel(self) -> None:
        """Drop what is not yet sent (stop without flush); in-flight batches finish."""
        for handle in (self._linger_handle, self._soon_handle):
            if handle is not None:
                handle.cancel()
        self._linger_handle = self._soon_handle = None
        self._close_open()
        batches, self._ready = list(self._ready), deque()
        for batch in batches:
            for item in batch.items:
                item.cancel()
        if self._in_flight == 0:
            self._idle.set()
