"""Planning without Spark running: offsets options, queue ranges, micro-batch limits."""
from __future__ import annotations

import pytest
from ferry.errors import OffsetOutOfRangeError
from ferry_spark.errors import SourceOptionError
from ferry_spark.source.options import EARLIEST, LATEST, parse_offsets, read_options
from ferry_spark.source.ranges import QueueBounds, plan_ranges
from ferry_spark.source.stream import from_offset, share_rows, to_offset

BOUNDS = [QueueBounds("b", 1, 5, 50), QueueBounds("a", 0, 0, 10), QueueBounds("a", 1, 0, 0)]


def _spans(ranges) -> list[tuple]:
    return [(r.broker, r.queue_id, r.start, r.end) for r in ranges]


def test_plan_reads_every_queue_with_data_sorted() -> None:
    ranges = plan_ranges("t", BOUNDS, parse_offsets(None, "s", EARLIEST),
                         parse_offsets(None, "e", LATEST), True)
    assert _spans(ranges) == [("a", 0, 0, 10), ("b", 1, 5, 50)]


def test_plan_named_queues_and_their_defaults() -> None:
    start = parse_offsets('{"b": {"1": 20}, "a": {"0": -1}}', "s", EARLIEST)
    end = parse_offsets('{"b": {"1": 30}}', "e", LATEST)
    assert _spans(plan_ranges("t", BOUNDS, start, end, True)) == [("b", 1, 20, 30)]


def test_plan_out_of_range_fails_naming_the_queue_or_clamps() -> None:
    start = parse_offsets('{"b": {"1": 2}}', "s", EARLIEST)
    end = parse_offsets(None, "e", LATEST)
    with pytest.raises(OffsetOutOfRangeError, match=r"starting offset 2 of t b/1 is out of "
                                                    r"range: the queue holds \[5, 50\)"):
        plan_ranges("t", BOUNDS, start, end, True)
    assert ("b", 1, 5, 50) in _spans(plan_ranges("t", BOUNDS, start, end, False))


def test_plan_start_after_end() -> None:
    start = parse_offsets('{"b": {"1": 40}}', "s", EARLIEST)
    end = parse_offsets('{"b": {"1": 30}}', "e", LATEST)
    with pytest.raises(OffsetOutOfRangeError, match="starting offset 40 is after ending"):
        plan_ranges("t", BOUNDS, start, end, True)
    assert ("b", 1) not in {s[:2] for s in _spans(plan_ranges("t", BOUNDS, start, end, False))}


def test_share_rows_is_proportional_and_always_moves() -> None:
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 10}
    end = {("a", 0): 300, ("a", 1): 100, ("b", 0): 10}
    cut = share_rows(start, end, 40)
    assert cut == {("a", 0): 30, ("a", 1): 10, ("b", 0): 10}
    assert sum(cut[k] - start[k] for k in cut) == 40
    tiny = share_rows(start, end, 1)
    assert sum(tiny[k] - start[k] for k in tiny) == 1
    assert share_rows(start, end, 10_000) == end


def test_stream_offsets_round_trip() -> None:
    pos = {("b", 3): 7, ("a", 0): 1}
    assert to_offset(pos) == {"a": {"0": 1}, "b": {"3": 7}}
    assert from_offset(to_offset(pos)) == pos
    with pytest.raises(SourceOptionError):
        from_offset({"a": 5})


@pytest.mark.parametrize(("options", "match"), [
    ({"offsetOutOfRange": "ignore"}, "offsetOutOfRange must be fail or clamp"),
    ({"startingOffsets": "first"}, "startingOffsets must be earliest or latest or JSON"),
    ({"startingOffsets": '{"b": {"x": 1}}'}, "must be a queue id mapped to an offset"),
    ({"startingOffsets": '[1]'}, "must be an object of brokers"),
    ({"endingOffsets": "earliest"}, "endingOffsets must be latest or JSON"),
    ({"startingOffset": "earliest"}, "unknown option"),
    ({"startingTimestampMs": "yesterday"}, "startingTimestampMs must be an integer"),
    ({"endingTimestampMs": "-5"}, "endingTimestampMs must be >= 0"),
    ({"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger is for streaming reads only"),
    ({"path": "/x"}, None),
])
def test_bad_read_options(options: dict, match: str | None) -> None:
    opts = {"namesrv": "h:1", "topic": "t", **options}
    if match is None:   # fine for a batch read, refused for a stream
        read_options(opts, stream=False)
        match = "batch reads only"
        with pytest.raises(SourceOptionError, match=match):
            read_options(opts, stream=True)
        return
    with pytest.raises(SourceOptionError, match=match):
        read_options(opts, stream=False)


def test_read_options_rules() -> None:
    base = {"namesrv": "h:1", "topic": "t"}
    assert read_options(base, stream=False).starting.default == EARLIEST
    assert read_options(base, stream=True).starting.default == LATEST
    assert read_options({**base, "startingTimestampMs": "5"}, stream=False).starting \
        .timestamp_ms == 5
    assert read_options({"path": "/x", "topic": "%DLQ%g"}, stream=False).store_dir == "/x"
    for bad in ({**base, "startingOffsets": "earliest", "startingTimestampMs": "1"},
                {**base, "topic": "bad topic"}, {"topic": "t", "path": "/x", "x": "1"}):
        with pytest.raises(SourceOptionError):
            read_options(bad, stream=False)
    with pytest.raises(SourceOptionError, match="batch reads only"):
        read_options({**base, "endingOffsets": "latest"}, stream=True)
