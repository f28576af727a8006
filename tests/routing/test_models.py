"""BrokerInfo, TopicConfig and GroupConfig: JSON round trips and validation."""
from __future__ import annotations

import pytest
from ferry.errors import InvalidNameError, MalformedRequestError
from ferry.routing import BrokerInfo, GroupConfig, InvalidConfigError, TopicConfig


def test_topic_round_trip_and_defaults() -> None:
    cfg = TopicConfig("orders", queues=4, perm="r", type="fifo", brokers=("broker-a",))
    assert TopicConfig.from_json(cfg.to_json()) == cfg
    assert TopicConfig.from_dict({"name": "t"}) == TopicConfig("t", 8, "rw", "normal", ())
    assert cfg.readable and not cfg.writable
    levels = TopicConfig("urgent", queues=4, priority_levels=3)
    assert TopicConfig.from_json(levels.to_json()) == levels
    assert TopicConfig.from_dict({"name": "t"}).priority_levels == 1


def test_broker_round_trip() -> None:
    info = BrokerInfo("c1", "broker-a", 1, "127.0.0.1:10911", "127.0.0.1:10912", "",
                      {"orders": 8, "%RETRY%g1": 1})
    assert BrokerInfo.from_json(info.to_json()) == info
    assert info.to_dict()["id"] == 1 and not info.is_master


def test_group_round_trip() -> None:
    cfg = GroupConfig("g1", retry_max=3, broadcast_allowed=False, consume_from="timestamp",
                      consume_timestamp_ms=1_700_000_000_000)
    assert GroupConfig.from_json(cfg.to_json()) == cfg
    cfg = GroupConfig("g1", retry_backoff_ms=(0, 100))
    assert GroupConfig.from_json(cfg.to_json()) == cfg


def test_group_retry_defaults_alias_and_backoff_by_attempt() -> None:
    cfg = GroupConfig.from_dict({"name": "g"})
    # RocketMQ's delay levels from its third on: 10s 30s 1m 2m ... 20m 30m 1h 2h
    assert cfg.retry_max == 16 and len(cfg.retry_backoff_ms) == 16
    assert cfg.retry_backoff_ms[:4] == (10_000, 30_000, 60_000, 120_000)
    assert cfg.retry_backoff_ms[-1] == 7_200_000
    assert [cfg.backoff_ms(n) for n in (1, 2, 16, 17, 40)] == \
        [10_000, 30_000, 7_200_000, 7_200_000, 7_200_000]
    alias = GroupConfig.from_dict({"name": "g", "max_reconsume_times": 2}, strict=True)
    assert alias.retry_max == 2 and alias.to_dict()["retry_max"] == 2
    with pytest.raises(InvalidConfigError, match="not both"):
        GroupConfig.from_dict({"name": "g", "retry_max": 1, "max_reconsume_times": 2})


@pytest.mark.parametrize("bad", ["", "a b", "a/b", "x" * 128, "%FOO%x", 7, None])
def test_invalid_topic_names(bad: object) -> None:
    with pytest.raises(InvalidNameError):
        TopicConfig(bad)  # type: ignore[arg-type]


def test_internal_topics_allowed_in_config() -> None:
    assert TopicConfig("%RETRY%g1", queues=1).name == "%RETRY%g1"


@pytest.mark.parametrize("fields", [
    {"queues": 0}, {"queues": 1025}, {"queues": True}, {"queues": "8"}, {"perm": "x"},
    {"type": "weird"}, {"brokers": "broker-a"}, {"brokers": ["a/b"]}, {"brokers": ["a", "a"]},
    {"priority_levels": 0}, {"priority_levels": 5}, {"priority_levels": True},
    {"queues": 2, "priority_levels": 3},
])
def test_invalid_topic_fields(fields: dict[str, object]) -> None:
    with pytest.raises((InvalidConfigError, InvalidNameError)) as info:
        TopicConfig.from_dict({"name": "t", **fields}, strict=True)
    assert isinstance(info.value, ValueError)


