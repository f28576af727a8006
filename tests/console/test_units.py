"""The console's pure parts: configuration, the trace timeline, rates, the stats flattening."""
from __future__ import annotations

from typing import Any

import pytest
from ferry_console.config import ConsoleConfig
from ferry_console.pages.services import MAX_ROWS, flatten
from ferry_console.proxies import parse_networks
from ferry_console.rates import RateSampler, topic_totals
from ferry_console.series import SeriesKey, SeriesStore
from ferry_console.sources import BrokerView
from ferry_console.throttle import FailureBudget, LoginThrottle
from ferry_console.trace import timeline


def _span(hop: str, start_ms: int, end_ms: int, status: str = "OK", **attrs: Any
          ) -> dict[str, Any]:
    return {"trace_id": "a" * 32, "span_id": f"{start_ms:016x}", "parent_span_id": None,
            "name": f"{hop} orders", "kind": "PRODUCER", "start_ns": start_ms * 1_000_000,
            "end_ns": end_ms * 1_000_000, "status": status, "status_message": "",
            "service": "svc", "attributes": {"ferry.hop": hop, **attrs}, "links": [],
            "events": []}


def test_config_defaults_env_and_bad_values() -> None:
    cfg = ConsoleConfig.from_env({})
    assert (cfg.http_port, cfg.namesrv, cfg.delay_scheduler, cfg.txn_checker, cfg.dedup) == \
        (10927, "127.0.0.1:9876", "127.0.0.1:10922", "127.0.0.1:10923", "127.0.0.1:10926")
    cfg = ConsoleConfig.from_env({"FERRY_CONSOLE_HTTP_PORT": "0", "FERRY_CONSOLE_DEDUP": ""})
    assert cfg.http_port == 0 and cfg.dedup == ""
    for env in ({"FERRY_CONSOLE_HTTP_PORT": "70000"}, {"FERRY_CONSOLE_LIST_ROWS": "0"},
                {"FERRY_CONSOLE_PREVIEW_BYTES": str(1 << 20)}, {"FERRY_CONSOLE_LOG_LEVEL": "x"},
                {"FERRY_CONSOLE_CHART_POINTS": "0"}, {"FERRY_CONSOLE_CHART_POINTS": "10001"},
                {"FERRY_CONSOLE_CHART_SERIES": "100001"}, {"FERRY_CONSOLE_RATE_INTERVAL_MS": "0"}):
        with pytest.raises(ValueError):
            ConsoleConfig.from_env(env)


def test_timeline_orders_hops_and_scales_bars() -> None:
    spans = [_span("process", 60, 100, "ERROR", **{"ferry.outcome": "failed"}),
             _span("send", 0, 10, **{"ferry.broker": "broker-a",
                                     "messaging.destination.name": "orders",
                                     "messaging.destination.partition.id": 2,
                                     "ferry.queue_offset": 7}),
             _span("store", 5, 8), {"name": "broken"}]
    hops = timeline(spans)
    assert [h.hop for h in hops] == ["send", "store", "process"]
    assert hops[0].where == "broker-a · orders · queue 2 · offset 7"
    assert hops[0].left_percent == 0 and hops[0].width_percent == 10
    assert hops[2].left_percent == 60 and hops[2].width_percent == 40
    assert (hops[2].outcome, hops[2].failed) == ("failed", True)
    assert (hops[0].outcome, hops[0].failed) == ("ok", False)
    assert hops[1].start_ms == 5 and hops[1].duration_ms == 3
    assert timeline([]) == []


def _broker(name: str, topics: dict[str, Any], groups: dict[str, Any] | None = None,
            role: str = "master") -> BrokerView:
    return BrokerView({"name": name, "id": 0 if role == "master" else 1},
                      {"topics": topics, "groups": groups or {}, "replication": {"role": role},
                       "store": {"commit_log_min_offset": 0, "commit_log_max_offset": 900,
                                 "flushed_offset": 600, "disk_used_ratio": 0.25}})


