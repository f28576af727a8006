"""Cold reads off the event loop: a far-behind consumer's records are read into the
page cache by a small thread pool before the pull reads them through the mapping.

Without this, a PULL of records that left the page cache takes page faults on the
event loop, and each blocks the whole broker (every producer's SEND included) for a
disk read: the kernel's read-around for a mapping is up to `read_ahead_kb` (often
several MiB) a fault. `ferry.store` says which spans are cold without blocking
(`MessageStore.cold_spans`); `reader.load_spans` reads them here on a thread,
without the store lock, so sends and other pulls go on meanwhile. Hot reads (the
common case: consumers near the head) cost one cheap residency probe per 64 KiB.
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from ferry.store import MessageStore
from ferry.store.reader import load_spans

# Threads reading cold spans at once: the disk, not the CPU, bounds them (the
# threads wait in preadv with the GIL released); more only queue deeper on the disk.
COLD_READ_THREADS = 4

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(COLD_READ_THREADS,
                                                      thread_name_prefix="ferry-cold-read")
    return _pool


async def warm_for_read(store: MessageStore, topic: str, queue_id: int, offset: int,
                        max_count: int, max_bytes: int) -> None:
    """Bring what a read of (topic, queue_id) from `offset` needs into the page cache,
    off the event loop, if any of it is not there. Only a hint: it never raises for
    the store's sake (the read itself reports any error)."""
    try:
        spans = store.cold_spans(topic, queue_id, offset, max_count, max_bytes)
    except Exception:
        return
    if spans:
        await asyncio.get_running_loop().run_in_executor(_executor(), load_spans, spans)
