"""MessageStore: the store's facade, the one object the broker and tools use.

It opens the store directory (lock, files, recovery), holds the commit log, the
consume queues, the index and the flush thread, and keeps them consistent: every
call that touches them runs under one lock (writes come from one thread anyway;
the lock keeps the checkpoint thread and readers on other threads safe). The
work itself lives in modules of its own, called once per call (a batch, a pull,
a chunk), never per message: writer.py (appends, truncation, failure),
reader.py and lookups.py (reads), checkpointer.py, retention_runner.py.
See docs/internals.md for the API and docs/store-format.md for the files.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from ferry.codec.limits import MSG_ID_BYTES
from ferry.codec.record import MessageIn, StoredMessage
from ferry.errors import StoreError
from ferry.names import validate_topic

from . import replica
from .checkpointer import Checkpointer
from .commit_log import CommitLog
from .config import FlushMode, StoreConfig
from .consume_queues import ConsumeQueues
from .dir_lock import lock_directory
from .flush import FlushService
from .histories import QueueHistory, StoreHistories
from .id_index import find_by_id
from .index_file import IndexService
from .io_errors import os_errors_as_store_errors
from .lookups import find_by_key, offset_for_timestamp
from .reader import FileSpan, RecordMatch, cold_spans, read_checked, read_message, read_queue
from .recovery import RecoveryReport, recover
from .results import BatchPutResult, GetResult, PutResult
from .retention import RetentionFloor
from .retention_runner import RetentionReport, run_retention
from .topic_retention import TopicRetention
from .writer import StoreWriter


class MessageStore:
    """An open log store directory: append, read by queue, query, retain, close."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        root = config.root_dir
        os.makedirs(root, exist_ok=True)
        self._lock_fd = lock_directory(root)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._cl = CommitLog(root, config.commitlog_segment_bytes)
            self._cqs = ConsumeQueues(root, config.cq_entries_per_segment,
                                      config.mapped_segments_budget)
            self._index = IndexService(root, config.index_max_slots, config.index_max_entries)
            self.recovery: RecoveryReport = recover(root, self._cl, self._cqs, self._index)
            # After recovery: an unclean open starts a new history (its tail may be cut).
            self.histories = StoreHistories(root, self._cl.write_offset, self.recovery.clean)
        except BaseException:
            os.close(self._lock_fd)
            raise
        writer = self._writer = StoreWriter(config, self._cl, self._cqs, self._index,
                                            self.recovery.last_store_ts_ms)
        self._checkpointer = Checkpointer(root, self._cl, self._cqs, self._index,
                                          writer.dispatcher, self._lock, writer.dispatch,
                                          lambda: self._closed)
        self._checkpointer.mark_open()
        self._flush = FlushService(
            self._cl, interval_ms=config.flush_interval_ms, timeout_ms=config.sync_flush_timeout_ms,
            checkpoint_interval_ms=config.checkpoint_interval_ms,
            on_checkpoint=self._checkpointer.checkpoint, on_failure=writer.flush_failed)
        self._flush.start()
        if writer.warmer is not None:  # started last: nothing after it can fail the open
            writer.warmer.start()

    # -- append ------------------------------------------------------------------------

    def put(self, msg: MessageIn) -> PutResult:
        """Append one message; see put_batch."""
        return self.put_batch((msg,))[0]

    def put_batch(self, msgs: Sequence[MessageIn]) -> list[PutResult]:
        """Append messages in one write, dispatch them, return where each went.

        The messages are encoded as the batch input of `put_encoded_batch` and staged
        by the same loop, a run per consecutive messages with the same topic, queue,
        born host, reconsume_times and prepared_offset. The whole batch is validated
        first: a bad message raises (InvalidNameError, MessageTooLargeError,
        MalformedRequestError) and nothing is written. An empty or all-zero msg_id
        is assigned by the store.
        """
        with self._lock:
            if self._closed or self._writer.failed is not None:
                self._check_open()
            return self._writer.put_batch(msgs)

    def put_encoded_batch(self, topic: str, queue_id: int, encoded: bytes | bytearray | memoryview,
                          *, born_host: str = "", max_messages: int | None = None,
                          refuse_flags: int = 0) -> BatchPutResult:
        """Append a batch already encoded in the message batch input layout, in one write.

        `encoded` holds the messages of one queue back to back, each laid out as
        `ferry.codec.entry.ENTRY_HEAD` then its tags, keys, properties and body (the
        wire's SEND body); an all-zero msg_id is assigned by the store. The whole
        batch is validated first and nothing is written if any entry is bad:
        MalformedRequestError (truncated or inconsistent, not UTF-8, empty, more than
        `max_messages`, an entry whose flags share a bit with `refuse_flags`),
        MessageTooLargeError, InvalidNameError.
        """
        with self._lock:
            self._check_open()
            return self._writer.put_encoded_batch(topic, queue_id, encoded, born_host,
                                                  max_messages, refuse_flags)

    def _check_open(self) -> None:
        if self._closed or self._writer.failed is not None:
            raise StoreError("the store is closed" if self._closed else
                             f"the store failed ({self._writer.failed}); reopen it to recover")

    def _check_readable(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    @property
    def failure(self) -> BaseException | None:
        """Why the store refuses appends (an append or dispatch I/O error, a dead flush
        thread), or None while it takes them. Sticky until reopened; reads keep working."""
        return self._writer.failed

    @property
    def flush_thread_alive(self) -> bool:
        """True while the flush thread runs: without it nothing becomes durable."""
        return self._flush.alive

    def wait_durable(self, end_offset: int, start: bool = True) -> Future[None]:
        """A Future resolved once the commit log is fdatasync'd up to `end_offset`.

        Never blocks. Fails with FlushTimeoutError after sync_flush_timeout_ms.
        Appends flushed together share one Future: wrap it once per group.
        `start=False`: the group's fdatasync waits for `start_flush()` (or the
        flush interval), so that appends made in a row share it (flush.py).
        """
        return self._flush.wait_durable(end_offset, start)

    def start_flush(self) -> None:
        """Start the fdatasync of the group that `wait_durable(start=False)` left waiting."""
        self._flush.start_pending()

    # -- read --------------------------------------------------------------------------

    @os_errors_as_store_errors
    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
                     max_bytes: int = 1 << 20, tag_hashes: set[int] | frozenset[int] | None = None,
                     match: RecordMatch | None = None, max_scan_ms: float | None = None,
                     stop_offset: int | None = None, check: bool = True) -> GetResult:
        """Read up to max_count records (and max_bytes, but at least one) from a queue.

        `tag_hashes` filters in the consume queue, before the commit log is read;
        `match` then filters the checked records (a predicate over a record's bytes,
        called under the store's lock: keep it quick and free of I/O). None means
        no filter. Records either filter rejects are skipped: `next_queue_offset`
        is past them, and the status is NO_MATCHED_MESSAGE when none was left.
        `max_scan_ms` bounds the time a scan with `match` takes (checked every few
        dozen entries): it then stops early, `next_queue_offset` where it got to.
        `stop_offset` ends the read there (the end of a history: an answer never
        spans two, see histories.py). `check` False: unchecked records (reader.py).
        """
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            return read_queue(self._cl, self._cqs.find(topic, queue_id), queue_offset, max_count,
                              max_bytes, tag_hashes, match, max_scan_ms, stop_offset, check)

    @os_errors_as_store_errors
    def cold_spans(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
                   max_bytes: int = 1 << 20) -> list[FileSpan]:
        """The commit-log file spans a get_messages from `queue_offset` would read that are
        not in the page cache (reader.cold_spans); [] when there are none or nothing to
        read. Give them to `reader.load_spans` on another thread, then call get_messages."""
        with self._lock:
            self._check_readable()
            cq = self._cqs.find(topic, queue_id)
            if cq is None or not cq.min_offset <= queue_offset < cq.max_offset:
                return []
            return cold_spans(self._cl, cq, queue_offset, cq.max_offset, max_count, max_bytes)

    @os_errors_as_store_errors
    def queue_history(self, topic: str, queue_id: int) -> QueueHistory:
        """The queue's histories and their first queue offsets (histories.py); for a queue
        not stored yet, every history starts at 0."""
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            cq = self._cqs.find(topic, queue_id)
            if cq is None:
                bounds = self.histories.boundaries()
                return QueueHistory([h for h, _ in bounds], [0] * len(bounds))
            return self.histories.of_queue(cq)

    def history_boundaries(self) -> list[tuple[str, int]]:
        """Every history id with the commit-log offset where it begins (for stats)."""
        with self._lock:
            return list(self.histories.boundaries())

    @os_errors_as_store_errors
    def get_message(self, phy_offset: int) -> StoredMessage | None:
        """The record at a commit-log offset, or None when no valid record starts there."""
        with self._lock:
            self._check_readable()
            return read_message(self._cl, phy_offset)

    @os_errors_as_store_errors
    def read_raw(self, phy_offset: int) -> bytes | None:
        """The record bytes at a commit-log offset, checked (CRC, lengths, its own offset).

        None when no valid record starts there (never written, deleted by retention,
        damaged). Reads the commit log directly, so it works for records whose
        consume-queue entries retention already dropped.
        """
        with self._lock:
            self._check_readable()
            raw = read_checked(self._cl, phy_offset)
            return None if raw is None else bytes(raw)

    @os_errors_as_store_errors
    def min_offset(self, topic: str, queue_id: int) -> int:
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            cq = self._cqs.find(topic, queue_id)
            return cq.min_offset if cq is not None else 0

    @os_errors_as_store_errors
    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue)."""
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            cq = self._cqs.find(topic, queue_id)
            return cq.max_offset if cq is not None else 0

    @os_errors_as_store_errors
    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after ts_ms (max_offset when none is)."""
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            cq = self._cqs.find(topic, queue_id)
            if cq is None:
                return 0
            return offset_for_timestamp(self._cl, cq, ts_ms)

    @os_errors_as_store_errors
    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                     max_count: int = 64) -> list[StoredMessage]:
        """Messages of `topic` carrying `key`, stored in [begin_ms, end_ms], newest first."""
        validate_topic(topic, allow_internal=True)
        if not key or " " in key:
            return []
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            return find_by_key(self._cl, self._index, topic, key, begin_ms, end_ms, max_count)

    @os_errors_as_store_errors
    def query_by_id(self, msg_id: bytes) -> StoredMessage | None:
        """The message with this 16-byte id, or None."""
        if len(msg_id) != MSG_ID_BYTES:
            return None
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            return find_by_id(self._cl, self._index, bytes(msg_id))

    @os_errors_as_store_errors
    def topic_queues(self) -> dict[str, list[int]]:
        """Every topic the store holds, with its queue ids."""
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            out: dict[str, list[int]] = {}
            for cq in self._cqs:
                out.setdefault(cq.topic, []).append(cq.queue_id)
            return {t: sorted(q) for t, q in sorted(out.items())}

    @property
    def commit_log_min_offset(self) -> int:
        return self._cl.min_offset

    @property
    def commit_log_max_offset(self) -> int:
        return self._cl.write_offset

    @property
    def flushed_offset(self) -> int:
        return self._cl.flushed_offset

    # -- replication (issue 9; see replica.py) -----------------------------------------

    @os_errors_as_store_errors
    def read_log(self, from_phy: int, max_bytes: int) -> bytes:
        """Raw commit-log bytes from the record at `from_phy`, whole records only, for a
        slave's `append_replicated` (see replica.read_log): at most `max_bytes` but at
        least one record, b"" at the end; StoreError for an offset that is no record
        start or is out of range."""
        with self._lock:
            self._check_readable()
            return replica.read_log(self._cl, from_phy, max_bytes)

    def append_replicated(self, phy_offset: int, data: bytes | bytearray | memoryview,
                          touched: set[tuple[str, int]] | None = None) -> int:
        """Append a chunk of a master's commit log as it is; return the new log end.

        `phy_offset` must be this log's end. Every record is checked first (size,
        magic, CRC, its own phy offset, the next queue offset of its queue) and a bad
        chunk raises StoreError with nothing written. Consume queues and the index
        are then built by the same dispatch as a put. In FlushMode.SYNC this returns
        once the chunk is durable (a slave acknowledges only what it has on disk).
        `touched`, when given, gets the (topic, queue_id) of every record appended
        (to wake long polls without walking the chunk again).
        """
        with self._lock:
            self._check_open()
            end = self._writer.append_replicated(phy_offset, data, touched)
        if end != phy_offset and self.config.flush_mode is FlushMode.SYNC:
            self.wait_durable(end).result()
        return end

    def truncate_to(self, phy_offset: int) -> None:
        """Drop every record from `phy_offset` on (a record start, or the log end).

        The commit log is cut (zeros made durable, later segments deleted), consume
        queues lose their entries at or after it, and the index loses its keys of
        those records. (query_by_key and query_by_id verify each record they return
        anyway: its CRC, its own offset, topic and key or id; dropping the keys keeps
        a record appended later at the same offset from being found twice.) A lower
        checkpoint is written first, so a crash at any point recovers to the log
        before or after the truncation, never to a log with a hole.
        """
        with self._checkpointer.lock, self._lock:
            self._check_open()
            if phy_offset == self._cl.write_offset:
                return
            self._writer.truncate_to(phy_offset)
            # What is written from the cut on continues nothing a reader saw past it: a new
            # local run (epochs, which a follower truncates itself, take precedence).
            self.histories.start_run(phy_offset)

    # -- maintenance ---------------------------------------------------------------------

    @os_errors_as_store_errors
    def run_retention(self, now_ms: int | None = None, floor: RetentionFloor | None = None,
                      topics: Mapping[str, TopicRetention] | None = None) -> RetentionReport:
        """Delete expired commit-log segments (or the oldest, over the disk high-water mark,
        none holding a record `floor` protects: retention.py); `topics`: per-topic
        retention (topic_retention.py)."""
        with self._lock:
            self._check_readable()
            self._writer.dispatch()
            return run_retention(self.config, self._cl, self._cqs, self._index, now_ms, floor,
                                 topics)

    def close(self) -> None:
        """Flush everything, resolve pending waiters, mark a clean shutdown.

        The shutdown is marked clean only if every record was dispatched and the
        store never failed; otherwise the next open recovers (re-dispatches).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._flush.stop()
            if self._writer.warmer is not None:
                self._writer.warmer.stop()
            with self._lock:
                self._writer.dispatch()  # those records are fully written: apply them
                try:
                    self._checkpointer.final(clean=self._writer.failed is None)
                except OSError as exc:  # the last checkpoint stays (unclean): reopen recovers
                    raise StoreError(f"close could not flush the store: {exc}") from exc
        finally:
            with self._lock:
                self._cqs.close()
                self._index.close()
                self._cl.close()
                os.close(self._lock_fd)

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