def _delivering(name: str, delivery: dict[str, Any], role: str = "master") -> BrokerView:
    view = _broker(name, {}, role=role)
    assert view.stats is not None
    view.stats["delivery"] = delivery
    return view


def test_latency_series_from_delivery_totals() -> None:
    """The mean age of what was delivered between two rounds, over every member (slaves
    too); a pair new on a member read before grew from 0; a restarted member's totals
    (gone down) and a member not read before add nothing; no delivery, no point."""
    rates = RateSampler(None, 1000)  # type: ignore[arg-type]
    t = {"delivered": 10, "latency_ms_sum": 1000}
    rates.sample(1.0, [_delivering("a", {"g": {"t": t}}), _delivering("b", {"g": {"t": t}})])
    rates.sample(2.0, [
        _delivering("a", {"g": {"t": {"delivered": 14, "latency_ms_sum": 1800},
                                "u": {"delivered": 2, "latency_ms_sum": 400}}}),
        _delivering("b", {"g": {"t": {"delivered": 3, "latency_ms_sum": 9}}}),   # restarted
        _delivering("a", {"g": {"t": {"delivered": 5, "latency_ms_sum": 500}}}, role="slave")])
    rates.sample(3.0, [_delivering("a", {"g": {"t": {"delivered": 14, "latency_ms_sum": 1800},
                                               "u": {"delivered": 2, "latency_ms_sum": 400}}})])
    series = rates.series
    # a/0: 4 messages, 800 ms; a/0 u: 2, 400 ms; a/1 was not read before: left out
    assert series.points(SeriesKey("group.latency_ms", "g")) == [(2.0, 200.0)]
    assert series.points(SeriesKey("topic.group_latency_ms", "t g")) == [(2.0, 200.0)]
    assert series.points(SeriesKey("topic.group_latency_ms", "u g")) == [(2.0, 200.0)]
    assert series.subjects("topic.group_latency_ms", "t ") == ["t g"]


def test_rates_from_two_samples() -> None:
    brokers = [BrokerView({"name": "a"}, {"topics": {"t": {"0": {"max_offset": 4},
                                                           "1": {"max_offset": 6}}}}),
               BrokerView({"name": "a", "role": "slave"}, {"topics": {"t": {"0": {"max_offset": 4}}},
                                                            "replication": {"role": "slave"}}),
               BrokerView({"name": "b"}, None)]
    assert topic_totals(brokers) == {"t": 10}
    rates = RateSampler(None, 1000)  # type: ignore[arg-type]
    assert rates.rate("t") is None
    rates.sample(1.0, [_broker("a", {"t": {"0": {"max_offset": 4}, "1": {"max_offset": 6}}})])
    assert rates.rate("t") is None   # one sample: no rate yet
    rates.sample(3.0, [_broker("a", {"t": {"0": {"max_offset": 14}, "1": {"max_offset": 16}},
                                     "u": {"0": {"max_offset": 1}}})])
    assert rates.rate("t") == 10.0 and rates.rate("u") is None


