"""ferry.service.metrics: the label cap, FERRY_METRICS switches, the Prometheus text."""
from __future__ import annotations

import pytest
from ferry.service.metrics import (
    GROUP,
    MAX_LABEL_VALUES_ENV,
    OTHER,
    TOPIC,
    LabelCap,
    Metrics,
    max_label_values,
    metrics_enabled,
)
from prometheus_client.parser import text_string_to_metric_families

TOPIC_LABEL, GROUP_LABEL = TOPIC.replace(".", "_"), GROUP.replace(".", "_")


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(metrics.render().decode())
            for s in family.samples if s.name == name}


def test_values_beyond_the_cap_are_summed_under_other() -> None:
    cap = LabelCap(2)
    got = cap.apply([(1, {TOPIC: "a"}), (2, {TOPIC: "b"}), (3, {TOPIC: "c"}), (4, {TOPIC: "d"}),
                     (5, {TOPIC: "a", "reason": "x"})])
    assert {(o.attributes[TOPIC], o.attributes.get("reason")): o.value for o in got} == \
        {("a", None): 1, ("b", None): 2, (OTHER, None): 7, ("a", "x"): 5}
    # The first values seen keep their series for the process's life.
    assert [o.attributes[TOPIC] for o in cap.apply([(1, {TOPIC: "e"}), (1, {TOPIC: "a"})])] \
        == [OTHER, "a"]


def test_observed_counters_and_gauges_in_prometheus_text() -> None:
    m = Metrics("test", enabled=True, label_limit=1)
    m.observe("ferry.test.messages", "counter", "{message}", "m",
              lambda: [(3, {TOPIC: "t1", GROUP: "g"}), (4, {TOPIC: "t2", GROUP: "g"})])
    m.observe("ferry.test.size", "gauge", "By", "s", lambda: [(10, {})])
    m.observe("ferry.test.size", "gauge", "By", "s", lambda: [(5, {"part": "b"})])
    assert _samples(m, "ferry_test_messages_total") == {
        ((GROUP_LABEL, "g"), (TOPIC_LABEL, "t1")): 3,
        ((GROUP_LABEL, "g"), (TOPIC_LABEL, OTHER)): 4}
    assert _samples(m, "ferry_test_size_bytes") == {(("part", ""),): 10, (("part", "b"),): 5}
    m.shutdown()


def test_metrics_off_registers_nothing_and_serves_an_empty_text() -> None:
    m = Metrics("test", enabled=False)
    m.observe("ferry.test.messages", "counter", "{message}", "m", lambda: [(3, {})])
    assert m.histogram("ferry.test.h", "s", "h") is None
    assert m.render() == b""


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_METRICS", raising=False)
    monkeypatch.delenv(MAX_LABEL_VALUES_ENV, raising=False)
    assert metrics_enabled() and max_label_values() == 1000
    monkeypatch.setenv("FERRY_METRICS", "off")
    monkeypatch.setenv(MAX_LABEL_VALUES_ENV, "5")
    assert not metrics_enabled() and max_label_values() == 5
    for bad in ("0", "many"):
        monkeypatch.setenv(MAX_LABEL_VALUES_ENV, bad)
        with pytest.raises(ValueError, match=MAX_LABEL_VALUES_ENV):
            max_label_values()
    monkeypatch.setenv("FERRY_METRICS", "maybe")
    with pytest.raises(ValueError, match="FERRY_METRICS"):
        metrics_enabled()
