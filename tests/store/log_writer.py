"""Appends to a bare CommitLog through the store's real put path (the Appender)."""
from __future__ import annotations

from ferry.codec.record import HEADER_SIZE, MessageIn
from ferry.store.appender import Appender
from ferry.store.commit_log import CommitLog
from ferry.store.consume_queues import ConsumeQueues
from ferry.store.dispatch import LiveDispatch
from ferry.store.index_file import IndexService

TS_MS = 1_700_000_000_000


def record_size(body: bytes) -> int:
    """The size of a record written by `LogWriter` (topic "t", no hosts, tags or keys)."""
    return HEADER_SIZE + 1 + len(body)


class LogWriter:
    """Stage and commit messages to topic "t", queue 0, as MessageStore.put_batch does."""

    def __init__(self, root: str, cl: CommitLog) -> None:
        self.cqs = ConsumeQueues(root, 1024)
        self.index = IndexService(root, 64, 4096)
        self.appender = Appender(cl, self.cqs, LiveDispatch(cl, self.cqs, self.index), 16 * 1024, "")

    def append(self, bodies: list[bytes]) -> list[int]:
        """Write `bodies` in one batch; returns each record's phy offset."""
        staged = self.appender.stage([MessageIn("t", 0, b) for b in bodies], TS_MS)
        results = self.appender.commit(staged)
        assert isinstance(results, list)
        return [r.phy_offset for r in results]

    def close(self) -> None:
        self.cqs.close()
        self.index.close()