def test_chart_series_from_samples() -> None:
    """Rates count only the queues seen in both rounds: a broker missing from a round or a
    group that appears adds no spike; a reset backwards counts as zero."""
    rates = RateSampler(None, 1000, max_points=3)  # type: ignore[arg-type]
    g = {"c": {"t": {"0": {"committed_offset": 5, "lag": 5}}}}
    rates.sample(10.0, [_broker("a", {"t": {"0": {"max_offset": 10}}}, g),
                        _broker("b", {"t": {"0": {"max_offset": 100}}})])
    g2 = {"c": {"t": {"0": {"committed_offset": 9, "lag": 3}}},
          "new": {"t": {"0": {"committed_offset": 500, "lag": 0}}}}
    rates.sample(12.0, [_broker("a", {"t": {"0": {"max_offset": 12}}}, g2),
                        _broker("a", {"t": {"0": {"max_offset": 999}}}, role="slave")])
    series = rates.series
    assert series.points(SeriesKey("topic.produce_rate", "t")) == [(12.0, 1.0)]
    assert series.points(SeriesKey("group.consume_rate", "c")) == [(12.0, 2.0)]
    assert series.points(SeriesKey("topic.consume_rate", "t")) == [(12.0, 2.0)]
    assert series.points(SeriesKey("group.consume_rate", "new")) == []
    assert series.points(SeriesKey("group.lag", "c")) == [(10.0, 5), (12.0, 3)]
    assert series.points(SeriesKey("broker.flush_lag_bytes", "a/0"))[-1] == (12.0, 300)
    assert series.points(SeriesKey("broker.disk_used_percent", "a/1"))[-1] == (12.0, 25.0)
    assert series.points(SeriesKey("broker.commit_log_bytes", "b/0")) == [(10.0, 900)]
    g3 = {"c": {"t": {"0": {"committed_offset": 1, "lag": 11}}}}   # reset to an earlier offset
    for at in (14.0, 16.0, 18.0):
        rates.sample(at, [_broker("a", {"t": {"0": {"max_offset": 12}}}, g3)])
    assert series.points(SeriesKey("group.consume_rate", "c")) == [
        (14.0, 0.0), (16.0, 0.0), (18.0, 0.0)]   # the last max_points only
    assert len(series.points(SeriesKey("group.lag", "c"))) == 3


def test_the_series_store_is_bounded() -> None:
    store = SeriesStore(max_points=2, max_series=2)
    for i in range(3):
        store.add(SeriesKey("m", "a"), i, i)
    store.add(SeriesKey("m", "b"), 3, 1)
    store.add(SeriesKey("m", "a"), 4, 1)   # a is now the freshest
    store.add(SeriesKey("m", "c"), 5, 1)   # over the cap: b, the stalest, goes
    assert len(store) == 2 and store.dropped_series == 1
    assert store.points(SeriesKey("m", "b")) == []
    assert store.points(SeriesKey("m", "a")) == [(2, 2), (4, 1)]
    with pytest.raises(ValueError):
        SeriesStore(0, 1)


def test_flatten_stats() -> None:
    rows = flatten({"open": 3, "brokers": {"a": {"half_next": 5}}, "list": [1, 2], "s": "x" * 500})
    assert rows[:2] == [("brokers.a.half_next", "5"), ("list", "[1, 2]")]
    assert ("open", "3") in rows and len(dict(rows)["s"]) == 161
    assert len(flatten({str(i): i for i in range(1000)})) == MAX_ROWS


def test_cluster_page_shows_the_disk_alarm() -> None:
    from ferry_console.pages.cluster import broker_row
    from ferry_console.pages.common import environment

    info = {"name": "broker-a", "cluster": "c", "id": 0, "addr": "h:1", "http_addr": "h:2"}
    stats: dict[str, Any] = {"store": {"healthy": True, "disk_used_ratio": 0.93},
                             "disk": {"alarm": True, "used_ratio": 0.93, "held_by_floor": True,
                                      "high_water_ratio": 0.9, "low_water_ratio": 0.85}}
    row = broker_row(BrokerView(info, stats))
    assert row["disk_alarm"] and row["disk_high_percent"] == 90.0 and row["ok"]
    quiet = broker_row(BrokerView(info, {"store": {"healthy": True}}))  # an older broker
    assert not quiet["disk_alarm"]
    page = environment().get_template("cluster.html")
    html = page.render(path="/console/cluster", user=None, title="Cluster", namesrv="n",
                       brokers=[row, quiet],
                       topic_count=0, group_count=0)
    assert html.count("disk full: writes refused") == 1 and "disk-alarm" in html
    assert "consumers have not read" in html


