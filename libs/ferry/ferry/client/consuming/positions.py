"""A consumer's positions: commits, seeks, and offsets by time (the aiokafka-style calls).

`Positions` is the part of `Consumer` that reads and moves positions. It
works on the consumer's own state, declared here: the fetchers (one per
assigned queue, each knowing what it handed out), what counts as consumed
and what was committed per queue, the offsets still pending an outcome (a
running handler, a nack not yet stored), and the offset store (the brokers,
or a local file for broadcasting). A commit never passes a pending offset.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from ferry.client.consuming.fetcher import QueueFetcher
from ferry.client.consuming.retry import PendingOffsets
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import OffsetStore, queue_bounds, read_addr
from ferry.errors import FerryError
from ferry.wire import RequestCode

log = logging.getLogger("ferry.client.consuming.consumer")


class Positions:
    """Commits and seeks over a consumer's fetchers (mixed into `Consumer`)."""

    auto_commit_interval_ms: int
    _fetchers: dict[TopicQueue, QueueFetcher]
    _consumed: dict[TopicQueue, int]
    _committed: dict[TopicQueue, int]
    _pending: PendingOffsets
    _offsets: OffsetStore
    _routes: RouteCache
    _pool: ConnectionPool

    def _promote(self) -> None:
        """What was handed out before counts as processed now."""
        for tq, fetcher in self._fetchers.items():
            self._consumed[tq] = fetcher.delivered

    async def commit(self, offsets: dict[TopicQueue, int] | None = None) -> None:
        """Commit every position handed out so far (or the given next offsets)."""
        if offsets is None:
            self._promote()
        else:
            self._consumed.update(offsets)
        await self._commit_consumed()

    async def _commit_consumed(self, only: Iterable[TopicQueue] | None = None) -> None:
        tqs = list(only) if only is not None else list(self._consumed)
        clamp = self._pending.clamp   # never past a record whose outcome is not stored
        todo = {tq: clamp(tq, self._consumed[tq]) for tq in tqs if tq in self._consumed}
        todo = {tq: o for tq, o in todo.items() if self._committed.get(tq) != o}
        if todo:
            # Each offset goes with the history of the record before it (issue 16).
            hists = {tq: h for tq, o in todo.items() if (f := self._fetchers.get(tq)) is not None
                     and (h := f.hist_at(o - 1)) is not None}
            if hists:
                await self._offsets.commit(todo, hists)
            else:   # nothing to name: the call an OffsetStore without histories knows too
                await self._offsets.commit(todo)
            self._committed.update(todo)

    async def _commit_quietly(self, only: Iterable[TopicQueue] | None = None) -> None:
        try:
            await self._commit_consumed(only)
        except FerryError as exc:
            log.warning("commit failed: %s", exc)
        except Exception:
            log.exception("commit failed unexpectedly")

    async def _auto_commit(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_ms / 1000)
            await self._commit_quietly()

    def assignment(self) -> frozenset[TopicQueue]:
        return frozenset(self._fetchers)

    def position(self, tq: TopicQueue) -> int:
        """The next offset this consumer hands out from `tq`."""
        return self._fetchers[tq].delivered

    async def seek(self, tq: TopicQueue, offset: int, *, keep_hist: bool = False) -> None:
        """Continue `tq` from `offset` (its buffer is dropped). `keep_hist` (internal
        rewinds): the fetcher keeps the history of the record before `offset`."""
        fetcher = self._fetchers.get(tq)
        if fetcher is None:
            raise ValueError(f"{tq} is not assigned to this consumer")
        await fetcher.seek(offset, keep_hist=keep_hist)
        self._consumed[tq] = offset

    async def seek_to_beginning(self, *tqs: TopicQueue) -> None:
        for tq in tqs or sorted(self._fetchers):
            await self.seek(tq, (await self._min_max(tq))[0])

    async def seek_to_end(self, *tqs: TopicQueue) -> None:
        for tq in tqs or sorted(self._fetchers):
            await self.seek(tq, (await self._min_max(tq))[1])

    async def offsets_for_times(self, timestamps: dict[TopicQueue, int]) -> dict[TopicQueue, int]:
        """The first offset stored at or after each timestamp (ms)."""
        out = {}
        for tq, ts_ms in timestamps.items():
            addr = await read_addr(self._routes, tq)
            resp = await self._pool.request(addr, RequestCode.OFFSET_FOR_TIME, {
                "topic": tq.topic, "queue_id": tq.queue_id, "ts_ms": int(ts_ms)})
            out[tq] = int(resp.fields["offset"])
        return out

    async def _min_max(self, tq: TopicQueue) -> tuple[int, int]:
        return await queue_bounds(self._pool, self._routes, tq)
