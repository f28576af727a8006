"""The cancel book without etcd (one instance): held in memory, forgotten after the due time."""
from __future__ import annotations

import time

from ferry_delay_scheduler.cancels import KEEP_AFTER_DUE_S, CancelBook


async def test_a_cancel_is_kept_until_an_hour_past_its_due_time() -> None:
    book = CancelBook(None)
    now = int(time.time() * 1000)
    await book.add(b"\x01" * 16, now + 60_000)
    await book.add(b"\x02" * 16, now - KEEP_AFTER_DUE_S * 1000 - 1)  # long past
    assert book.contains(b"\x01" * 16) and not book.contains(b"\x03" * 16)
    assert await book.load() == 1  # a new term forgets the expired one
    assert book.contains(b"\x01" * 16) and not book.contains(b"\x02" * 16)
