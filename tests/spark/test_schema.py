"""`records_batch`: stored records' bytes to the source's Arrow batch, column by column,
held against the record decoder of ferry.codec (no Spark, no mesh)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from ferry.codec.properties import encode_properties
from ferry.codec.record import MessageIn, encode_record, iter_records
from ferry.errors import CorruptRecordError
from ferry_spark.schema import ARROW_SCHEMA, records_batch


def _records(n: int) -> bytes:
    out = []
    for i in range(n):
        msg = MessageIn("t", i % 3, f"body-{i}-é".encode() * (i % 4), tags="tä" if i % 2 else "",
                        keys=f"k{i} x{i}" if i % 3 else "",
                        properties=encode_properties({"n": str(i), "ü": "v"}) if i % 5 else b"",
                        born_host="h:1", reconsume_times=i % 2)
        out.append(encode_record(msg, queue_offset=100 + i, phy_offset=1000 * i,
                                 store_ts_ms=1_700_000_000_000 + i))
    return b"".join(out)


def test_columns_match_the_record_decoder() -> None:
    raw = _records(40)
    batch = records_batch(raw, "t", "broker-a")
    assert batch.schema == ARROW_SCHEMA
    rows = batch.to_pylist()
    decoded = list(iter_records(raw))
    assert len(rows) == len(decoded) == 40
    for row, m in zip(rows, decoded, strict=True):
        assert (row["topic"], row["broker"]) == ("t", "broker-a")
        assert (row["queue_id"], row["queue_offset"]) == (m.queue_id, m.queue_offset)
        assert row["msg_id"] == m.msg_id.hex().upper()
        assert row["key"] == (m.keys or None) and row["tags"] == (m.tags or None)
        assert dict(row["properties"]) == m.properties
        assert row["body"] == m.body
        assert row["born_ts"].timestamp() * 1000 == m.born_ts_ms
        assert row["store_ts"].timestamp() * 1000 == m.store_ts_ms
        assert row["reconsume_times"] == m.reconsume_times


def test_records_past_the_range_end_are_left_out() -> None:
    batch = records_batch(_records(10), "t", "b", end=104)
    assert batch.column("queue_offset").to_pylist() == [100, 101, 102, 103]
    assert records_batch(_records(3), "t", "b", end=100).num_rows == 0


def test_a_corrupt_record_is_refused() -> None:
    raw = bytearray(_records(3))
    raw[-1] ^= 0xFF   # the last body byte: the CRC no longer matches
    with pytest.raises(CorruptRecordError):
        records_batch(bytes(raw), "t", "b")
    with pytest.raises(CorruptRecordError):
        records_batch(_records(3)[:-5], "t", "b")   # truncated


def test_empty_input() -> None:
    assert records_batch(b"", "t", "b").num_rows == 0
    assert isinstance(records_batch(b"", "t", "b"), pa.RecordBatch)


def test_records_without_keys_tags_properties_or_body() -> None:
    """The columns no record has a part for (keys, tags, properties, empty bodies) are
    built without copying spans; they still hold one value per record."""
    raw = b"".join(encode_record(MessageIn("t", 0, b""), queue_offset=i, phy_offset=0,
                                 store_ts_ms=1) for i in range(5))
    batch = records_batch(raw, "t", "b")
    assert batch.schema == ARROW_SCHEMA
    assert batch.column("key").to_pylist() == [None] * 5
    assert batch.column("tags").to_pylist() == [None] * 5
    assert batch.column("properties").to_pylist() == [[]] * 5
    assert batch.column("body").to_pylist() == [b""] * 5
    assert batch.column("queue_offset").to_pylist() == list(range(5))


def test_the_same_properties_on_many_records() -> None:
    """Records sharing one encoding of their properties (decoded once) each get the map."""
    props = encode_properties({"a": "1", "b": "2"})
    msgs = [MessageIn("t", 0, b"x", properties=props if i % 4 else b"") for i in range(12)]
    raw = b"".join(encode_record(m, queue_offset=i, phy_offset=0, store_ts_ms=1)
                   for i, m in enumerate(msgs))
    got = records_batch(raw, "t", "b").column("properties").to_pylist()
    assert got == [[] if i % 4 == 0 else [("a", "1"), ("b", "2")] for i in range(12)]


def test_a_key_that_is_not_utf8_is_refused() -> None:
    """A record whose CRC matches but whose key is not UTF-8 fails the batch, as the
    record decoder refuses it."""
    from crc32c import crc32c
    from ferry.codec.record import HEADER_SIZE
    from ferry.codec.record_layout import AT_CRC, CRC_START

    good = encode_record(MessageIn("t", 0, b"body", keys="kk"), queue_offset=0, phy_offset=0,
                         store_ts_ms=1)
    bad = bytearray(good)
    at = good.index(b"kk", HEADER_SIZE)
    bad[at:at + 2] = b"\xff\xfe"
    bad[AT_CRC:AT_CRC + 4] = crc32c(bytes(bad[CRC_START:])).to_bytes(4, "little")
    with pytest.raises(pa.ArrowInvalid):
        records_batch(bytes(bad), "t", "b")