def test_strict_rejects_unknown_fields_lenient_ignores_them() -> None:
    with pytest.raises(MalformedRequestError, match="unknown topic field"):
        TopicConfig.from_dict({"name": "t", "colour": "red"}, strict=True)
    assert TopicConfig.from_dict({"name": "t", "colour": "red"}).name == "t"


def test_url_name_must_match_body_name() -> None:
    assert TopicConfig.from_dict({"queues": 2}, name="t").name == "t"
    with pytest.raises(InvalidConfigError, match="differs"):
        TopicConfig.from_dict({"name": "u"}, name="t")


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"\xff", b'"x"', b"[" * 100_000])
def test_malformed_json(raw: bytes) -> None:
    with pytest.raises(InvalidConfigError):
        TopicConfig.from_json(raw)


@pytest.mark.parametrize("fields", [
    {"retry_max": -1}, {"retry_max": 65}, {"broadcast_allowed": 1},
    {"consume_from": "now"}, {"consume_timestamp_ms": -5}, {"max_reconsume_times": 65},
    {"retry_backoff_ms": []}, {"retry_backoff_ms": 10}, {"retry_backoff_ms": [-1]},
    {"retry_backoff_ms": [True]}, {"retry_backoff_ms": [0] * 65},
    {"retry_backoff_ms": [30 * 24 * 3600 * 1000 + 1]},
])
def test_invalid_group_fields(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError):
        GroupConfig.from_dict({"name": "g", **fields}, strict=True)


@pytest.mark.parametrize("fields", [
    {"addr": "nohost"}, {"addr": ""}, {"addr": "h:99999"}, {"id": -1}, {"cluster": "a b"},
    {"topics": {"t": 0}}, {"topics": []},
])
def test_invalid_broker_fields(fields: dict[str, object]) -> None:
    base = {"cluster": "c", "name": "b", "id": 0, "addr": "127.0.0.1:1"}
    with pytest.raises(ValueError):
        BrokerInfo.from_dict({**base, **fields})


def test_broker_role_and_epoch_round_trip_and_decide_the_master() -> None:
    legacy = BrokerInfo("c1", "broker-a", 1, "127.0.0.1:1")
    assert not legacy.is_master and BrokerInfo("c1", "broker-a", 0, "127.0.0.1:1").is_master
    elected = BrokerInfo("c1", "broker-a", 1, "127.0.0.1:1", role="master", epoch=7)
    assert elected.is_master and BrokerInfo.from_json(elected.to_json()) == elected
    assert not BrokerInfo("c1", "broker-a", 0, "127.0.0.1:1", role="slave").is_master
    with pytest.raises(InvalidConfigError):
        BrokerInfo("c1", "broker-a", 0, "127.0.0.1:1", role="leader")
    with pytest.raises(InvalidConfigError):
        BrokerInfo("c1", "broker-a", 0, "127.0.0.1:1", epoch=-1)


def test_topic_retention_fields() -> None:
    cfg = TopicConfig.from_dict({"name": "t", "retention_ms": 3_600_000,
                                 "retention_bytes": 1 << 30}, strict=True)
    assert (cfg.retention_ms, cfg.retention_bytes) == (3_600_000, 1 << 30)
    assert TopicConfig.from_json(cfg.to_json()) == cfg
    plain = TopicConfig.from_dict({"name": "t", "retention_ms": None}, strict=True)
    assert plain.retention_ms is None and "retention_ms" not in plain.to_dict()
    for bad in ({"retention_ms": 0}, {"retention_ms": 1.5}, {"retention_ms": False},
                {"retention_bytes": "1"}, {"retention_bytes": 2**53 + 1}):
        with pytest.raises(InvalidConfigError, match="retention_"):
            TopicConfig.from_dict({"name": "t", **bad}, strict=True)
