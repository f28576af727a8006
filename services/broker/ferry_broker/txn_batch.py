"""Group commit for END_TRANSACTION: the ENDs of one event-loop turn share one store write.

A handler that decided to write (its state check found no op record) adds its
messages (the committed message first, then the op record) to the open batch
and awaits its own future. The first END of a batch schedules the write with
`call_soon`, so it runs in the next loop turn: every END that the loop started
in the same turn joins, and an END alone waits no longer than one turn. The
write is one `put_batch` through the pipeline (`write_prepared`), then one
run of the after-put hooks (wake pulls, one durability wait), then every
future of the batch resolves with the batch's results, or fails with the
batch's error (the same error a lone END gets today).

Between an END's state check and the write its outcome lives only here, in
`pending` (by transaction id): a second END of that transaction in the same
batch finds it and answers from it (same action: `repeated`, once the batch
is written; the other: TransactionStateError), never writing a second op
record. An entry leaves `pending` in the same synchronous step that writes the
batch: from then on the op record is in the store (the store's key index
answers) or, after a failed write, the transaction is open again. So
`pending` never holds more than one batch, and memory stays bounded by the
requests in flight.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ferry.errors import FerryError
from ferry.store import MessageIn, PutResult

from ferry_broker.put_pipeline import PutDone, PutPipeline

#: A batch this full is written at once rather than at the end of the turn.
MAX_ENDS_PER_WRITE = 256
#: Body bytes past which a batch is written at once (a commit carries its message).
MAX_BATCH_BODY_BYTES = 4 << 20


@dataclass(slots=True)
class PendingEnd:
    """An END whose op record is in the open batch, not yet in the store."""

    batch: _Batch
    written: str       # the op record's action ("commit" or "rollback")
    group: str         # the producer group that began the transaction
    real_index: int    # the committed message's index in the batch, or -1
    queue_offset: int  # its queue offset when known before the write (a torn commit), or -1
    topic: str = ""    # the transaction's real topic (a repeated END needs `pub` on it)


@dataclass(slots=True)
class _Batch:
    messages: list[MessageIn] = field(default_factory=list)
    waiters: list[asyncio.Future[list[PutResult]]] = field(default_factory=list)
    ids: list[bytes] = field(default_factory=list)
    body_bytes: int = 0


class EndBatcher:
    """Collects the store writes of concurrent ENDs into one put_batch per loop turn."""

    def __init__(self, pipeline: PutPipeline) -> None:
        self._pipeline = pipeline
        self._open: _Batch | None = None
        self.pending: dict[bytes, PendingEnd] = {}
        self.writes = 0   # store writes made (for tests and stats)
        self._finishing: set[asyncio.Task[None]] = set()  # the loop keeps weak refs only

    def add(self, msg_id: bytes, messages: list[MessageIn], *, written: str, group: str,
            queue_offset: int, topic: str = "") -> tuple[PendingEnd,
                                                         asyncio.Future[list[PutResult]]]:
        """Queue one END's messages (the real one, if any, first); await the future.

        The future resolves to the whole batch's put results; `PendingEnd.real_index`
        says which is this END's committed message.
        """
        batch = self._open
        if batch is None:
            batch = self._open = _Batch()
            asyncio.get_running_loop().call_soon(self._write_open, batch)
        real_index = len(batch.messages) if len(messages) == 2 else -1
        batch.messages.extend(messages)
        batch.ids.append(msg_id)
        batch.body_bytes += sum(len(m.body) for m in messages)
        pend = PendingEnd(batch, written, group, real_index, queue_offset, topic)
        self.pending[msg_id] = pend
        fut = self.join(pend)
        if len(batch.ids) >= MAX_ENDS_PER_WRITE or batch.body_bytes >= MAX_BATCH_BODY_BYTES:
            self._write_open(batch)
        return pend, fut

    def join(self, pend: PendingEnd) -> asyncio.Future[list[PutResult]]:
        """A future resolved when `pend`'s batch is written and durable (or failed)."""
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        pend.batch.waiters.append(fut)
        return fut

    def _write_open(self, batch: _Batch) -> None:
        """Write `batch` if it is still the open one (a full batch may be written early)."""
        if self._open is not batch:
            return
        self._open = None
        try:
            results, done = self._pipeline.write_prepared(batch.messages)
        except FerryError as exc:
            self._forget(batch)
            _fail(batch, exc)
            return
        except Exception as exc:  # a bug: fail the requests, never the event loop
            self._forget(batch)
            _fail(batch, exc)
            return
        self._forget(batch)  # the op records are in the store now: its index answers
        self.writes += 1
        task = asyncio.get_running_loop().create_task(self._finish(batch, results, done))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    def _forget(self, batch: _Batch) -> None:
        for msg_id in batch.ids:
            pend = self.pending.get(msg_id)
            if pend is not None and pend.batch is batch:
                del self.pending[msg_id]

    async def _finish(self, batch: _Batch, results: list[PutResult], done: PutDone) -> None:
        try:
            await self._pipeline.after_put(done)
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets it
            _fail(batch, exc)
            return
        for fut in batch.waiters:
            if not fut.done():
                fut.set_result(results)


def _fail(batch: _Batch, exc: BaseException) -> None:
    for fut in batch.waiters:
        if not fut.done():
            fut.set_exception(exc)
