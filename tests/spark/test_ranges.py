"""Planning without Spark running: offsets options, queue ranges, micro-batch limits."""
from __future__ import annotations

import pytest
from ferry.errors import OffsetOutOfRangeError
from ferry_spark.errors import SourceOptionError
from ferry_spark.source.options import EARLIEST, LATEST, parse_offsets, read_options
from ferry_spark.source.ranges import QueueBounds, plan_ranges, split_ranges
from ferry_spark.source.stream import from_offset, share_rows, to_offset

BOUNDS = [QueueBounds("t", "b", 1, 5, 50), QueueBounds("t", "a", 0, 0, 10),
          QueueBounds("t", "a", 1, 0, 0)]


def _spans(ranges) -> list[tuple]:
    return [(r.broker, r.queue_id, r.start, r.end) for r in ranges]


def test_plan_reads_every_queue_with_data_sorted() -> None:
    ranges = plan_ranges(BOUNDS, parse_offsets(None, "s", EARLIEST),
                         parse_offsets(None, "e", LATEST), True)
    assert _spans(ranges) == [("a", 0, 0, 10), ("b", 1, 5, 50)]


def test_plan_named_queues_and_their_defaults() -> None:
    start = parse_offsets('{"b": {"1": 20}, "a": {"0": -1}}', "s", EARLIEST)
    end = parse_offsets('{"b": {"1": 30}}', "e", LATEST)
    assert _spans(plan_ranges(BOUNDS, start, end, True)) == [("b", 1, 20, 30)]


def test_plan_out_of_range_fails_naming_the_queue_or_clamps() -> None:
    start = parse_offsets('{"b": {"1": 2}}', "s", EARLIEST)
    end = parse_offsets(None, "e", LATEST)
    with pytest.raises(OffsetOutOfRangeError, match=r"starting offset 2 of t b/1 is out of "
                                                    r"range: the queue holds \[5, 50\)"):
        plan_ranges(BOUNDS, start, end, True)
    assert ("b", 1, 5, 50) in _spans(plan_ranges(BOUNDS, start, end, False))


def test_plan_start_after_end() -> None:
    start = parse_offsets('{"b": {"1": 40}}', "s", EARLIEST)
    end = parse_offsets('{"b": {"1": 30}}', "e", LATEST)
    with pytest.raises(OffsetOutOfRangeError, match="starting offset 40 is after ending"):
        plan_ranges(BOUNDS, start, end, True)
    assert ("b", 1) not in {s[:2] for s in _spans(plan_ranges(BOUNDS, start, end, False))}


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
    pos = {("t", "b", 3): 7, ("t", "a", 0): 1, ("u", "a", 0): 2}
    assert to_offset(pos) == {"t": {"a": {"0": 1}, "b": {"3": 7}}, "u": {"a": {"0": 2}}}
    assert from_offset(to_offset(pos)) == pos
    # A checkpoint of a one-topic read from before topic lists: brokers at the top.
    assert from_offset({"a": {"0": 1}, "b": {"3": 7}}, "t") == {("t", "a", 0): 1,
                                                                ("t", "b", 3): 7}
    for bad in ({"a": 5}, {"t": {"a": {"x": 1}}}):
        with pytest.raises(SourceOptionError):
            from_offset(bad)
    with pytest.raises(SourceOptionError):   # brokers at the top, no topic to give them
        from_offset({"a": {"0": 1}})


def test_offsets_json_may_name_topics() -> None:
    start = parse_offsets('{"t": {"b": {"1": 20}}, "u": {"b": {"1": 7}}, "a": {"0": 3}}', "s",
                          EARLIEST)
    assert start.for_queue("t", "b", 1) == 20 and start.for_queue("u", "b", 1) == 7
    assert start.for_queue("v", "b", 1) == EARLIEST
    assert start.for_queue("v", "a", 0) == 3   # broker-level: any topic


def test_min_partitions_splits_large_ranges_in_proportion() -> None:
    bounds = [QueueBounds("t", "a", 0, 0, 1000), QueueBounds("t", "a", 1, 0, 100),
              QueueBounds("t", "b", 0, 0, 3)]
    ranges = plan_ranges(bounds, parse_offsets(None, "s", EARLIEST),
                         parse_offsets(None, "e", LATEST), True)
    assert split_ranges(ranges, None) == ranges and split_ranges(ranges, 3) == ranges
    split = split_ranges(ranges, 10)
    by_queue: dict = {}
    for r in split:
        by_queue.setdefault((r.broker, r.queue_id), []).append((r.start, r.end))
    assert len(by_queue[("a", 0)]) == 9 and len(by_queue[("a", 1)]) == 1
    assert by_queue[("b", 0)] == [(0, 3)]   # at least one part each
    for spans in by_queue.values():   # the parts tile each range exactly
        assert all(b == c for (_, b), (c, _) in zip(spans, spans[1:], strict=False))
    assert by_queue[("a", 0)][0][0] == 0 and by_queue[("a", 0)][-1][1] == 1000
    tiny = split_ranges(plan_ranges([QueueBounds("t", "a", 0, 0, 2)],
                                    parse_offsets(None, "s", EARLIEST),
                                    parse_offsets(None, "e", LATEST), True), 8)
    assert [(r.start, r.end) for r in tiny] == [(0, 1), (1, 2)]   # never an empty part


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
    ({"topicPattern": "a.*"}, "give option topic or topicPattern, not both"),
    ({"topic": "", "topicPattern": "a("}, "option topicPattern: missing"),
    ({"topic": "t,bad topic"}, "option topic:"),
    ({"filter": "a >", "filterType": "SQL92"}, r"option filter \(SQL92\)"),
    ({"filterType": "regex"}, "filterType must be TAG or SQL92"),
    ({"pushDownPredicate": "yes"}, "pushDownPredicate must be true or false"),
    ({"groupId": "bad group"}, "option groupId"),
    ({"groupId": "g"}, "groupId is for streaming reads only"),
    ({"minPartitions": "0"}, "minPartitions must be >= 1"),
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
    many = read_options({**base, "topic": " t, u,t "}, stream=True)
    assert many.topics == ("t", "u") and many.topic_pattern is None
    pattern = read_options({"namesrv": "h:1", "topicPattern": "orders-.*"}, stream=True)
    assert pattern.topics == () and pattern.topic_pattern == "orders-.*"
    tags = read_options({**base, "filter": "a || b"}, stream=False).filter
    assert tags.fields() == {"tags": ["a", "b"], "sql": None}
    sql = read_options({**base, "filter": "n > 3", "filterType": "sql92"}, stream=True).filter
    assert sql.fields() == {"tags": None, "sql": "n > 3"}
    assert read_options(base, stream=False).filter.is_all
    with pytest.raises(SourceOptionError, match="takes one topic"):
        read_options({"path": "/x", "topic": "t,u"}, stream=False)
    with pytest.raises(SourceOptionError, match="for network reads"):
        read_options({"path": "/x", "topic": "t", "filter": "a"}, stream=False)
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
