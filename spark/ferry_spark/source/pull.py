"""Reading one queue range over the network, in a Spark task: PULL from `start` until `end`.

The task runs its own event loop and drives it one PULL at a time, handing
each answer's records (the answer's bytes, as stored: `schema.records_batch`
checks and decodes them column by column) to Spark before it takes the next, so a range of any
length takes the memory of two answers: the next PULL is put on the wire
before the records go to Spark, so the broker works while the task converts.
It stops exactly at the range end: records at or past `end` in the last
answer are dropped when the batch is built. The queue's broker is looked up in
namesrv (its master, else a slave of the group), again after a failed pull.

A read's `filter` (tags, SQL92) travels in every PULL, as a consumer's
subscription does: the broker skips what does not match, and its answers
move past it. Statuses: FOUND and NO_MATCHED_MESSAGE (records filtered out
or expired by TTL are skipped) move to the answer's `next_offset`. OFFSET_TOO_SMALL (retention deleted the
offset since planning) raises OffsetOutOfRangeError under offsetOutOfRange=fail
and moves to the oldest kept offset under clamp. A queue that ends before the
range end (a sync master serves only what its slaves confirmed) is waited for,
looking again every `STALL_RECHECK_S`, up to `STALL_TIMEOUT_MS`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache
from ferry.client.core.offsets import read_addr
from ferry.errors import (
    ConnectionLostError,
    NotMasterError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
)
from ferry.wire import (
    MAX_PULL_BYTES,
    MAX_PULL_COUNT,
    PullAnswer,
    PullRequest,
    PullStatus,
    RequestCode,
)

from ferry_spark.source.ranges import QueueRange

log = logging.getLogger(__name__)

#: The group named in PULLs (a PULL must name one) when the read has no `groupId`.
READER_GROUP = "ferry-spark-reader"
STALL_RECHECK_S = 0.1             # while the queue ends before the range end, look again after
STALL_TIMEOUT_MS = 60_000         # how long a range may wait for records it was planned with
MAX_PULL_ATTEMPTS = 4             # attempts of one PULL against unreachable brokers
RETRY_BACKOFF_S = 0.5
# Loop turns that put a PULL on the wire (the task's first step, then the corked write).
SEND_AHEAD_TURNS = 3
_UNREACHABLE = (ConnectionLostError, RequestTimeoutError, NotMasterError)
_ENDED = frozenset({PullStatus.OFFSET_OVERFLOW_ONE, PullStatus.OFFSET_OVERFLOW_BADLY,
                    PullStatus.NO_MESSAGE_IN_QUEUE, PullStatus.NO_MATCHED_MESSAGE})


async def _loop_turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class RangePuller:
    """Pulls one QueueRange; iterate `chunks()` for its records' bytes, in offset order
    (the last chunk may run past the range end: `records_batch(..., end)` cuts it)."""

    def __init__(self, qr: QueueRange, namesrv: str, *, fail_out_of_range: bool,
                 request_timeout_ms: int, credentials: Credentials | None = None,
                 group: str = READER_GROUP, filter_fields: dict[str, Any] | None = None,
                 unchecked: bool = False) -> None:
        """`credentials` sign every namesrv and broker request (None: unsigned);
        `filter_fields` the PULL's `tags` and `sql` (None: every record); `unchecked`
        asks the broker not to check the records (the caller checks each one)."""
        self.qr = qr
        self.group = group
        self.filter_fields = filter_fields or {}
        self.unchecked = unchecked
        #: The offset the PULL of the chunk `chunks()` yielded last was made from.
        self.last_start = qr.start
        self.tq = TopicQueue(qr.topic, qr.broker, qr.queue_id)
        self.fail_out_of_range = fail_out_of_range
        self._client = NamesrvClient(namesrv, credentials=credentials)
        self._routes = RouteCache(self._client, refresh_interval_ms=0)
        self._pool = ConnectionPool(request_timeout_ms=request_timeout_ms,
                                    credentials=credentials)
        self._addr: str | None = None

    def chunks(self) -> Generator[bytes | memoryview, None, None]:
        loop = asyncio.new_event_loop()
        ahead: asyncio.Task[tuple[bytes | memoryview, int, bool]] | None = None
        try:
            offset, end = self.qr.start, self.qr.end
            stalled_since: float | None = None
            while offset < end:
                if ahead is None:
                    ahead_at, ahead = offset, loop.create_task(self._pull(offset))
                task, at, ahead = ahead, ahead_at, None
                records, offset, ended = loop.run_until_complete(task)
                if ended:
                    stalled_since = stalled_since or time.monotonic()
                    if (time.monotonic() - stalled_since) * 1000 > STALL_TIMEOUT_MS:
                        self._stalled(offset)
                        return
                    continue
                stalled_since = None
                if offset < end:
                    # The next PULL goes out before Spark takes these records: the broker
                    # reads and sends it while this task converts them.
                    ahead_at, ahead = offset, loop.create_task(self._pull(offset))
                    loop.run_until_complete(_loop_turns(SEND_AHEAD_TURNS))
                if records:
                    self.last_start = at
                    yield records
        finally:
            if ahead is not None:
                ahead.cancel()
                loop.run_until_complete(asyncio.gather(ahead, return_exceptions=True))
            loop.run_until_complete(self._close())
            loop.close()

    def _stalled(self, offset: int) -> None:
        msg = (f"ferry source: {self.qr.where}: the queue ends at {offset}, before the planned "
               f"range end {self.qr.end}, after {STALL_TIMEOUT_MS} ms")
        if self.fail_out_of_range:
            raise OffsetOutOfRangeError(msg)
        log.warning("%s; reading what is there (offsetOutOfRange=clamp)", msg)

    async def _close(self) -> None:
        await self._pool.close()
        await self._client.close()

    async def _pull(self, offset: int) -> tuple[bytes | memoryview, int, bool]:
        """One PULL from `offset`: (the answer's records, next offset, queue ended)."""
        end = self.qr.end
        # MAX_PULL_BYTES: the largest answer a broker sends (it stays under a frame).
        request = PullRequest(self.group, self.tq.topic, self.tq.queue_id, offset,
                              min(MAX_PULL_COUNT, end - offset), max_bytes=MAX_PULL_BYTES,
                              unchecked=self.unchecked)
        fields = {**request.fields(), **self.filter_fields}
        for attempt in range(MAX_PULL_ATTEMPTS):
            try:
                if self._addr is None:
                    self._addr = await read_addr(self._routes, self.tq)
                resp = await self._pool.request(self._addr, RequestCode.PULL, fields)
                answer = PullAnswer.parse(resp.fields, resp.body, offset)
                break
            except _UNREACHABLE:
                self._addr = None
                if attempt + 1 == MAX_PULL_ATTEMPTS:
                    raise
                await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
        status, next_offset = answer.status, answer.next_offset
        if status is PullStatus.FOUND:
            return answer.body, max(next_offset, offset + 1), False
        if status is PullStatus.NO_MATCHED_MESSAGE and next_offset > offset:
            return b"", next_offset, False
        if status is PullStatus.OFFSET_TOO_SMALL:
            if self.fail_out_of_range:
                raise OffsetOutOfRangeError(
                    f"ferry source: offset {offset} of {self.qr.where} is no longer stored (the "
                    f"queue now starts at {next_offset}; range [{self.qr.start}, {end}))")
            log.warning("%s: offset %d deleted since planning; continuing at %d (clamp)",
                        self.qr.where, offset, next_offset)
            return b"", next_offset, False
        if status in _ENDED:
            await asyncio.sleep(STALL_RECHECK_S)
            return b"", offset, True
        raise OffsetOutOfRangeError(f"ferry source: {self.qr.where}: unexpected PULL status "
                                    f"{status.value!r} at offset {offset}")
