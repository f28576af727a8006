"""The put path: validate and encode a batch in one pass, write it with one pwrite.

`stage_encoded` runs a batch input (SEND entries, `batch_input.py`) through the
staging loop, which validates every message and encodes its record into a
staging buffer, collecting its consume-queue entry and index key hashes as it
goes; a bad message raises before a byte reaches the log (the staging buffer is
scratch and nothing else was touched). `stage` encodes `MessageIn` tuples into
the same input, one run per (queue, born host, reconsume times, prepared
offset), and stages the runs one after another into one buffer. `commit` then
writes the staged bytes with one pwrite per segment touched and publishes the
batch: queue offsets, then the queued dispatch (`dispatch.LiveDispatch`).
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from ferry.codec.entry import append_entry
from ferry.codec.limits import MAX_KEYS_BYTES, MAX_TAGS_BYTES, MSG_ID_BYTES
from ferry.codec.msg_id import NO_MSG_ID, new_msg_id
from ferry.codec.record import MessageIn
from ferry.errors import FerryError, MalformedRequestError, MessageTooLargeError

from .batch_input import NO_LIMIT, stage_batch_input
from .commit_log import CommitLog
from .consume_queue import CQ_ENTRY
from .consume_queues import ConsumeQueues
from .dispatch import LiveDispatch
from .encode_context import KEEP_STAGING_BYTES, EncodeContext, Staged, StageState
from .results import BatchPutResult, PutResult, PutStatus
from .warmer import PageWarmer

_unpack_cq = CQ_ENTRY.unpack
_new_tuple = tuple.__new__
_OK = PutStatus.OK
_BAD_INPUT = (TypeError, ValueError, AttributeError, OverflowError, struct.error)
# What the messages of one run of the staging loop share: topic, queue_id, born_host,
# reconsume_times, prepared_offset.
_RunKey = tuple[str, int, str, int, int]


class Appender:
    """Encodes batches for one store; remembers each queue's next queue offset."""

    def __init__(self, commit_log: CommitLog, cqs: ConsumeQueues, dispatcher: LiveDispatch,
                 max_message_bytes: int, store_host: str,
                 warmer: PageWarmer | None = None) -> None:
        self._cl = commit_log
        self._dispatcher = dispatcher
        self._warmer = warmer
        self._ctx = EncodeContext(max_message_bytes, store_host, commit_log.segment_bytes)
        self.next_queue_offset: dict[tuple[str, int], int] = {
            (cq.topic, cq.queue_id): cq.max_offset for cq in cqs}

    # -- staging -----------------------------------------------------------------------

    def stage(self, msgs: Sequence[MessageIn], ts: int) -> Staged:
        """Validate and encode `msgs` stored at `ts`; raises (writing nothing) if one is bad."""
        try:
            return self._stage(msgs, ts)
        except FerryError:
            raise
        except UnicodeDecodeError:
            raise MalformedRequestError("message tags or keys are not UTF-8") from None
        except _BAD_INPUT as exc:
            # Wrong types or values that would break the encoder: a bad request, never a
            # failure of the store.
            raise MalformedRequestError(f"invalid message: {exc}") from None

    def _stage(self, msgs: Sequence[MessageIn], ts: int) -> Staged:
        st = StageState(self._cl, {})
        results: list[PutResult] = []
        run_key: _RunKey | None = None
        parts: list[bytes] = []
        ids: list[bytes] = []
        for (topic, qid, body, tags, keys, props, msg_id, flags, born_ts, born_host, reconsume,
             prepared_offset) in msgs:
            key = (topic, qid, born_host, reconsume, prepared_offset)
            if key != run_key or type(qid) is not int:  # (True == 1: keep bools apart)
                if run_key is not None:
                    self._stage_run(st, run_key, parts, ids, ts, results)
                run_key, parts, ids = key, [], []
            # The message as a SEND entry, checking what the entry cannot hold (the
            # staging loop checks the rest).
            tags_b = tags.encode() if tags else b""
            if len(tags_b) > MAX_TAGS_BYTES:
                raise MessageTooLargeError(f"tags are longer than {MAX_TAGS_BYTES} bytes")
            keys_b = keys.encode() if keys else b""
            if len(keys_b) > MAX_KEYS_BYTES:
                raise MessageTooLargeError(f"keys are longer than {MAX_KEYS_BYTES} bytes")
            if not msg_id or msg_id == NO_MSG_ID:  # ids are assigned here, so results know them
                msg_id = new_msg_id()
            elif len(msg_id) != MSG_ID_BYTES or type(msg_id) is not bytes:
                if len(msg_id) != MSG_ID_BYTES:
                    raise MalformedRequestError(f"msg_id must be {MSG_ID_BYTES} bytes")
                msg_id = bytes(msg_id)
            ids.append(msg_id)
            append_entry(parts, msg_id, born_ts, flags, tags_b, keys_b,
                         props if type(props) is bytes else bytes(props),
                         body if type(body) is bytes else bytes(body))
        if run_key is not None:
            self._stage_run(st, run_key, parts, ids, ts, results)
        return st.staged(results)

    def _stage_run(self, st: StageState, run_key: _RunKey, parts: list[bytes], ids: list[bytes],
                   ts: int, results: list[PutResult]) -> None:
        """Stage the encoded entries of one run (its messages share `run_key`); add the
        result of each message (`ids` are their msg ids) to `results`."""
        topic, queue_id, born_host, reconsume_times, prepared_offset = run_key
        key = (topic, queue_id)
        q = st.queues.get(key)
        if q is None or type(queue_id) is not int:  # the batch's first run of this queue
            q = st.queues[key] = self._ctx.queue(key, self.next_queue_offset.get(key, 0))
        qoff, done = q.next_offset, len(q.entries)
        # put_batch writes what the broker itself stores (a committed transaction's
        # message, retries, ...): indexed by exact id, as the broker looks them up.
        stage_batch_input(self._ctx, st, q, self._ctx.host(born_host), b"".join(parts), ts,
                          NO_LIMIT, reconsume_times, prepared_offset, exact_ids=True)
        add = results.append
        for msg_id, (phy, size, _) in zip(ids, map(_unpack_cq, q.entries[done:]), strict=True):
            add(_new_tuple(PutResult, (_OK, msg_id, phy, size, qoff, ts)))
            qoff += 1

    def stage_encoded(self, topic: str, queue_id: int, data: bytes | bytearray | memoryview,
                      born_host: str, ts: int, max_messages: int | None = None,
                      refuse_flags: int = 0) -> Staged:
        """Validate and encode a message batch input (see batch_input.py) for one queue.

        Raises (writing nothing) MalformedRequestError for a truncated or inconsistent
        entry, tags or keys that are not UTF-8, an empty batch, more than
        `max_messages` entries or an entry with a flag in `refuse_flags`;
        MessageTooLargeError for a body or properties over their limits;
        InvalidNameError for a bad topic.
        """
        key = (topic, queue_id)
        q = self._ctx.queue(key, self.next_queue_offset.get(key, 0))
        born = self._ctx.host(born_host)
        st = StageState(self._cl, {key: q})
        try:
            count = stage_batch_input(self._ctx, st, q, born, data, ts,
                                      NO_LIMIT if max_messages is None else max_messages,
                                      0, 0, refuse_flags)
        except UnicodeDecodeError:
            raise MalformedRequestError("message tags or keys are not UTF-8") from None
        first_phy = _unpack_cq(q.entries[0])[0]
        return st.staged(_new_tuple(BatchPutResult, (
            _OK, count, q.first_offset, first_phy, st.seg_start + st.rel, ts)))

    # -- write -------------------------------------------------------------------------

    def commit(self, staged: Staged) -> list[PutResult] | BatchPutResult:
        """Write a staged batch to the log and publish it; returns its results.

        Only an I/O failure can raise here; the store then refuses further appends
        (reopening recovers a consistent state). The write position moves only
        after every byte is written, so readers never see part of a batch.
        """
        cl, mv = self._cl, self._ctx.mv
        used, seals, end_rel, queues, items, results = staged
        start = cl.write_offset
        seg = cl.active()
        rel = start - seg.start_offset  # (where staging started: nothing moved since)
        warmer = self._warmer
        if warmer is not None:  # (zeroing ahead in sync mode: never over this batch)
            warmer.before_write(seg.start_offset + len(seals) * cl.segment_bytes + end_rel)
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
        if warmer is not None and end >= warmer.next_kick_offset:
            warmer.wrote_to(end)
        if len(self._ctx.buf) > KEEP_STAGING_BYTES:
            self._ctx.shrink()
        next_qoff = self.next_queue_offset
        for key, q in queues.items():
            next_qoff[key] = q.next_offset
        if items:
            self._dispatcher.add(start, queues, items)
        return results

