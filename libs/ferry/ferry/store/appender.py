"""The put path: validate a batch, encode it into the commit log, collect its dispatch.

This is the hottest code of the broker (every message passes here once), so it
is one loop per pass with everything bound to locals: pass 1 validates the whole
batch and encodes its strings (nothing is written when a message is bad), pass 2
encodes each record straight into the active segment's mapping and, in the same
iteration, builds its consume-queue entry, index keys and result.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from crc32c import crc32c

from ferry.errors import FerryError, MalformedRequestError, MessageTooLargeError
from ferry.names import validate_topic

from .commit_log import CommitLog
from .config import MAX_PROPERTIES_BYTES
from .consume_queue import CQ_ENTRY, ConsumeQueues
from .index_file import IndexService
from .record import (
    BLANK_SIZE,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    MAX_HOST_BYTES,
    MAX_KEYS_BYTES,
    MAX_TAGS_BYTES,
    MSG_ID_BYTES,
    RECORD_MAGIC,
    MessageIn,
    new_msg_id,
)
from .results import PutResult, PutStatus

MAX_QUEUE_ID = 0xFFFF
# Queued index items beyond which an append applies the dispatch itself.
DISPATCH_BACKLOG = 512
_pack_header = HEADER.pack_into
_pack_crc = struct.Struct("<I").pack_into
_pack_entry = CQ_ENTRY.pack
_new_tuple = tuple.__new__
_OK = PutStatus.OK
_MAX_CACHED = 100_000
_U32_MAX = 0xFFFF_FFFF
_I32_MAX = 0x7FFF_FFFF
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class Appender:
    """Encodes batches for one store; remembers each queue's next queue offset."""

    def __init__(self, commit_log: CommitLog, cqs: ConsumeQueues, index: IndexService,
                 max_message_bytes: int, store_host: str) -> None:
        self._cl = commit_log
        self._cqs = cqs
        self._index = index
        self._max_body = max_message_bytes
        self._store_b = store_host.encode()
        self.next_queue_offset: dict[tuple[str, int], int] = {
            (cq.topic, cq.queue_id): cq.max_offset for cq in cqs}
        # topic -> (utf-8, index key prefix, utf-8 length)
        self._topics: dict[str, tuple[bytes, bytes, int]] = {}
        self._hosts: dict[str, bytes] = {}
        self._tag_hashes: dict[str, int] = {}
        # Dispatch not yet applied: (topic, queue_id) -> [first queue offset, entries...]
        self._pending_queues: dict[tuple[str, int], list] = {}
        self._pending_index: list[tuple[bytes, int, int]] = []

    def prepare(self, msgs: Sequence[MessageIn]) -> list[tuple]:
        """Validate the batch and assign queue offsets; raises (writing nothing) if one is bad."""
        try:
            return self._prepare(msgs)
        except FerryError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            # Wrong types or values that would break the encoder: a bad request, never a
            # failure of the store.
            raise MalformedRequestError(f"invalid message: {exc}") from None

    def write(self, prepared: list[tuple], ts: int) -> list[PutResult]:
        """Encode a prepared batch stored at `ts` into the log; its dispatch is queued.

        Only an I/O failure can raise here; the store then refuses further appends
        (reopening recovers a consistent state).
        """
        results = self._encode(prepared, ts)
        if len(self._pending_index) >= DISPATCH_BACKLOG:
            self.dispatch()
        return results

    def dispatch(self) -> None:
        """Apply the queued consume-queue entries and index keys (in commit-log order).

        Dispatch is deferred so that many small appends (sync mode: one message per
        producer request) share one consume-queue write per queue and one index
        call; every read of the store calls this first, so readers never see a lag.
        """
        if not self._pending_index:
            return
        queues, items = self._pending_queues, self._pending_index
        self._pending_queues, self._pending_index = {}, []
        cqs = self._cqs
        for (topic, qid), run in queues.items():
            cqs.get_or_create(topic, qid).append(run[0], b"".join(run[1:]))
        self._index.put_many(items)

    def _prepare(self, msgs: Sequence[MessageIn]) -> list[tuple]:
        max_body = self._max_body
        topics, hosts, next_qoff = self._topics, self._hosts, self.next_queue_offset
        tag_hashes = self._tag_hashes
        assigned: dict[tuple[str, int], int] = {}
        out = []
        for m in msgs:
            (topic, qid, body, tags, keys, props, msg_id, flags, born_ts, born_host, reconsume,
             prepared_offset) = m
            tb = topics.get(topic)
            if tb is None:
                topic_b = validate_topic(topic, allow_internal=True).encode()
                tb = topics[topic] = (topic_b, b"K" + topic_b + b"\x00", len(topic_b))
            if len(body) > max_body:
                raise MessageTooLargeError(f"message body of {len(body)} bytes exceeds {max_body}")
            if len(props) > MAX_PROPERTIES_BYTES:
                raise MessageTooLargeError(
                    f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_BYTES}")
            if type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID:
                raise MalformedRequestError(f"queue id {qid!r} is not in 0..{MAX_QUEUE_ID}")
            if not (0 <= flags <= _U32_MAX and _I64_MIN <= born_ts <= _I64_MAX
                    and 0 <= reconsume <= _I32_MAX and _I64_MIN <= prepared_offset <= _I64_MAX):
                raise MalformedRequestError("flags, born_ts_ms, reconsume_times or "
                                            "prepared_offset is out of range")
            if type(body) is not bytes:
                body = bytes(body)
            if type(props) is not bytes:
                props = bytes(props)
            tags_b = tags.encode() if tags else b""
            keys_b = keys.encode() if keys else b""
            if len(tags_b) > MAX_TAGS_BYTES or len(keys_b) > MAX_KEYS_BYTES:
                raise MessageTooLargeError("tags or keys are longer than 65535 bytes")
            born_b = hosts.get(born_host)
            if born_b is None:
                born_b = born_host.encode()
                if len(born_b) > MAX_HOST_BYTES:
                    raise MalformedRequestError("born_host is longer than 255 bytes")
                if len(hosts) < _MAX_CACHED:
                    hosts[born_host] = born_b
            if not msg_id:
                msg_id = new_msg_id()
            elif len(msg_id) != MSG_ID_BYTES:
                raise MalformedRequestError(f"msg_id must be {MSG_ID_BYTES} bytes")
            elif type(msg_id) is not bytes:
                msg_id = bytes(msg_id)
            key = (topic, qid)
            qoff = assigned.get(key)
            if qoff is None:
                qoff = next_qoff.get(key, 0)
            assigned[key] = qoff + 1
            th = tag_hashes.get(tags)
            if th is None:
                th = crc32c(tags_b) + 1 if tags_b else 0
                if len(tag_hashes) < _MAX_CACHED:
                    tag_hashes[tags] = th
            out.append((key, tb, qoff, tags_b, keys_b, born_b, msg_id, flags, born_ts, reconsume,
                        prepared_offset, props, body, th, len(tags_b), len(keys_b), len(props),
                        len(body)))
        if len(topics) > _MAX_CACHED:
            topics.clear()
        next_qoff.update(assigned)  # only reached when the whole batch is valid
        return out

    def _encode(self, prepared: list[tuple], ts: int) -> list[PutResult]:
        cl = self._cl
        store_b = self._store_b
        store_len = len(store_b)
        seg = cl.active()
        start, mm, mv = seg.start_offset, seg.mm, seg.view
        rel = cl.write_offset - start
        limit = seg.size - BLANK_SIZE
        results: list[PutResult] = []
        queues = self._pending_queues
        add_result, add_index = results.append, self._pending_index.append
        try:
            for (key, (topic_b, key_prefix, topic_len), qoff, tags_b, keys_b, born_b, msg_id, flags,
                 born_ts, reconsume, prepared_offset, props, body, th, tags_len, keys_len,
                 props_len, body_len) in prepared:
                born_len = len(born_b)
                size = HEADER_SIZE + topic_len + born_len + store_len + tags_len + keys_len \
                    + props_len + body_len
                if rel + size > limit:
                    seg = cl.roll(seg, rel)
                    start, mm, mv, rel = seg.start_offset, seg.mm, seg.view, 0
                phy = start + rel
                end = rel + size
                _pack_header(mm, rel, size, RECORD_MAGIC, 0, flags, key[1], qoff, phy, born_ts, ts,
                             prepared_offset, reconsume, th, msg_id, topic_len, born_len,
                             store_len, 0, tags_len, keys_len, props_len, body_len)
                mm[rel + HEADER_SIZE:end] = b"".join(
                    (topic_b, born_b, store_b, tags_b, keys_b, props, body))
                _pack_crc(mm, rel + 8, crc32c(mv[rel + CRC_START:end]))
                rel = end
                run = queues.get(key)
                if run is None:
                    queues[key] = [qoff, _pack_entry(phy, size, th)]
                else:
                    run.append(_pack_entry(phy, size, th))
                add_index((b"I" + msg_id, phy, ts))
                if keys_b:
                    if b" " in keys_b:
                        for k in keys_b.split(b" "):
                            if k:
                                add_index((key_prefix + k, phy, ts))
                    else:
                        add_index((key_prefix + keys_b, phy, ts))
                add_result(_new_tuple(PutResult, (_OK, msg_id, phy, size, qoff, ts)))
        finally:
            cl.advance(start + rel)
        return results
