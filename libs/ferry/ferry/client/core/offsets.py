"""Where a consumer keeps its queue positions: at the broker (clustering) or locally (broadcasting).

Clustering groups share positions, so they live at each queue's broker
(COMMIT_OFFSET / QUERY_OFFSET): at the group's master, or at a slave while the
group has no master or the queue's fetcher found the master unreachable (slaves
accept COMMIT_OFFSET and keep it; the slave that becomes master keeps what it
has). In broadcasting mode every member reads every
queue for itself, so positions are its own: kept in memory and, when a path
is given, in a small JSON file written atomically (temp file + rename).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.errors import TopicNotFoundError
from ferry.wire import RequestCode


class Committed(NamedTuple):
    """A queue's committed offset as its store has it."""

    offset: int | None   # None: never committed there
    hist: str | None     # the history of the record before it (issue 16), None: not known
    since_ms: int = 0    # with offset None: since when the broker's offset table exists (0: unknown)


class OffsetStore(Protocol):
    """Loads and stores the next offset to consume per queue."""

    async def load(self, tq: TopicQueue) -> int | None: ...
    async def load_with_hist(self, tq: TopicQueue) -> Committed: ...
    async def commit(self, offsets: dict[TopicQueue, int],
                     hists: dict[TopicQueue, str] | None = None) -> None: ...
    async def close(self) -> None: ...


async def broker_addr(routes: RouteCache, tq: TopicQueue) -> str:
    """The wire address of the master broker holding `tq`."""
    route = await routes.route(tq.topic)
    addr = route.broker_addr(tq.broker)
    if addr is None:
        routes.invalidate(tq.topic)
        raise TopicNotFoundError(f"broker {tq.broker} does not serve {tq.topic} (now)")
    return addr


async def read_addr(routes: RouteCache, tq: TopicQueue) -> str:
    """The broker to read `tq`'s offsets and bounds from: its master, else a slave of the group."""
    route = await routes.route(tq.topic)
    group = route.broker(tq.broker)
    if group is not None and (group.master or group.slaves):
        return group.master or group.slaves[0]
    routes.invalidate(tq.topic)
    raise TopicNotFoundError(f"broker {tq.broker} does not serve {tq.topic} (now)")


async def queue_bounds(pool: ConnectionPool, routes: RouteCache,
                       tq: TopicQueue) -> tuple[int, int]:
    """The (min, max) offsets of `tq` as its broker (the master, else a slave) reports them now."""
    addr = await read_addr(routes, tq)
    resp = await pool.request(addr, RequestCode.GET_MIN_MAX,
                              {"topic": tq.topic, "queue_id": tq.queue_id})
    return int(resp.fields["min_offset"]), int(resp.fields["max_offset"])


class RemoteOffsetStore:
    """Group offsets stored at each queue's broker.

    `commit_addr(tq)` (the consumer's fetchers) names where a queue's commit goes
    (None: the group's master, else a slave).
    """

    def __init__(self, pool: ConnectionPool, routes: RouteCache, group: str,
                 commit_addr: Callable[[TopicQueue], str | None] | None = None) -> None:
        self.pool = pool
        self.routes = routes
        self.group = group
        self.commit_addr = commit_addr

    async def load(self, tq: TopicQueue) -> int | None:
        return (await self.load_with_hist(tq))[0]

    async def load_with_hist(self, tq: TopicQueue) -> Committed:
        """The committed offset, the history id committed with it, and (never committed)
        since when the broker keeps offsets."""
        addr = await read_addr(self.routes, tq)
        resp = await self.pool.request(addr, RequestCode.QUERY_OFFSET, {
            "group": self.group, "topic": tq.topic, "queue_id": tq.queue_id})
        offset = int(resp.fields.get("offset", -1))
        hist = resp.fields.get("hist")
        if offset < 0:
            since = resp.fields.get("since_ms")
            return Committed(None, None, since if type(since) is int else 0)
        return Committed(offset, hist if isinstance(hist, str) else None)

    async def commit(self, offsets: dict[TopicQueue, int],
                     hists: dict[TopicQueue, str] | None = None) -> None:
        for tq, offset in sorted(offsets.items()):
            addr = (self.commit_addr(tq) if self.commit_addr is not None else None) \
                or await read_addr(self.routes, tq)
            fields: dict[str, object] = {"group": self.group, "topic": tq.topic,
                                         "queue_id": tq.queue_id, "offset": offset}
            if hists and (hist := hists.get(tq)) is not None:
                fields["hist"] = hist
            await self.pool.request(addr, RequestCode.COMMIT_OFFSET, fields)

    async def close(self) -> None:
        return None


class LocalOffsetStore:
    """Offsets kept by this consumer alone, optionally persisted to a JSON file.

    Each offset is kept with the history of the record before it (issue 16), so that
    the first PULL after a restart carries it: a broker whose log was replaced since
    (a lost disk, an unclean restart) sends the consumer back instead of serving it
    past records it never read. A file from before issue 16 has no `hist`: those
    pulls are checked only against the queue's end."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._offsets: dict[TopicQueue, int] = {}
        self._hists: dict[TopicQueue, str] = {}
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_text())
            for item in data.get("offsets", []):
                tq = TopicQueue(str(item["topic"]), str(item["broker"]), int(item["queue_id"]))
                self._offsets[tq] = int(item["offset"])
                if isinstance(hist := item.get("hist"), str):
                    self._hists[tq] = hist

    async def load(self, tq: TopicQueue) -> int | None:
        return self._offsets.get(tq)

    async def load_with_hist(self, tq: TopicQueue) -> Committed:
        offset = self._offsets.get(tq)
        return Committed(offset, self._hists.get(tq) if offset is not None else None)

    async def commit(self, offsets: dict[TopicQueue, int],
                     hists: dict[TopicQueue, str] | None = None) -> None:
        self._offsets.update(offsets)
        for tq in offsets:   # an offset committed without a history forgets the old one
            if hists and (hist := hists.get(tq)) is not None:
                self._hists[tq] = hist
            else:
                self._hists.pop(tq, None)
        self._persist()

    def _persist(self) -> None:
        if self.path is None:
            return
        items: list[dict[str, object]] = []
        for tq, o in sorted(self._offsets.items()):
            item: dict[str, object] = {"topic": tq.topic, "broker": tq.broker,
                                       "queue_id": tq.queue_id, "offset": o}
            if (hist := self._hists.get(tq)) is not None:
                item["hist"] = hist
            items.append(item)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"offsets": items}, indent=1))
        os.replace(tmp, self.path)  # a crash leaves the old file or the new one, never half

    async def close(self) -> None:
        self._persist()
