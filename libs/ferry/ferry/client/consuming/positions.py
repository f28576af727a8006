"""A consumer's positions: commits, seeks, and offsets by time (the aiokafka-style calls).

`Positions` is owned by `Consumer`, which forwards `commit`, `seek*`,
`position`, `assignment` and `offsets_for_times` to it. It is built with what
it works on: the consumer's fetchers (one per assigned queue, each knowing
what it handed out; the dict is shared with the consumer and its
`Assignment`, which adds and removes them), the offsets still pending an
outcome (a running handler, a nack not yet stored), the offset store (the
brokers, or a local file for broadcasting), and the routes and connections
that reach the brokers. It keeps what counts as consumed and what was
committed per queue. A commit never passes a pending offset.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from ferry.client.consuming.fetcher import QueueFetcher
from ferry.client.consuming.retry import PendingOffsets
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import OffsetStore, queue_bounds, read_addr
from ferry.errors import FerryError
from ferry.tasks import cancel_and_wait
from ferry.wire import RequestCode

log = logging.getLogger("ferry.client.consuming.consumer")


def commit_addr(fetchers: Mapping[TopicQueue, QueueFetcher], tq: TopicQueue) -> str | None:
    """Where `tq`'s commit goes: as its fetcher says (master, or the slave it reads from)."""
    fetcher = fetchers.get(tq)
    return fetcher.commit_addr() if fetcher is not None else None


class Positions:
    """Commits and seeks over a consumer's fetchers."""

    def __init__(self, fetchers: dict[TopicQueue, QueueFetcher], pending: PendingOffsets,
                 offsets: OffsetStore, routes: RouteCache, pool: ConnectionPool) -> None:
        self.fetchers = fetchers   # the consumer's, shared: read here, never changed
        self.pending = pending
        self.offsets = offsets
        self.routes = routes
        self.pool = pool
        #: The next offset of each queue that counts as processed (what a commit sends).
        #: Shared with an ordered runner, which moves it as its handlers finish.
        self.consumed: dict[TopicQueue, int] = {}
        self.committed: dict[TopicQueue, int] = {}
        self._auto_commit: asyncio.Task[None] | None = None

    def promote(self) -> None:
        """What was handed out before counts as processed now."""
        consumed = self.consumed
        for tq, fetcher in self.fetchers.items():
            consumed[tq] = fetcher.delivered

    def track(self, tq: TopicQueue, offset: int) -> None:
        """A queue started (or continues) at `offset`: nothing of it processed before that."""
        self.consumed[tq] = offset

    def on_rewind(self, tq: TopicQueue, offset: int) -> None:
        """A fetcher went back to `offset` (the queue's history changed): the position
        committed next must not lie past it."""
        if self.consumed.get(tq, offset) > offset:
            self.consumed[tq] = offset

    def on_reset(self, tq: TopicQueue, offset: int) -> None:
        """An operator reset the group's offset of `tq` to `offset` (the broker holds it
        committed already): the position continues from there."""
        self.consumed[tq] = self.committed[tq] = offset

    async def forget(self, tq: TopicQueue, commit: bool = True) -> None:
        """Commit a released queue's position (unless `commit` is False) and drop it."""
        if commit:
            await self.commit_quietly([tq])
        self.consumed.pop(tq, None)
        self.committed.pop(tq, None)

    # -- commits ------------------------------------------------------------------------------
    async def commit(self, offsets: dict[TopicQueue, int] | None = None) -> None:
        """Commit every position handed out so far (or the given next offsets)."""
        if offsets is None:
            self.promote()
        else:
            self.consumed.update(offsets)
        await self.commit_consumed()

    async def commit_consumed(self, only: Iterable[TopicQueue] | None = None) -> None:
        tqs = list(only) if only is not None else list(self.consumed)
        clamp = self.pending.clamp   # never past a record whose outcome is not stored
        todo = {tq: clamp(tq, self.consumed[tq]) for tq in tqs if tq in self.consumed}
        todo = {tq: o for tq, o in todo.items() if self.committed.get(tq) != o}
        if todo:
            # Each offset goes with the history of the record before it (issue 16).
            hists = {tq: h for tq, o in todo.items() if (f := self.fetchers.get(tq)) is not None
                     and (h := f.hist_at(o - 1)) is not None}
            if hists:
                await self.offsets.commit(todo, hists)
            else:   # nothing to name: the call an OffsetStore without histories knows too
                await self.offsets.commit(todo)
            self.committed.update(todo)

    async def commit_quietly(self, only: Iterable[TopicQueue] | None = None) -> None:
        try:
            await self.commit_consumed(only)
        except FerryError as exc:
            log.warning("commit failed: %s", exc)
        except Exception:
            log.exception("commit failed unexpectedly")

    def start_auto_commit(self, interval_ms: int) -> None:
        """Commit the consumed positions every `interval_ms`, until `close()`."""
        self._auto_commit = asyncio.get_running_loop().create_task(
            self._commit_every(interval_ms), name="ferry-autocommit")

    async def _commit_every(self, interval_ms: int) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            await self.commit_quietly()

    async def close(self, *, processed: bool) -> None:
        """The last commit (of what was handed out too when `processed`), the store closed."""
        await cancel_and_wait(self._auto_commit)
        self._auto_commit = None
        if processed:
            self.promote()
        await self.commit_quietly()
        await self.offsets.close()

    # -- where the queues are -----------------------------------------------------------------
    def assignment(self) -> frozenset[TopicQueue]:
        return frozenset(self.fetchers)

    def position(self, tq: TopicQueue) -> int:
        """The next offset this consumer hands out from `tq`."""
        return self.fetchers[tq].delivered

    async def seek(self, tq: TopicQueue, offset: int, *, keep_hist: bool = False) -> None:
        """Continue `tq` from `offset` (its buffer is dropped). `keep_hist` (internal
        rewinds): the fetcher keeps the history of the record before `offset`."""
        fetcher = self.fetchers.get(tq)
        if fetcher is None:
            raise ValueError(f"{tq} is not assigned to this consumer")
        await fetcher.seek(offset, keep_hist=keep_hist)
        self.consumed[tq] = offset

    async def seek_to_beginning(self, *tqs: TopicQueue) -> None:
        for tq in tqs or sorted(self.fetchers):
            await self.seek(tq, (await self.bounds(tq))[0])

    async def seek_to_end(self, *tqs: TopicQueue) -> None:
        for tq in tqs or sorted(self.fetchers):
            await self.seek(tq, (await self.bounds(tq))[1])

    async def offsets_for_times(self, timestamps: dict[TopicQueue, int]) -> dict[TopicQueue, int]:
        """The first offset stored at or after each timestamp (ms)."""
        out = {}
        for tq, ts_ms in timestamps.items():
            addr = await read_addr(self.routes, tq)
            resp = await self.pool.request(addr, RequestCode.OFFSET_FOR_TIME, {
                "topic": tq.topic, "queue_id": tq.queue_id, "ts_ms": int(ts_ms)})
            out[tq] = int(resp.fields["offset"])
        return out

    async def bounds(self, tq: TopicQueue) -> tuple[int, int]:
        """The queue's (min, max) offsets at its broker."""
        return await queue_bounds(self.pool, self.routes, tq)
