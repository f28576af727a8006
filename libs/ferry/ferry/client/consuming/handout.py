"""How buffered records are handed to the application: `getmany`'s round-robin over the
queues and `async for`'s runs of one queue.

`take` shares each call among the queues with buffered records, starting one
queue further each time, so a busy queue does not starve the others; of a
topic with priority levels only the highest level with buffered records on
each broker is served, lower levels get the rest of the limit.

`async for` takes one record per step, and going through that round-robin (and
promoting every queue's position) for each record cost more than the record
itself (`mesh.consume`, `"api": "async_for"`). So a step continues the run of
the queue the last round-robin step chose, up to RUN records, then the
round-robin picks again: every queue with records is still served within a few
runs. Positions stay exact: before a record of the run is handed out, the
record handed out before it (of the same queue) counts as processed, as
`Positions.promote` does for every queue. Topics with priority levels always
take the round-robin path (a higher level's record may arrive between steps).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from ferry.client.consuming.fetcher import QueueFetcher, servable
from ferry.client.core.message import ConsumerRecord, TopicQueue

#: Records one queue hands out in a row to `async for` before the round-robin chooses again.
RUN = 64


class Handout:
    """The round-robin's place and the current `async for` run of one consumer."""

    __slots__ = ("next_queue", "fetcher", "left")

    def __init__(self) -> None:
        self.next_queue = 0
        self.fetcher: QueueFetcher | None = None
        self.left = 0

    def take(self, fetchers: Iterable[QueueFetcher], levels: Mapping[TopicQueue, int],
             limit: int) -> dict[TopicQueue, list[ConsumerRecord]]:
        """Up to `limit` records by queue, round-robin (see the module's doc)."""
        out: dict[TopicQueue, list[ConsumerRecord]] = {}
        taken = 0
        while taken < limit:
            ready = servable(fetchers, levels)
            if not ready:
                break
            self.next_queue = (self.next_queue + 1) % len(ready)
            ready = ready[self.next_queue:] + ready[:self.next_queue]
            share = max(1, (limit - taken) // len(ready))
            before = taken
            for fetcher in ready:
                records = fetcher.take(min(share, limit - taken))
                if records:
                    if fetcher.tq in out:
                        out[fetcher.tq] += records
                    else:
                        out[fetcher.tq] = records
                    taken += len(records)
                if taken >= limit:
                    break
            if taken == before:   # nothing to take after all: never spin
                break
        return out

    def start_run(self, fetcher: QueueFetcher | None) -> None:
        """The round-robin handed out a record of `fetcher`'s queue: a run of it begins."""
        self.fetcher, self.left = fetcher, RUN - 1

    def next_of_run(self, fetchers: Mapping[TopicQueue, QueueFetcher],
                    consumed: dict[TopicQueue, int]) -> ConsumerRecord | None:
        """The run's next record, or None when the run is over (or its queue empty, or no
        longer this consumer's: a rebalance, a stop)."""
        fetcher = self.fetcher
        if fetcher is None or self.left <= 0 or fetchers.get(fetcher.tq) is not fetcher:
            self.fetcher = None
            return None
        consumed[fetcher.tq] = fetcher.delivered   # the record handed out before: processed
        records = fetcher.take(1)
        if not records:
            self.fetcher = None
            return None
        self.left -= 1
        return records[0]
