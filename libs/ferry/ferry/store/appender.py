"""The put path: validate and encode a batch in one pass, write it with one pwrite.

This is the hottest code of the broker (every message passes here once), so each
batch is one loop with everything bound to locals. `stage` validates every
message and encodes its record into a staging buffer, collecting its
consume-queue entry, index key hashes and result as it goes; a bad message
raises before a byte reaches the log (the staging buffer is scratch and nothing
else was touched). `commit` then writes the staged bytes with one pwrite per
segment touched and publishes the batch: queue offsets, then the queued dispatch.

Two inputs share this path: `MessageIn` tuples (`stage`) and the message batch
input layout of `batch_input.py` (`stage_encoded`).
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from crc32c import crc32c

from ferry.errors import FerryError, MalformedRequestError, MessageTooLargeError
from ferry.names import validate_topic

from .batch_input import BATCH_ENTRY, BATCH_ENTRY_SIZE, NO_MSG_ID
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
from .results import BatchPutResult, PutResult, PutStatus
from .warmer import PageWarmer

MAX_QUEUE_ID = 0xFFFF
# Queued index items beyond which an append applies the dispatch itself.
DISPATCH_BACKLOG = 512
STAGING_BYTES = 1 << 20
# A staging buffer grown past this by one huge batch is given back after it.
KEEP_STAGING_BYTES = 8 << 20
# Record structs cached per part lengths (one pack_into writes a whole record);
# past this many, records of new shapes take the slower header + join path.
MAX_RECORD_FORMATS = 256
ID_KEY_CRC = crc32c(b"I")  # index key b"I" + msg_id hashes as crc32c(msg_id, ID_KEY_CRC)
_pack_header = HEADER.pack_into
_pack_crc = struct.Struct("<I").pack_into
_pack_entry = CQ_ENTRY.pack
_new_tuple = tuple.__new__
_OK = PutStatus.OK
_MAX_CACHED = 100_000
_unpack_entry = BATCH_ENTRY.unpack_from
_ENTRY_SIZE = BATCH_ENTRY_SIZE
_MAX_BATCH = 1 << 62
_BAD_INPUT = (TypeError, ValueError, AttributeError, OverflowError, struct.error)

PackRecord = Callable[..., None]


class Staged:
    """A batch encoded in the staging buffer and validated, not yet written."""

    __slots__ = ("used", "seals", "start_rel", "end_rel", "assigned", "runs", "items", "results")

    def __init__(self, used: int, seals: list[tuple[int, int]], start_rel: int, end_rel: int,
                 assigned: dict[tuple[str, int], int], runs: dict[tuple[str, int], list],
                 items: list[tuple[int, int, int]],
                 results: list[PutResult] | BatchPutResult) -> None:
        self.used = used  # staging bytes holding records
        self.seals = seals  # (staging position of the first record of the next segment,
        #                      where the previous segment gets its blank marker)
        self.start_rel = start_rel  # position in the active segment of the first byte
        self.end_rel = end_rel  # position in the last segment just past the batch
        self.assigned = assigned  # (topic, queue_id) -> next queue offset after the batch
        self.runs = runs  # (topic, queue_id) -> [first queue offset, packed CQ entries...]
        self.items = items  # (index key hash, phy, store ts) in commit-log order
        self.results = results


class Appender:
    """Encodes batches for one store; remembers each queue's next queue offset."""

    def __init__(self, commit_log: CommitLog, cqs: ConsumeQueues, index: IndexService,
                 max_message_bytes: int, store_host: str, warmer: PageWarmer | None = None) -> None:
        self._cl = commit_log
        self._warmer = warmer
        self._cqs = cqs
        self._index = index
        self._max_body = max_message_bytes
        self._store_b = store_host.encode()
        self.next_queue_offset: dict[tuple[str, int], int] = {
            (cq.topic, cq.queue_id): cq.max_offset for cq in cqs}
        # topic -> (utf-8, utf-8 length, crc32c of the index key prefix b"K" topic b"\0")
        self._topics: dict[str, tuple[bytes, int, int]] = {}
        self._hosts: dict[str, bytes] = {}
        self._tag_hashes: dict[str, int] = {}
        self._formats: dict[tuple[int, ...], PackRecord] = {}
        self._prefix_formats: dict[int, PackRecord] = {}
        self._tag_bytes_hashes: dict[bytes, int] = {}
        self._buf = bytearray(STAGING_BYTES)
        self._mv = memoryview(self._buf)
        # Dispatch not yet applied: (topic, queue_id) -> [first queue offset, entries...]
        self._pending_queues: dict[tuple[str, int], list] = {}
        self._pending_index: list[tuple[int, int, int]] = []

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
        max_body, store_b = self._max_body, self._store_b
        store_len = len(store_b)
        topics, hosts, tag_hashes, formats = self._topics, self._hosts, self._tag_hashes, self._formats
        next_qoff = self.next_queue_offset
        seg = self._cl.active()
        seg_start, seg_bytes = seg.start_offset, seg.size
        rel = start_rel = self._cl.write_offset - seg_start
        limit = seg_bytes - BLANK_SIZE
        buf, mv = self._buf, self._mv
        cap, pos = len(buf), 0
        seals: list[tuple[int, int]] = []
        assigned: dict[tuple[str, int], int] = {}
        runs: dict[tuple[str, int], list] = {}
        items: list[tuple[int, int, int]] = []
        results: list[PutResult] = []
        add_item, add_result = items.append, results.append
        for (topic, qid, body, tags, keys, props, msg_id, flags, born_ts, born_host, reconsume,
             prepared_offset) in msgs:
            topic_b, topic_len, key_crc = topics.get(topic) or self._topic(topic)
            body_len, props_len = len(body), len(props)
            if body_len > max_body or props_len > MAX_PROPERTIES_BYTES:
                raise self._too_large(body_len, props_len)
            if type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID:
                raise MalformedRequestError(f"queue id {qid!r} is not in 0..{MAX_QUEUE_ID}")
            if type(body) is not bytes:
                body = bytes(body)
            if type(props) is not bytes:
                props = bytes(props)
            tags_b = tags.encode() if tags else b""
            keys_b = keys.encode() if keys else b""
            tags_len, keys_len = len(tags_b), len(keys_b)
            if tags_len > MAX_TAGS_BYTES or keys_len > MAX_KEYS_BYTES:
                raise MessageTooLargeError("tags or keys are longer than 65535 bytes")
            born_b = hosts.get(born_host) or self._host(born_host)
            if not msg_id:
                msg_id = new_msg_id()
            elif len(msg_id) != MSG_ID_BYTES or type(msg_id) is not bytes:
                msg_id = _checked_msg_id(msg_id)
            key = (topic, qid)
            qoff = assigned.get(key)
            if qoff is None:
                qoff = next_qoff.get(key, 0)
            assigned[key] = qoff + 1
            th = tag_hashes.get(tags)
            if th is None:
                th = self._tag_hash(tags, tags_b)
            born_len = len(born_b)
            size = HEADER_SIZE + topic_len + born_len + store_len + tags_len + keys_len \
                + props_len + body_len
            end = pos + size
            if end > cap:
                buf, mv = self._grow(end, pos)
                cap = len(buf)
            if rel + size > limit:  # the record goes to the start of the next segment
                seals.append((pos, rel))
                seg_start += seg_bytes
                rel = 0
            phy = seg_start + rel
            lens = (topic_len, born_len, tags_len, keys_len, props_len, body_len)
            pack = formats.get(lens) or self._format(lens)
            # Packing into scratch: an out-of-range field raises struct.error here, before
            # anything is written (a MalformedRequestError for the caller).
            pack(buf, pos, size, RECORD_MAGIC, 0, flags, qid, qoff, phy, born_ts, ts,
                 prepared_offset, reconsume, th, msg_id, topic_len, born_len, store_len, 0,
                 tags_len, keys_len, props_len, body_len, topic_b, born_b, store_b, tags_b,
                 keys_b, props, body)
            _pack_crc(buf, pos + 8, crc32c(mv[pos + CRC_START:end]))
            pos = end
            rel += size
            run = runs.get(key)
            if run is None:
                runs[key] = [qoff, _pack_entry(phy, size, th)]
            else:
                run.append(_pack_entry(phy, size, th))
            add_item((crc32c(msg_id, ID_KEY_CRC), phy, ts))
            if keys_b:
                if b" " in keys_b:
                    for k in keys_b.split(b" "):
                        if k:
                            add_item((crc32c(k, key_crc), phy, ts))
                else:
                    add_item((crc32c(keys_b, key_crc), phy, ts))
            add_result(_new_tuple(PutResult, (_OK, msg_id, phy, size, qoff, ts)))
        return Staged(pos, seals, start_rel, rel, assigned, runs, items, results)

    def stage_encoded(self, topic: str, queue_id: int, data: bytes, born_host: str, ts: int,
                      max_messages: int | None = None) -> Staged:
        """Validate and encode a message batch input (see batch_input.py) for one queue.

        Raises (writing nothing) MalformedRequestError for a truncated or inconsistent
        entry, tags or keys that are not UTF-8, an empty batch or more than
        `max_messages` entries; MessageTooLargeError for a body or properties over
        their limits; InvalidNameError for a bad topic.
        """
        if type(queue_id) is not int or not 0 <= queue_id <= MAX_QUEUE_ID:
            raise MalformedRequestError(f"queue id {queue_id!r} is not in 0..{MAX_QUEUE_ID}")
        topic_b, _, key_crc = self.topic(topic)
        born_b = self.host(born_host)
        if type(data) is not bytes:
            data = bytes(data)
        try:
            return self._stage_encoded((topic, queue_id), topic_b, key_crc, born_b, data, ts,
                                       _MAX_BATCH if max_messages is None else max_messages)
        except UnicodeDecodeError:
            raise MalformedRequestError("message tags or keys are not UTF-8") from None

    def _stage_encoded(self, key: tuple[str, int], topic_b: bytes, key_crc: int, born_b: bytes,
                       data: bytes, ts: int, max_messages: int) -> Staged:
        queue_id, store_b, max_body = key[1], self._store_b, self._max_body
        topic_len, born_len, store_len = len(topic_b), len(born_b), len(store_b)
        prefix = topic_b + born_b + store_b
        fixed = HEADER_SIZE + len(prefix)  # record bytes before the entry's tags
        pack = self._prefix_format(len(prefix))
        tag_hashes, unpack = self._tag_bytes_hashes, _unpack_entry
        seg = self._cl.active()
        seg_start, seg_bytes = seg.start_offset, seg.size
        rel = start_rel = self._cl.write_offset - seg_start
        limit = seg_bytes - BLANK_SIZE
        buf, mv = self._buf, self._mv
        cap, pos = len(buf), 0
        seals: list[tuple[int, int]] = []
        qoff = first_qoff = self.next_queue_offset.get(key, 0)
        run: list = [first_qoff]
        items: list[tuple[int, int, int]] = []
        add_entry, add_item = run.append, items.append
        src = memoryview(data)
        at, stop = 0, len(data)
        while at < stop:
            if stop - at < _ENTRY_SIZE:
                raise MalformedRequestError(f"message batch truncated: {stop - at} bytes left "
                                            f"at {at}, an entry head is {_ENTRY_SIZE}")
            length, msg_id, born_ts, flags, tags_len, keys_len, props_len, body_len = \
                unpack(data, at)
            if body_len > max_body or props_len > MAX_PROPERTIES_BYTES:
                raise self._too_large(body_len, props_len)
            if length != _ENTRY_SIZE + tags_len + keys_len + props_len + body_len \
                    or length > stop - at:
                raise _bad_entry(at, length, stop)
            if qoff - first_qoff >= max_messages:
                raise MalformedRequestError(f"the batch has more than {max_messages} messages")
            q = at + _ENTRY_SIZE
            if tags_len:
                tags_b = data[q:q + tags_len]
                th = tag_hashes.get(tags_b) or self._tag_bytes_hash(tags_b)
            else:
                th = 0
            if msg_id == NO_MSG_ID:
                msg_id = new_msg_id()
            size = fixed + length - _ENTRY_SIZE
            end = pos + size
            if end > cap:
                buf, mv = self._grow(end, pos)
                cap = len(buf)
            if rel + size > limit:  # the record goes to the start of the next segment
                seals.append((pos, rel))
                seg_start += seg_bytes
                rel = 0
            phy = seg_start + rel
            pack(buf, pos, size, RECORD_MAGIC, 0, flags, queue_id, qoff, phy, born_ts, ts, 0, 0, th,
                 msg_id, topic_len, born_len, store_len, 0, tags_len, keys_len, props_len,
                 body_len, prefix)
            buf[pos + fixed:end] = src[q:at + length]  # tags | keys | props | body as given
            _pack_crc(buf, pos + 8, crc32c(mv[pos + CRC_START:end]))
            pos = end
            rel += size
            add_entry(_pack_entry(phy, size, th))
            add_item((crc32c(msg_id, ID_KEY_CRC), phy, ts))
            if keys_len:
                keys_b = data[q + tags_len:q + tags_len + keys_len]
                if not keys_b.isascii():
                    keys_b.decode()  # UTF-8 check: stored keys are decoded as text
                for k in keys_b.split(b" ") if b" " in keys_b else (keys_b,):
                    if k:
                        add_item((crc32c(k, key_crc), phy, ts))
            qoff += 1
            at += length
        if qoff == first_qoff:
            raise MalformedRequestError("the message batch is empty")
        first_phy = CQ_ENTRY.unpack(run[1])[0]
        result = _new_tuple(BatchPutResult, (_OK, qoff - first_qoff, first_qoff, first_phy,
                                             seg_start + rel, ts))
        return Staged(pos, seals, start_rel, rel, {key: qoff}, {key: run}, items, result)

    # -- write -------------------------------------------------------------------------

    def commit(self, staged: Staged) -> list[PutResult] | BatchPutResult:
        """Write a staged batch to the log and publish it; returns its results.

        Only an I/O failure can raise here; the store then refuses further appends
        (reopening recovers a consistent state). The write position moves only
        after every byte is written, so readers never see part of a batch.
        """
        cl, mv = self._cl, self._mv
        seg = cl.active()
        done, rel = 0, staged.start_rel
        for at, seal_rel in staged.seals:
            if at > done:
                seg.write(mv[done:at], rel)
            seg = cl.roll(seg, seal_rel)
            done, rel = at, 0
        if staged.used > done:
            seg.write(mv[done:staged.used], rel)
        cl.advance(seg.start_offset + staged.end_rel)
        if self._warmer is not None:
            self._warmer.wrote_to(seg.start_offset + staged.end_rel)
        self.next_queue_offset.update(staged.assigned)
        pending = self._pending_queues
        for key, run in staged.runs.items():
            queued = pending.get(key)
            if queued is None:
                pending[key] = run
            else:
                queued.extend(run[1:])  # consecutive queue offsets: one run
        if self._pending_index:
            self._pending_index.extend(staged.items)
        else:
            self._pending_index = staged.items
        if len(self._pending_index) >= DISPATCH_BACKLOG:
            self.dispatch()
        if len(self._buf) > KEEP_STAGING_BYTES:
            self._buf = bytearray(STAGING_BYTES)
            self._mv = memoryview(self._buf)
        return staged.results

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
        self._index.put_hashed(items)

    # -- cache misses and rare paths (kept out of the loops) ------------------------------

    def staging(self, need: int, used: int) -> tuple[bytearray, memoryview]:
        """The staging buffer, grown to hold `need` bytes (keeping the first `used`)."""
        if need <= len(self._buf):
            return self._buf, self._mv
        return self._grow(need, used)

    def _grow(self, need: int, used: int) -> tuple[bytearray, memoryview]:
        buf = bytearray(max(need, 2 * len(self._buf)))
        buf[:used] = self._mv[:used]
        self._buf, self._mv = buf, memoryview(buf)
        return buf, self._mv

    def topic(self, topic: str) -> tuple[bytes, int, int]:
        """(UTF-8, its length, index key prefix CRC) of a valid topic name."""
        return self._topics.get(topic) or self._topic(topic)

    def _topic(self, topic: str) -> tuple[bytes, int, int]:
        topic_b = validate_topic(topic, allow_internal=True).encode()
        if len(self._topics) >= _MAX_CACHED:
            self._topics.clear()
        got = self._topics[topic] = (topic_b, len(topic_b), crc32c(b"K" + topic_b + b"\x00"))
        return got

    def host(self, host: str) -> bytes:
        """The UTF-8 of a born host, checked against its length limit."""
        return self._hosts.get(host) or self._host(host)

    def _host(self, host: str) -> bytes:
        born_b = host.encode()
        if len(born_b) > MAX_HOST_BYTES:
            raise MalformedRequestError(f"born_host is longer than {MAX_HOST_BYTES} bytes")
        if born_b and len(self._hosts) < _MAX_CACHED:
            self._hosts[host] = born_b
        return born_b

    def _tag_hash(self, tags: str, tags_b: bytes) -> int:
        th = crc32c(tags_b) + 1 if tags_b else 0
        if len(self._tag_hashes) < _MAX_CACHED:
            self._tag_hashes[tags] = th
        return th

    def _format(self, lens: tuple[int, ...]) -> PackRecord:
        """pack_into of a whole record with these part lengths (header + join when full)."""
        if len(self._formats) >= MAX_RECORD_FORMATS:
            return _pack_joined
        topic_len, born_len, tags_len, keys_len, props_len, body_len = lens
        parts = (topic_len, born_len, len(self._store_b), tags_len, keys_len, props_len, body_len)
        pack = struct.Struct(HEADER.format + "".join(f"{n}s" for n in parts)).pack_into
        self._formats[lens] = pack
        return pack

    def _tag_bytes_hash(self, tags_b: bytes) -> int:
        tags_b.decode()  # UTF-8 check: stored tags are decoded as text
        th = crc32c(tags_b) + 1
        if len(self._tag_bytes_hashes) < _MAX_CACHED:
            self._tag_bytes_hashes[tags_b] = th
        return th

    def _prefix_format(self, prefix_len: int) -> PackRecord:
        """pack_into of a record header followed by its topic, born host and store host."""
        pack = self._prefix_formats.get(prefix_len)
        if pack is None:
            if len(self._prefix_formats) >= MAX_RECORD_FORMATS:
                self._prefix_formats.clear()
            pack = struct.Struct(f"{HEADER.format}{prefix_len}s").pack_into
            self._prefix_formats[prefix_len] = pack
        return pack

    def _too_large(self, body_len: int, props_len: int) -> MessageTooLargeError:
        if body_len > self._max_body:
            return MessageTooLargeError(f"message body of {body_len} bytes exceeds {self._max_body}")
        return MessageTooLargeError(f"properties of {props_len} bytes exceed {MAX_PROPERTIES_BYTES}")


def _pack_joined(buf: bytearray, pos: int, size: int, *fields: object) -> None:
    """A record without a cached struct: the header, then the parts joined."""
    _pack_header(buf, pos, size, *fields[:20])
    buf[pos + HEADER_SIZE:pos + size] = b"".join(fields[20:])  # type: ignore[arg-type]


def _bad_entry(at: int, length: int, stop: int) -> MalformedRequestError:
    if length > stop - at:
        return MalformedRequestError(f"message batch truncated: the entry at {at} needs {length} "
                                     f"bytes, {stop - at} are left")
    return MalformedRequestError(f"message at {at}: entry length {length} disagrees with its "
                                 "field lengths")


def _checked_msg_id(msg_id: object) -> bytes:
    if len(msg_id) != MSG_ID_BYTES:  # type: ignore[arg-type]
        raise MalformedRequestError(f"msg_id must be {MSG_ID_BYTES} bytes")
    return bytes(msg_id)  # type: ignore[call-overload]