def test_failure_budget_refuses_past_the_budget_until_the_window_ends() -> None:
    now = [0]
    budget = FailureBudget(2, 60_000, max_keys=3, clock=lambda: now[0])
    budget.failed("a")
    assert budget.retry_after_ms("a") == 0
    budget.failed("a")
    assert budget.retry_after_ms("a") == 60_000 and budget.retry_after_ms("b") == 0
    now[0] = 59_999
    assert budget.retry_after_ms("a") == 1
    now[0] = 60_000   # the window from the first failure has ended
    assert budget.retry_after_ms("a") == 0
    budget.failed("a")
    assert budget.retry_after_ms("a") == 0 and len(budget) == 1
    # full: keys not followed share one overflow count with the same budget
    for key in ("b", "c", "d", "e"):
        budget.failed(key)
    assert len(budget) == 4 and budget.retry_after_ms("z") == 60_000   # 3 keys + the overflow


def test_login_throttle_counts_an_attempt_until_it_is_forgiven() -> None:
    throttle = LoginThrottle(per_address=1, per_identity=2)
    assert throttle.attempt("10.0.0.1", "app") is None   # counted from here on
    refused = throttle.attempt("10.0.0.1", "other")
    assert refused is not None and "from your address" in refused[0] and refused[1] == 60
    throttle.forgive("10.0.0.1", "app")   # it logged in
    assert throttle.attempt("10.0.0.1", "app") is None
    assert throttle.attempt("10.0.0.2", "app") is None
    refused = throttle.attempt("10.0.0.3", "app")
    assert refused is not None and "for this access key" in refused[0]
    assert throttle.attempt("10.0.0.3", "") is None and throttle.refused == 2


def test_proxy_settings_are_checked() -> None:
    assert [str(n) for n in parse_networks(" 10.0.0.1, 192.168.0.0/16,::1 ")] == \
        ["10.0.0.1/32", "192.168.0.0/16", "::1/128"]
    for bad in ({"FERRY_CONSOLE_COOKIE_SECURE": "yes"},
                {"FERRY_CONSOLE_TRUSTED_PROXIES": "10.0.0.1,proxy.example"},
                {"FERRY_CONSOLE_MAX_SESSIONS_PER_IDENTITY": "0"}):
        with pytest.raises(ValueError):
            ConsoleConfig.from_env(bad)


def test_a_logout_stops_the_sessions_clients_only_after_its_requests_in_flight() -> None:
    # Found by tests/fuzz: a logout during a page of the same session closed the page's
    # clients under it (a 500, "Session is closed").
    import asyncio

    from ferry_console.sessions import Session

    class Clients:
        stopped = 0

        async def stop(self) -> None:
            self.stopped += 1

    async def scenario() -> None:
        clients = Clients()
        session = Session("sid", "alice", 0, clients)  # type: ignore[arg-type]
        started, release = asyncio.Event(), asyncio.Event()

        async def page() -> str:
            started.set()
            await release.wait()
            assert clients.stopped == 0, "the clients stopped under a request in flight"
            return "page"

        request = asyncio.ensure_future(session.serve(page))
        await started.wait()
        await session.end()
        assert clients.stopped == 0
        release.set()
        assert await request == "page"
        assert clients.stopped == 1
        idle = Session("sid2", "bob", 0, Clients())  # type: ignore[arg-type]
        await idle.end()
        assert idle.sources.stopped == 1  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_charts_need_the_stats_read_as_the_user() -> None:
    """With a login, a group or cluster page draws charts only if it read some broker's stats
    with the user's credentials (the samples were read as the console)."""
    from aiohttp.test_utils import make_mocked_request
    from ferry_console.pages.charts import stats_were_read
    from ferry_console.pages.common import SESSION

    refused = [BrokerView({"name": "a"}, None), BrokerView({"name": "b"}, None)]
    request = make_mocked_request("GET", "/console/groups/g")
    assert stats_were_read(request, refused)          # auth off: the console's own reads
    request[SESSION] = object()  # type: ignore[assignment]
    assert not stats_were_read(request, refused)
    assert stats_were_read(request, [*refused, BrokerView({"name": "c"}, {})])
