"""ferry_console.prometheus without a server: the PromQL of each chart series, the answers
that are not series, and the setting's check (the real server: test_charts_prometheus)."""
from __future__ import annotations

import pytest
from ferry_console.config import ConsoleConfig
from ferry_console.prometheus import PrometheusError, Series, parse_matrix, query, rate_window_s


def test_queries_name_the_subject_and_leave_slaves_out_of_rates_and_lag() -> None:
    produce = query("topic.produce_rate", "orders", 1)
    assert produce == ('sum(rate(ferry_broker_topic_messages_total{messaging_destination_name='
                       '"orders"}[60s]) unless on (job, instance) '
                       'ferry_broker_replication_lag_bytes{role="slave"})')
    assert 'messaging_consumer_group_name="g"' in query("group.lag", "g", 10)
    latency = query("group.latency_ms", "g", 30)
    assert "[120s]" in latency and "unless" not in latency   # slaves count their own pulls
    assert query("broker.flush_lag_bytes", "", 10) == "ferry_broker_flush_lag_bytes"
    by_group = query("topic.group_latency_ms", "t", 1)
    assert by_group.startswith("1000 * sum by (messaging_consumer_group_name) (rate(")
    assert query("topic.produce_rate", 'a"b\\', 1).count('a\\"b\\\\') == 1
    with pytest.raises(ValueError, match="no PromQL"):
        query("topic.unknown", "t", 1)
    assert rate_window_s(0.5) == 60 and rate_window_s(25) == 100


def test_a_range_answer_and_what_is_not_one() -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"job": "broker-b"}, "values": [[1.0, "2"], [2.0, "NaN"]]},
        {"metric": {"instance": "h:1"}, "values": [[1.0, "+Inf"]]},
        {"metric": {"job": "broker-a"}, "values": [[1.5, "3.5"]]},
        {"metric": {"messaging_consumer_group_name": "g", "job": "x"}, "values": []}]}}
    assert parse_matrix(body) == [Series("broker-a", [(1.5, 3.5)]),
                                  Series("broker-b", [(1.0, 2.0)]), Series("g", []),
                                  Series("h:1", [])]
    for bad, why in (({"status": "error", "errorType": "bad_data", "error": "parse error"},
                      "bad_data: parse error"),
                     ({"status": "success", "data": {"resultType": "vector", "result": []}},
                      "not a range result"),
                     ({"status": "success"}, "not a Prometheus answer"),
                     ([1, 2], "not a Prometheus answer")):
        with pytest.raises(PrometheusError, match=why):
            parse_matrix(bad)


def test_the_setting_takes_an_http_url_or_nothing() -> None:
    assert ConsoleConfig.from_env({}).prometheus_url == ""
    url = "http://127.0.0.1:9090"
    assert ConsoleConfig.from_env({"FERRY_CONSOLE_PROMETHEUS_URL": url}).prometheus_url == url
    with pytest.raises(ValueError, match="prometheus_url must be an http"):
        ConsoleConfig.from_env({"FERRY_CONSOLE_PROMETHEUS_URL": "127.0.0.1:9090"})
