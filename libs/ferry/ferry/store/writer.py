"""StoreWriter: the store's write side, every path that adds to or cuts the log.

It holds what appends share: the appender (stage and commit a batch, appender.py),
the live dispatch to the consume queues and index (dispatch.py), the page warmer,
the last store timestamp, and the sticky failure that makes the store refuse
appends until reopened. MessageStore calls it under its lock, once per batch,
chunk or truncation: nothing here takes a lock.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ferry.codec.record import MessageIn
from ferry.errors import StoreError

from . import replica
from .appender import Appender
from .commit_log import CommitLog
from .config import FlushMode, StoreConfig
from .consume_queues import ConsumeQueues
from .dispatch import LiveDispatch
from .encode_context import Staged
from .index_file import IndexService
from .results import BatchPutResult, PutResult
from .warmer import PageWarmer

log = logging.getLogger(__name__)


class StoreWriter:
    """Appends (put, encoded, replicated) and truncation of one open store, and its failure."""

    def __init__(self, config: StoreConfig, cl: CommitLog, cqs: ConsumeQueues,
                 index: IndexService, last_store_ts_ms: int) -> None:
        self._config = config
        self._cl = cl
        self._cqs = cqs
        self._index = index
        self.warmer: PageWarmer | None = None
        if config.warm_ahead_bytes:
            self.warmer = PageWarmer(cl.dir, config.commitlog_segment_bytes,
                                     config.warm_ahead_bytes, cl.write_offset,
                                     zero=config.flush_mode is FlushMode.SYNC)
        self.dispatcher = LiveDispatch(cl, cqs, index, self.dispatch_failed)
        self._appender = Appender(cl, cqs, self.dispatcher, config.max_message_bytes,
                                  config.store_host, self.warmer)
        self._last_store_ts = last_store_ts_ms
        # Why appends are refused (see MessageStore.failure); sticky until reopened.
        self.failed: BaseException | None = None

    # -- failure -----------------------------------------------------------------------

    def fail(self, exc: BaseException, what: str) -> None:
        if self.failed is None:
            self.failed = exc
            log.error("%s failed (%s: %s); the store refuses appends until reopened",
                      what, type(exc).__name__, exc)

    def flush_failed(self, exc: BaseException) -> None:
        self.fail(exc, "the flush thread")

    def dispatch_failed(self, exc: BaseException) -> None:
        self.fail(exc, "dispatching to the consume queues and index")

    def dispatch(self) -> None:
        """Apply the deferred dispatch; on failure keep it pending (retried on the next
        call) and fail the store for appends, but let the read go on."""
        try:
            self.dispatcher.dispatch()
        except Exception as exc:
            self.dispatch_failed(exc)

    # -- append ------------------------------------------------------------------------

    def _store_ts(self) -> int:
        # Store timestamps never go backwards, so offset_for_timestamp can bisect.
        now = int(time.time() * 1000)
        return now if now > self._last_store_ts else self._last_store_ts

    def put_batch(self, msgs: Sequence[MessageIn]) -> list[PutResult]:
        """MessageStore.put_batch, once the store is known open."""
        ts = self._store_ts()
        return self._commit(self._appender.stage(msgs, ts), ts)  # type: ignore[return-value]

    def put_encoded_batch(self, topic: str, queue_id: int, encoded: bytes | bytearray | memoryview,
                          born_host: str, max_messages: int | None,
                          refuse_flags: int) -> BatchPutResult:
        """MessageStore.put_encoded_batch, once the store is known open."""
        ts = self._store_ts()
        staged = self._appender.stage_encoded(topic, queue_id, encoded, born_host, ts,
                                              max_messages, refuse_flags)  # type: ignore[arg-type]
        return self._commit(staged, ts)  # type: ignore[return-value]

    def _commit(self, staged: Staged, ts: int) -> list[PutResult] | BatchPutResult:
        try:
            results = self._appender.commit(staged)
        except BaseException as exc:
            self.failed = exc
            log.exception("append failed; the store refuses appends until reopened")
            raise StoreError(f"append failed: {exc}") from exc
        self._last_store_ts = ts
        return results

    # -- replication -------------------------------------------------------------------

    def append_replicated(self, phy_offset: int, data: bytes | bytearray | memoryview,
                          touched: set[tuple[str, int]] | None) -> int:
        """MessageStore.append_replicated up to the durability wait: return the new log end."""
        chunk = replica.check_chunk(self._cl, self._appender.next_queue_offset, phy_offset, data)
        if chunk.end == phy_offset:
            return phy_offset
        warmer = self.warmer
        try:
            if warmer is not None:
                warmer.before_write(chunk.end)
            replica.write_chunk(self._cl, data, chunk)
        except BaseException as exc:
            self.failed = exc
            log.exception("replicated append failed; the store refuses appends until reopened")
            raise StoreError(f"replicated append failed: {exc}") from exc
        if warmer is not None and chunk.end >= warmer.next_kick_offset:
            warmer.wrote_to(chunk.end)
        if chunk.dispatch.index_items:
            self.dispatcher.add(phy_offset, chunk.dispatch.queues, chunk.dispatch.index_items)
        self._appender.next_queue_offset.update(chunk.next_queue_offset)
        if touched is not None:
            touched.update(chunk.next_queue_offset)
        self._last_store_ts = max(self._last_store_ts, chunk.last_store_ts_ms)
        return chunk.end

    def truncate_to(self, phy_offset: int) -> None:
        """MessageStore.truncate_to's cut of the files, at a checked record boundary."""
        replica.check_boundary(self._cl, phy_offset)
        try:
            self.dispatcher.dispatch()
            replica.cut_store(self._config.root_dir, self._cl, self._cqs, self._index, phy_offset)
        except BaseException as exc:
            self.fail(exc, "truncation")
            raise StoreError(f"truncate_to({phy_offset}) failed: {exc}") from exc
        self._appender.next_queue_offset = {(cq.topic, cq.queue_id): cq.max_offset
                                            for cq in self._cqs}
