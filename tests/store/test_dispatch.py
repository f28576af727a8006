"""Live dispatch: what written batches queue for the consume queues and the index, and when
it is applied (the store-level failure paths are in test_failures.py)."""
from __future__ import annotations

from pathlib import Path

from ferry.codec.record import MessageIn
from ferry.store.appender import Appender
from ferry.store.commit_log import CommitLog
from ferry.store.consume_queues import ConsumeQueues
from ferry.store.dispatch import DISPATCH_BACKLOG, LiveDispatch
from ferry.store.index_file import IndexService

TS_MS = 1_700_000_000_000


class _Log:
    def __init__(self, root: Path) -> None:
        self.cl = CommitLog(str(root), 1 << 20)
        self.cl.set_positions(0)
        self.cqs = ConsumeQueues(str(root), 1024)
        self.index = IndexService(str(root), 64, 8192)
        self.dispatch = LiveDispatch(self.cl, self.cqs, self.index)
        self.appender = Appender(self.cl, self.cqs, self.dispatch, 16 * 1024, "")

    def put(self, msgs: list[MessageIn]) -> list[int]:
        results = self.appender.commit(self.appender.stage(msgs, TS_MS))
        assert isinstance(results, list)
        return [r.phy_offset for r in results]

    def close(self) -> None:
        self.cqs.close()
        self.index.close()
        self.cl.close()


def test_queued_until_dispatched_then_applied_in_order(tmp_path: Path) -> None:
    log = _Log(tmp_path)
    first = log.put([MessageIn("a", 0, b"0", keys="k"), MessageIn("b", 0, b"1")])
    second = log.put([MessageIn("a", 0, b"2"), MessageIn("a", 0, b"3", keys="k")])
    assert log.cqs.find("a", 0) is None  # nothing applied yet
    assert log.dispatch.dispatched_offset == 0 < log.cl.write_offset
    log.dispatch.dispatch()
    assert log.dispatch.dispatched_offset == log.cl.write_offset
    cq = log.cqs.find("a", 0)
    assert cq is not None and cq.max_offset == 3
    assert [phy for phy, _, _ in cq.get(0, 3)] == [first[0], *second]
    assert sorted(log.index.query(b"Ka\x00k", 0, 2**62, 8)) == [first[0], second[1]]
    log.close()


def test_a_long_queue_is_applied_by_the_append_itself(tmp_path: Path) -> None:
    log = _Log(tmp_path)
    for i in range(DISPATCH_BACKLOG):
        log.put([MessageIn("t", 0, bytes([i % 256]))])
    cq = log.cqs.find("t", 0)
    assert cq is not None and cq.max_offset == DISPATCH_BACKLOG
    assert log.dispatch.dispatched_offset == log.cl.write_offset
    log.close()
