"""The put path: validate and encode a batch in one pass, write it with one pwrite.

This is the hottest code of the broker (every message passes here once), so each
batch is one loop with everything bound to locals. `stage` validates every
message and encodes its record into a staging buffer, collecting its
consume-queue entry, index key hashes and result as it goes; a bad message
raises before a byte reaches the log (the staging buffer is scratch and nothing
else was touched). `commit` then writes the staged bytes with one pwrite per
segment touched and publishes the batch: queue offsets, then the queued dispatch.

Two inputs share this path: `MessageIn` tuples (`stage`) and the message batch
input layout (`stage_encoded`, whose loop lives in `batch_input.py`).
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from crc32c import crc32c

from ferry.errors import FerryError, MalformedRequestError, MessageTooLargeError

from .batch_input import stage_batch_input
from .commit_log import CommitLog
from .config import MAX_PROPERTIES_BYTES
from .consume_queue import CQ_ENTRY, ConsumeQueues
from .encode_context import (
    ID_KEY_CRC,
    KEEP_STAGING_BYTES,
    EncodeContext,
    QueueRun,
    Staged,
    checked_msg_id,
)
from .index_file import IndexService
from .record import (
    BLANK_SIZE,
    CRC_START,
    HEADER_SIZE,
    MAX_KEYS_BYTES,
    MSG_ID_BYTES,
    RECORD_MAGIC,
    MessageIn,
    new_msg_id,
)
from .results import BatchPutResult, PutResult, PutStatus
from .warmer import PageWarmer

# Queued index items beyond which an append applies the dispatch itself.
DISPATCH_BACKLOG = 512
_pack_crc = struct.Struct("<I").pack_into
_pack_entry = CQ_ENTRY.pack
_new_tuple = tuple.__new__
_OK = PutStatus.OK
_BAD_INPUT = (TypeError, ValueError, AttributeError, OverflowError, struct.error)


class Appender:
    """Encodes batches for one store; remembers each queue's next queue offset."""

    def __init__(self, commit_log: CommitLog, cqs: ConsumeQueues, index: IndexService,
                 max_message_bytes: int, store_host: str, warmer: PageWarmer | None = None,
                 on_dispatch_error: Callable[[BaseException], None] | None = None) -> None:
        self._cl = commit_log
        self._on_dispatch_error = on_dispatch_error
        self._cqs = cqs
        self._index = index
        self._warmer = warmer
        self._ctx = EncodeContext(max_message_bytes, store_host)
        self.next_queue_offset: dict[tuple[str, int], int] = {
            (cq.topic, cq.queue_id): cq.max_offset for cq in cqs}
        # Dispatch not yet applied: (topic, queue_id) -> [first queue offset, entries...]
        self._pending_queues: dict[tuple[str, int], list] = {}
        self._pending_index: list[tuple[int, int, int]] = []
        # Commit-log offset at or below the first record whose dispatch is pending.
        self._pending_from = commit_log.write_offset

    # -- staging -----------------------------------------------------------------------

    def stage(self, msgs: Sequence[MessageIn], ts: int) -> Staged:
        """Validate and encode `msgs` stored at `ts`; raises (writing nothing) if one is bad."""
        try:
            return self._stage(msgs, ts)
        except FerryError:
            raise
        except _BAD_INPUT as exc:
            # Wrong types or values that would break the encoder: a bad request, never a
            # failure of the store.
            raise MalformedRequestError(f"invalid message: {exc}") from None

    def _stage(self, msgs: Sequence[MessageIn], ts: int) -> Staged:
        ctx = self._ctx
        max_body, store_b, tag_cache, hosts, formats, queue_info = (
            ctx.max_body, ctx.store_b, ctx.tags, ctx.hosts, ctx.formats, ctx.queue_info)
        store_len = len(store_b)
        next_qoff = self.next_queue_offset
        seg = self._cl.active()
        seg_start, seg_bytes = seg.start_offset, seg.size
        rel = start_rel = self._cl.write_offset - seg_start
        limit = seg_bytes - BLANK_SIZE
        buf, mv = ctx.buf, ctx.mv
        cap, pos = len(buf), 0
        seals: list[tuple[int, int]] = []
        queues: dict[tuple[str, int], QueueRun] = {}
        items: list[tuple[int, int, int]] = []
        results: list[PutResult] = []
        add_item, add_result = items.append, results.append
        for (topic, qid, body, tags, keys, props, msg_id, flags, born_ts, born_host, reconsume,
             prepared_offset) in msgs:
            key = (topic, qid)
            q = queues.get(key)
            if q is None or type(qid) is not int:  # (a bool would find the run of 0 or 1)
                known = queue_info.get(key)
                if known is None or type(qid) is not int:
                    q = queues[key] = ctx.queue(key, next_qoff.get(key, 0))
                else:
                    qoff = next_qoff.get(key, 0)
                    q = queues[key] = [qoff, [qoff], *known]
            qoff, run, topic_b, topic_len, key_crc = q
            body_len, props_len = len(body), len(props)
            if body_len > max_body or props_len > MAX_PROPERTIES_BYTES:
                raise ctx.too_large(body_len, props_len)
            if type(body) is not bytes:
                body = bytes(body)
            if type(props) is not bytes:
                props = bytes(props)
            tags_b, tags_len, th = tag_cache.get(tags) or ctx.tag(tags)
            keys_b = keys.encode() if keys else b""
            keys_len = len(keys_b)
            if keys_len > MAX_KEYS_BYTES:
                raise MessageTooLargeError(f"keys are longer than {MAX_KEYS_BYTES} bytes")
            born_b, born_len = hosts.get(born_host) or ctx.host(born_host)
            if not msg_id:
                msg_id = new_msg_id()
            elif len(msg_id) != MSG_ID_BYTES or type(msg_id) is not bytes:
                msg_id = checked_msg_id(msg_id)
            size = HEADER_SIZE + topic_len + born_len + store_len + tags_len + keys_len \
                + props_len + body_len
            end = pos + size
            if end > cap:
                buf, mv = ctx.grow(end, pos)
                cap = len(buf)
            if rel + size > limit:  # the record goes to the start of the next segment
                seals.append((pos, rel))
                seg_start += seg_bytes
                rel = 0
            phy = seg_start + rel
            lens = (topic_len, born_len, tags_len, keys_len, props_len, body_len)
            # Packing into scratch: an out-of-range field raises struct.error here, before
            # anything is written (a MalformedRequestError for the caller).
            (formats.get(lens) or ctx.record_format(lens))(
                buf, pos, size, RECORD_MAGIC, 0, flags, qid, qoff, phy, born_ts, ts,
                prepared_offset, reconsume, th, msg_id, topic_len, born_len, store_len, 0,
                tags_len, keys_len, props_len, body_len, topic_b, born_b, store_b, tags_b,
                keys_b, props, body)
            _pack_crc(buf, pos + 8, crc32c(mv[pos + CRC_START:end]))
            pos = end
            rel += size
            q[0] = qoff + 1
            run.append(_pack_entry(phy, size, th))
            add_item((crc32c(msg_id, ID_KEY_CRC), phy, ts))
            if keys_len:
                if 32 in keys_b:  # several space-separated keys
                    for k in keys_b.split(b" "):
                        if k:
                            add_item((crc32c(k, key_crc), phy, ts))
                else:
                    add_item((crc32c(keys_b, key_crc), phy, ts))
            add_result(_new_tuple(PutResult, (_OK, msg_id, phy, size, qoff, ts)))
        return _new_tuple(Staged, (pos, seals, start_rel, rel, queues, items, results))

    def stage_encoded(self, topic: str, queue_id: int, data: bytes | bytearray | memoryview,
                      born_host: str, ts: int, max_messages: int | None = None) -> Staged:
        """Validate and encode a message batch input (see batch_input.py) for one queue.

        Raises (writing nothing) MalformedRequestError for a truncated or inconsistent
        entry, tags or keys that are not UTF-8, an empty batch or more than
        `max_messages` entries; MessageTooLargeError for a body or properties over
        their limits; InvalidNameError for a bad topic.
        """
        key = (topic, queue_id)
        q = self._ctx.queue(key, self.next_queue_offset.get(key, 0))
        born = self._ctx.host(born_host)
        if type(data) is not bytes:
            data = bytes(data)
        try:
            return stage_batch_input(self._ctx, self._cl, key, q, born, data, ts, max_messages)
        except UnicodeDecodeError:
            raise MalformedRequestError("message tags or keys are not UTF-8") from None

    # -- write -------------------------------------------------------------------------

    def commit(self, staged: Staged) -> list[PutResult] | BatchPutResult:
        """Write a staged batch to the log and publish it; returns its results.

        Only an I/O failure can raise here; the store then refuses further appends
        (reopening recovers a consistent state). The write position moves only
        after every byte is written, so readers never see part of a batch.
        """
        cl, mv = self._cl, self._ctx.mv
        used, seals, rel, end_rel, queues, items, results = staged
        if not self._pending_index:  # (every record queues its id key: empty = nothing pending)
            self._pending_from = cl.write_offset
        seg = cl.active()
        done = 0
        for at, seal_rel in seals:
            if at > done:
                seg.write(mv[done:at], rel)
            seg = cl.roll(seg, seal_rel)
            done, rel = at, 0
        if used > done:
            seg.write(mv[done:used], rel)
        end = seg.start_offset + end_rel
        cl.advance(end)
        warmer = self._warmer
        if warmer is not None and end >= warmer.next_kick_offset:
            warmer.wrote_to(end)
        if len(self._ctx.buf) > KEEP_STAGING_BYTES:
            self._ctx.shrink()
        next_qoff, pending = self.next_queue_offset, self._pending_queues
        for key, q in queues.items():
            next_qoff[key] = q[0]
            queued = pending.get(key)
            if queued is None:
                pending[key] = q[1]
            else:
                queued.extend(q[1][1:])  # consecutive queue offsets: one run
        if self._pending_index:
            self._pending_index.extend(items)
        else:
            self._pending_index = items
        if len(self._pending_index) >= DISPATCH_BACKLOG:
            try:
                self.dispatch()
            except Exception as exc:  # the batch is written: report, never fail the append
                if self._on_dispatch_error is None:
                    raise
                self._on_dispatch_error(exc)
        return results

    @property
    def dispatched_offset(self) -> int:
        """Every record below this commit-log offset has its queue entry and index keys applied."""
        return self._pending_from if self._pending_index else self._cl.write_offset

    def dispatch(self) -> None:
        """Apply the queued consume-queue entries and index keys (in commit-log order).

        Dispatch is deferred so that many small appends (sync mode: one message per
        producer request) share one consume-queue write per queue and one index
        call; every read of the store calls this first, so readers never see a lag.
        Work is dropped from the queue only once applied: when a step raises (an
        I/O error, no file descriptors left), the rest stays queued for the next call
        and `dispatched_offset` stays where it was (re-applying is idempotent).
        """
        if not self._pending_index:
            return
        queues, cqs = self._pending_queues, self._cqs
        for key, run in list(queues.items()):
            cqs.get_or_create(key[0], key[1]).append(run[0], b"".join(run[1:]))
            del queues[key]
        self._index.put_hashed(self._pending_index)
        self._pending_index = []
