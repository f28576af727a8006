"""DeliveryLatency (delivery_latency.py): per (group, topic), the records delivered and the sum
of their ages at delivery, bounded."""
from __future__ import annotations

from ferry.codec.record import AT_STORE_TS_MS, I64
from ferry_broker.delivery_latency import DeliveryLatency


def _record(store_ts_ms: int) -> bytes:
    raw = bytearray(AT_STORE_TS_MS + I64.size)
    I64.pack_into(raw, AT_STORE_TS_MS, store_ts_ms)
    return bytes(raw)


def test_ages_are_summed_and_counted_per_group_and_topic() -> None:
    d = DeliveryLatency(clock_ms=lambda: 10_000)
    d.record("g", "t", [_record(9_000), _record(9_500)])
    d.record("g", "t", [_record(10_000)])
    d.record("h", "t", [_record(10_200)])   # a clock behind the store's: age 0, not negative
    assert d.as_json() == {"g": {"t": {"delivered": 3, "latency_ms_sum": 1500}},
                           "h": {"t": {"delivered": 1, "latency_ms_sum": 0}}}


def test_the_pair_delivered_to_least_recently_is_dropped_past_the_bound() -> None:
    d = DeliveryLatency(max_entries=2, clock_ms=lambda: 0)
    for group in ("a", "b", "a", "c"):
        d.record(group, "t", [_record(0)])
    assert len(d) == 2 and sorted(g for g, *_ in d.items()) == ["a", "c"]
