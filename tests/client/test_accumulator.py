"""The producer accumulator: concurrent sends share frames; linger, size and in-flight bounds."""
from __future__ import annotations

import asyncio

from ferry.client.producing.accumulator import MAX_BATCH_MESSAGES, Batch, QueueBatcher
from ferry.client.producing.pending import PendingGroup, PendingMessage
from ferry.wire import WireMessage, decode_messages, encode_messages


def _item(body: bytes = b"x") -> PendingMessage:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    return PendingMessage(wire=WireMessage(body=body, msg_id=b"\0" * 16, born_ts_ms=0),
                          future=fut, topic="t")


class Recorder:
    """A send_batch that records batches and completes them when told."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, batch: Batch) -> None:
        self.batches.append(batch)
        await self.release.wait()
        for it in batch.items:
            it.future.set_result(len(self.batches))


async def test_sends_of_one_loop_turn_share_one_frame() -> None:
    rec = Recorder()
    b = QueueBatcher(rec, linger_ms=1000, max_batch_bytes=1 << 20)
    items = [_item() for _ in range(50)]
    for it in items:
        b.add(it)
    await asyncio.gather(*(it.future for it in items))
    assert len(rec.batches) == 1 and len(rec.batches[0].items) == 50


async def test_idle_queue_sends_at_once_without_waiting_for_linger() -> None:
    rec = Recorder()
    b = QueueBatcher(rec, linger_ms=10_000, max_batch_bytes=1 << 20)
    it = _item()
    b.add(it)
    await asyncio.wait_for(it.future, 1.0)  # far less than linger_ms


async def test_with_a_free_slot_messages_go_next_turn_and_linger_only_when_slots_are_busy(
) -> None:
    rec = Recorder()
    rec.release.clear()
    b = QueueBatcher(rec, linger_ms=10_000, max_batch_bytes=1 << 20, max_in_flight=2)
    first = _item()
    b.add(first)
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 1
    later = [_item() for _ in range(10)]
    for it in later:
        b.add(it)
    await asyncio.sleep(0.05)              # far less than linger_ms
    assert [len(batch.items) for batch in rec.batches] == [1, 10]   # the free slot took them
    last = [_item() for _ in range(3)]
    for it in last:
        b.add(it)
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert len(rec.batches) == 2           # both slots busy: these linger
    rec.release.set()
    await asyncio.gather(first.future, *(it.future for it in later + last))
    assert [len(batch.items) for batch in rec.batches] == [1, 10, 3]


async def test_in_flight_limit_holds_batches_back() -> None:
    rec = Recorder()
    rec.release.clear()
    b = QueueBatcher(rec, linger_ms=1, max_batch_bytes=1 << 20, max_in_flight=1)
    items = [_item()]
    b.add(items[0])
    await asyncio.sleep(0.01)
    for _ in range(5):
        items.append(_item())
        b.add(items[-1])
    await asyncio.sleep(0.02)
    assert len(rec.batches) == 1
    rec.release.set()
    await asyncio.gather(*(it.future for it in items))
    assert len(rec.batches) == 2 and len(rec.batches[1].items) == 5


async def test_full_batch_is_closed_at_max_batch_bytes() -> None:
    rec = Recorder()
    rec.release.clear()
    b = QueueBatcher(rec, linger_ms=10_000, max_batch_bytes=1000, max_in_flight=4)
    items = [_item(b"y" * 300) for _ in range(7)]
    for it in items:
        b.add(it)
    await asyncio.sleep(0.01)
    rec.release.set()
    await asyncio.gather(*(it.future for it in items))
    sizes = [len(batch.items) for batch in rec.batches]
    assert sum(sizes) == 7 and max(sizes) <= 3
    assert all(batch.size_bytes <= 1000 for batch in rec.batches)


async def test_flush_waits_for_everything() -> None:
    rec = Recorder()
    b = QueueBatcher(rec, linger_ms=10_000, max_batch_bytes=1 << 20)
    items = [_item() for _ in range(3)]
    for it in items:
        b.add(it)
    await b.flush()
    assert all(it.future.done() for it in items)


async def test_batches_closed_while_slots_are_busy_travel_together() -> None:
    rec = Recorder()
    rec.release.clear()
    b = QueueBatcher(rec, linger_ms=5, max_batch_bytes=1 << 20, max_in_flight=1)
    items = [_item()]
    b.add(items[0])
    for _ in range(4):          # four linger periods while the one slot is busy
        await asyncio.sleep(0.02)
        items.append(_item())
        b.add(items[-1])
    await asyncio.sleep(0.02)
    rec.release.set()
    await asyncio.gather(*(it.future for it in items))
    assert [len(batch.items) for batch in rec.batches] == [1, 4]


async def test_an_entry_is_encoded_once_and_a_batch_body_is_their_join() -> None:
    rec = Recorder()
    b = QueueBatcher(rec, linger_ms=1000, max_batch_bytes=1 << 20)
    single = _item(b"one")
    wires = [WireMessage(body=bytes([i]) * 3, msg_id=bytes([i]) * 16, born_ts_ms=i)
             for i in range(1, 4)]
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    group = PendingGroup(msg_ids=[w.msg_id for w in wires], encoded=encode_messages(wires),
                         future=fut, topic="t")
    b.add(single)
    b.add(group)
    await asyncio.gather(single.future, group.future)
    (batch,) = rec.batches
    assert batch.count == 4 and group.count == 3 and single.count == 1
    assert batch.size_bytes == len(single.encoded) + len(group.encoded)
    bodies = [m.body for m in decode_messages(b"".join(it.encoded for it in batch.items))]
    assert bodies == [b"one", b"\x01" * 3, b"\x02" * 3, b"\x03" * 3]


async def test_a_batch_never_holds_more_messages_than_a_send_may() -> None:
    rec = Recorder()
    rec.release.clear()
    b = QueueBatcher(rec, linger_ms=10_000, max_batch_bytes=1 << 30, max_in_flight=8)
    items = [_item(b"") for _ in range(MAX_BATCH_MESSAGES + 5)]
    for it in items:
        b.add(it)
    await asyncio.sleep(0.01)
    rec.release.set()
    await asyncio.gather(*(it.future for it in items))
    assert sorted(batch.count for batch in rec.batches) == [5, MAX_BATCH_MESSAGES]
