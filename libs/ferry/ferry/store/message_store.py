"""MessageStore: the store's facade, the one object the broker and tools use.

It owns the commit log, the consume queues, the index, the flush thread and the
checkpoint, and holds them consistent: every call that touches them runs under
one lock (writes come from one thread anyway; the lock keeps the checkpoint
thread and readers on other threads safe). See docs/internals.md
for the API and docs/store-format.md for the files.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from ferry.codec.limits import MSG_ID_BYTES
from ferry.codec.record import AT_STORE_TS_MS, HEADER_SIZE, I64, MessageIn, StoredMessage
from ferry.errors import StoreError
from ferry.names import validate_topic

from . import replica
from .appender import Appender
from .checkpoint import Checkpoint, sync_files, write_checkpoint
from .commit_log import CommitLog
from .config import FlushMode, StoreConfig
from .consume_queues import ConsumeQueues
from .dispatch import LiveDispatch
from .encode_context import Staged
from .flush import FlushService
from .histories import QueueHistory, StoreHistories
from .id_index import find_by_id
from .index_file import IndexService
from .index_keys import message_key
from .io_errors import os_errors_as_store_errors
from .reader import FileSpan, RecordMatch, cold_spans, read_checked, read_entries, read_message
from .recovery import RecoveryReport, recover
from .results import BatchPutResult, GetResult, GetStatus, PutResult
from .retention import RetentionFloor
from .retention_runner import RetentionReport, run_retention
from .warmer import PageWarmer

log = logging.getLogger(__name__)



class MessageStore:
    """An open log store directory: append, read by queue, query, retain, close."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        root = config.root_dir
        os.makedirs(root, exist_ok=True)
        self._lock_fd = _lock_directory(root)
        self._lock = threading.Lock()
        # Held by each checkpoint and by truncate_to, taken before `_lock`: a checkpoint
        # computed before a truncation must not be written after it.
        self._checkpoint_lock = threading.Lock()
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
        self._warmer: PageWarmer | None = None
        if config.warm_ahead_bytes:
            self._warmer = PageWarmer(self._cl.dir, config.commitlog_segment_bytes,
                                      config.warm_ahead_bytes, self._cl.write_offset,
                                      zero=config.flush_mode is FlushMode.SYNC)
        self._dispatcher = LiveDispatch(self._cl, self._cqs, self._index, self._dispatch_failed)
        self._appender = Appender(self._cl, self._cqs, self._dispatcher, config.max_message_bytes,
                                  config.store_host, self._warmer)
        self._last_store_ts = self.recovery.last_store_ts_ms
        self._failed: BaseException | None = None
        # Files (and directories) a checkpoint could not sync yet; the next one does.
        self._unsynced: list[str] = []
        self._unsynced_dirs: set[str] = set()
        write_checkpoint(root, Checkpoint(self._cl.flushed_offset, self._cl.write_offset, False))
        self._flush = FlushService(
            self._cl, interval_ms=config.flush_interval_ms, timeout_ms=config.sync_flush_timeout_ms,
            checkpoint_interval_ms=config.checkpoint_interval_ms, on_checkpoint=self._checkpoint,
            on_failure=self._flush_failed)
        self._flush.start()
        if self._warmer is not None:  # started last: nothing after it can fail the open
            self._warmer.start()

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
            if self._closed or self._failed is not None:
                self._check_open()
            now = int(time.time() * 1000)
            # Store timestamps never go backwards, so offset_for_timestamp can bisect.
            ts = now if now > self._last_store_ts else self._last_store_ts
            results = self._commit(self._appender.stage(msgs, ts), ts)
            return results  # type: ignore[return-value]

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
            ts = self._store_ts()
            staged = self._appender.stage_encoded(topic, queue_id, encoded, born_host, ts,
                                                  max_messages, refuse_flags)  # type: ignore[arg-type]
            return self._commit(staged, ts)  # type: ignore[return-value]

    def _check_open(self) -> None:
        if self._closed or self._failed is not None:
            raise StoreError("the store is closed" if self._closed else
                             f"the store failed ({self._failed}); reopen it to recover")

    def _check_readable(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    @property
    def failure(self) -> BaseException | None:
        """Why the store refuses appends (an append or dispatch I/O error, a dead flush
        thread), or None while it takes them. Sticky until reopened; reads keep working."""
        return self._failed

    @property
    def flush_thread_alive(self) -> bool:
        """True while the flush thread runs: without it nothing becomes durable."""
        return self._flush.alive

    def _fail(self, exc: BaseException, what: str) -> None:
        if self._failed is None:
            self._failed = exc
            log.error("%s failed (%s: %s); the store refuses appends until reopened",
                      what, type(exc).__name__, exc)

    def _flush_failed(self, exc: BaseException) -> None:
        self._fail(exc, "the flush thread")

    def _dispatch_failed(self, exc: BaseException) -> None:
        self._fail(exc, "dispatching to the consume queues and index")

    def _dispatch(self) -> None:
        """Apply the deferred dispatch; on failure keep it pending (retried on the next
        call) and fail the store for appends, but let the read go on."""
        try:
            self._dispatcher.dispatch()
        except Exception as exc:
            self._dispatch_failed(exc)

    def _store_ts(self) -> int:
        # Store timestamps never go backwards, so offset_for_timestamp can bisect.
        now = int(time.time() * 1000)
        return now if now > self._last_store_ts else self._last_store_ts

    def _commit(self, staged: Staged, ts: int) -> list[PutResult] | BatchPutResult:
        try:
            results = self._appender.commit(staged)
        except BaseException as exc:
            self._failed = exc
            log.exception("append failed; the store refuses appends until reopened")
            raise StoreError(f"append failed: {exc}") from exc
        self._last_store_ts = ts
        return results

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
                     stop_offset: int | None = None) -> GetResult:
        """Read up to max_count records (and max_bytes, but at least one) from a queue.

        `tag_hashes` filters in the consume queue, before the commit log is read;
        `match` then filters the checked records (a predicate over a record's bytes,
        called under the store's lock: keep it quick and free of I/O). None means
        no filter. Records either filter rejects are skipped: `next_queue_offset`
        is past them, and the status is NO_MATCHED_MESSAGE when none was left.
        `max_scan_ms` bounds the time a scan with `match` takes (checked every few
        dozen entries): it then stops early, `next_queue_offset` where it got to.
        `stop_offset` ends the read there (the end of a history: an answer never
        spans two, see histories.py).
        """
        with self._lock:
            self._check_readable()
            self._dispatch()
            cq = self._cqs.find(topic, queue_id)
            if cq is None or cq.max_offset == 0:
                return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
            lo, hi = cq.min_offset, cq.max_offset
            if queue_offset < lo:
                return GetResult(GetStatus.OFFSET_TOO_SMALL, [], lo, lo, hi)
            if queue_offset == hi:
                return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], hi, lo, hi)
            if queue_offset > hi:
                return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], hi, lo, hi)
            stop = hi if stop_offset is None or stop_offset <= queue_offset else min(hi, stop_offset)
            records, nxt = read_entries(self._cl, cq, queue_offset, stop, max_count, max_bytes,
                                        tag_hashes, match, max_scan_ms)
            status = GetStatus.FOUND if records else GetStatus.NO_MATCHED_MESSAGE
            return GetResult(status, records, nxt, lo, hi)

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
            self._dispatch()
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
            self._dispatch()
            cq = self._cqs.find(topic, queue_id)
            return cq.min_offset if cq is not None else 0

    @os_errors_as_store_errors
    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue)."""
        with self._lock:
            self._check_readable()
            self._dispatch()
            cq = self._cqs.find(topic, queue_id)
            return cq.max_offset if cq is not None else 0

    @os_errors_as_store_errors
    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after ts_ms (max_offset when none is)."""
        with self._lock:
            self._check_readable()
            self._dispatch()
            cq = self._cqs.find(topic, queue_id)
            if cq is None:
                return 0
            lo, hi = cq.min_offset, cq.max_offset
            while lo < hi:  # store timestamps never decrease along a queue
                mid = (lo + hi) // 2
                entry = cq.get(mid, 1)
                head = self._cl.read(entry[0][0], HEADER_SIZE) if entry else None
                if head is None or I64.unpack_from(head, AT_STORE_TS_MS)[0] < ts_ms:
                    lo = mid + 1
                else:
                    hi = mid
            return lo

    @os_errors_as_store_errors
    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                     max_count: int = 64) -> list[StoredMessage]:
        """Messages of `topic` carrying `key`, stored in [begin_ms, end_ms], newest first."""
        topic_b = validate_topic(topic, allow_internal=True).encode()
        if not key or " " in key:
            return []
        with self._lock:
            self._check_readable()
            self._dispatch()
            phys = self._index.query(message_key(topic_b, key.encode()), begin_ms, end_ms,
                                     max_count + 16)  # spare room for hash collisions
            out: list[StoredMessage] = []
            for phy in phys:
                msg = read_message(self._cl, phy)
                if (msg is not None and msg.topic == topic and key in msg.keys.split(" ")
                        and begin_ms <= msg.store_ts_ms <= end_ms):
                    out.append(msg)
                    if len(out) >= max_count:
                        break
            return out

    @os_errors_as_store_errors
    def query_by_id(self, msg_id: bytes) -> StoredMessage | None:
        """The message with this 16-byte id, or None."""
        if len(msg_id) != MSG_ID_BYTES:
            return None
        with self._lock:
            self._check_readable()
            self._dispatch()
            return find_by_id(self._cl, self._index, bytes(msg_id))

    @os_errors_as_store_errors
    def topic_queues(self) -> dict[str, list[int]]:
        """Every topic the store holds, with its queue ids."""
        with self._lock:
            self._check_readable()
            self._dispatch()
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
            chunk = replica.check_chunk(self._cl, self._appender.next_queue_offset,
                                        phy_offset, data)
            if chunk.end == phy_offset:
                return phy_offset
            try:
                if self._warmer is not None:
                    self._warmer.before_write(chunk.end)
                replica.write_chunk(self._cl, data, chunk)
            except BaseException as exc:
                self._failed = exc
                log.exception("replicated append failed; the store refuses appends until reopened")
                raise StoreError(f"replicated append failed: {exc}") from exc
            if self._warmer is not None and chunk.end >= self._warmer.next_kick_offset:
                self._warmer.wrote_to(chunk.end)
            if chunk.dispatch.index_items:
                self._dispatcher.add(phy_offset, chunk.dispatch.queues, chunk.dispatch.index_items)
            self._appender.next_queue_offset.update(chunk.next_queue_offset)
            if touched is not None:
                touched.update(chunk.next_queue_offset)
            self._last_store_ts = max(self._last_store_ts, chunk.last_store_ts_ms)
        if self.config.flush_mode is FlushMode.SYNC:
            self.wait_durable(chunk.end).result()
        return chunk.end

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
        with self._checkpoint_lock, self._lock:
            self._check_open()
            if phy_offset == self._cl.write_offset:
                return
            replica.check_boundary(self._cl, phy_offset)
            try:
                self._dispatcher.dispatch()
                replica.cut_store(self.config.root_dir, self._cl, self._cqs, self._index,
                                  phy_offset)
            except BaseException as exc:
                self._fail(exc, "truncation")
                raise StoreError(f"truncate_to({phy_offset}) failed: {exc}") from exc
            self._appender.next_queue_offset = {(cq.topic, cq.queue_id): cq.max_offset
                                                for cq in self._cqs}
            # What is written from the cut on continues nothing a reader saw past it: a new
            # local run (epochs, which a follower truncates itself, take precedence).
            self.histories.start_run(phy_offset)

    # -- maintenance ---------------------------------------------------------------------

    @os_errors_as_store_errors
    def run_retention(self, now_ms: int | None = None,
                      floor: RetentionFloor | None = None) -> RetentionReport:
        """Delete expired commit-log segments (or the oldest, over the disk high-water mark,
        none holding a record `floor` protects: retention.py)."""
        with self._lock:
            self._check_readable()
            self._dispatch()
            return run_retention(self.config, self._cl, self._cqs, self._index, now_ms, floor)

    def _checkpoint(self) -> None:
        """Checkpoint thread (flush.py): make queues and index durable, then record how far.

        Only the dispatch and the collection of dirty files run under the store
        lock; their fdatasyncs run outside it (an msync of a mapping holds the GIL
        for its whole call and would freeze the broker's event loop).
        """
        with self._checkpoint_lock:
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._dispatch()
            dispatched = self._dispatcher.dispatched_offset
            paths = self._unsynced + self._cqs.take_dirty() + self._index.take_dirty()
            dirs = self._unsynced_dirs | self._cqs.take_new_dirs() | self._index.take_new_dirs()
            self._unsynced, self._unsynced_dirs = [], set()
        try:
            sync_files(paths)
            sync_files(sorted(dirs), data_only=False)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            # Out of descriptors for a moment: not a dead disk. Keep the files for the
            # next checkpoint and skip this one (the last checkpoint stays valid).
            self._unsynced, self._unsynced_dirs = paths, dirs
            log.warning("checkpoint skipped: no file descriptor to sync with (%s)", exc)
            return
        flushed = self._cl.flush(dispatched)
        write_checkpoint(self.config.root_dir, Checkpoint(flushed, dispatched, False))

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
            if self._warmer is not None:
                self._warmer.stop()
            with self._lock:
                try:
                    self._dispatcher.dispatch()  # those records are fully written: apply them
                except Exception as exc:
                    self._dispatch_failed(exc)
                try:
                    self._cqs.flush()
                    self._index.flush()
                    sync_files(sorted(self._cqs.take_new_dirs() | self._index.take_new_dirs()),
                               data_only=False)
                    self._cl.flush()
                    write_checkpoint(self.config.root_dir, Checkpoint(
                        self._cl.flushed_offset, self._dispatcher.dispatched_offset,
                        self._failed is None))
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


def _lock_directory(root: str) -> int:
    """Hold an exclusive lock on the store directory for the life of the process."""
    fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"store directory {root} is in use by another process") from None
    return fd
