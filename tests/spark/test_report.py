"""The report on a real traced mesh run: counts exact, latencies as the test measured them.

One module run (tests/spark/pipeline_run.py): `orders` gets 30 plain and 6
delayed (1.5 s) traced messages, read by group `fast` (all) and `slow` (10,
then it stops); `pay` gets 8 read by group `retry` (retry_max 2, back-off
300 ms through the scheduler): 4 fine, 2 failing once, 2 always (→ DLQ).
The report runs once on local[2] Spark over the trace files and the topics.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.spark import pipeline_run as run
from tests.support.procs import Etcd

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: How far the report's latency of a message may stand from what the test measured around
#: the same events (the send call's start, the handler's end): scheduling on a busy machine.
TOLERANCE_MS = 300


@pytest.fixture(scope="module")
def mesh_run(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Any, run.Truth, Path]]:
    workdir = tmp_path_factory.mktemp("report-mesh")
    traces = workdir / "traces"
    with run.traced_env(traces):
        mesh, scheduler = run.start_traced_mesh(etcd, workdir)
        try:
            truth = asyncio.run(run.run_scenario(mesh))
            run.wait_for_spans(traces, truth)
            yield mesh, truth, traces
        finally:
            scheduler.proc.stop()
            mesh.stop()


@pytest.fixture(scope="module")
def report(spark: Any, mesh_run: tuple[Any, run.Truth, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ferry_spark.jobs.report import run_report
    mesh, truth, traces = mesh_run
    out = tmp_path_factory.mktemp("report-out")
    return run_report(spark, mesh.namesrv, str(traces), out, topics=[truth.orders, truth.pay])


def row(df: pd.DataFrame, **match: Any) -> pd.Series:
    sel = df
    for col, value in match.items():
        sel = sel[sel[col] == value]
    assert len(sel) == 1, (match, df)
    return sel.iloc[0]


def test_e2e_counts_and_outcomes_per_topic_and_group(report: Any, mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    orders = row(report.e2e, topic=truth.orders, group=truth.fast)
    assert (orders["messages"], orders["ok"], orders["deliveries"], orders["retries"]) == \
        (run.PLAIN + run.DELAYED, run.PLAIN + run.DELAYED, run.PLAIN + run.DELAYED, 0)
    slow = row(report.e2e, topic=truth.orders, group=truth.slow)
    assert slow["messages"] == truth.slow_read and slow["received"] == truth.slow_read
    pay = row(report.e2e, topic=truth.pay, group=truth.retry)
    assert pay["messages"] == run.PAY_OK + run.PAY_ONCE + run.PAY_POISON
    assert (pay["ok"], pay["dead_letter"]) == (run.PAY_OK + run.PAY_ONCE, run.PAY_POISON)
    assert pay["deliveries"] == run.PAY_OK + 2 * run.PAY_ONCE + \
        (run.MAX_RECONSUME + 1) * run.PAY_POISON
    assert pay["retries"] == run.PAY_ONCE + run.MAX_RECONSUME * run.PAY_POISON


def test_latencies_match_what_the_test_measured(report: Any, mesh_run: Any) -> None:
    """Per message: the report's e2e is the send→last handler time the test saw; delayed ones
    wait at least the delay, so the topic's p95/p99 do too."""
    _, truth, _ = mesh_run
    per = report.deliveries
    fast = per[per["group"] == truth.fast].set_index("msg_id")
    assert set(fast.index) == {m for m, k in truth.kind.items() if k == "orders"}
    for msg_id, e2e_ms in fast["e2e_ms"].items():
        measured_ms = (truth.done_ns[msg_id] - truth.sent_ns[msg_id]) / 1e6
        assert abs(e2e_ms - measured_ms) < TOLERANCE_MS, (msg_id, e2e_ms, measured_ms)
        if msg_id in truth.delayed:
            assert e2e_ms >= run.DELAY_MS
    orders = row(report.e2e, topic=truth.orders, group=truth.fast)
    share_delayed = run.DELAYED / (run.PLAIN + run.DELAYED)   # 1/6: above the 95th percentile
    assert share_delayed > 0.05 and orders["p95_ms"] >= run.DELAY_MS
    assert orders["p50_ms"] < run.DELAY_MS <= orders["p99_ms"] <= orders["max_ms"]
    pay = per[per["group"] == truth.retry].set_index("msg_id")
    for msg_id, kind in ((m, k) for m, k in truth.kind.items() if k in ("once", "poison")):
        retries = 1 if kind == "once" else run.MAX_RECONSUME
        assert pay.loc[msg_id, "e2e_ms"] >= retries * run.BACKOFF_MS   # the back-off waits


def test_hops_follow_the_messages_path(report: Any, mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    hops = report.hops
    assert row(hops, topic=truth.orders, group="-", hop="send")["spans"] == \
        run.PLAIN + run.DELAYED
    for hop in ("schedule", "deliver"):
        assert row(hops, topic=truth.orders, group="-", hop=hop)["spans"] == run.DELAYED
    # a delayed message is stored twice: in %SCHEDULE%, then in its topic when due
    assert row(hops, topic=truth.orders, group="-", hop="store")["spans"] == \
        run.PLAIN + 2 * run.DELAYED
    deliver = row(hops, topic=truth.orders, group="-", hop="deliver")
    assert deliver["p50_ms"] >= run.DELAY_MS
    receive = row(hops, topic=truth.orders, group=truth.fast, hop="receive")
    assert receive["spans"] == run.PLAIN + run.DELAYED
    for service in ("ferry-client", "ferry-broker"):   # the consumer's send-back, the store
        assert row(hops, topic=truth.pay, group=truth.retry, hop="dlq",
                   service=service)["spans"] == run.PAY_POISON


def test_retries_and_dead_letters_from_the_topics_and_the_spans(report: Any,
                                                                mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    pay = row(report.retries, group=truth.retry, topic=truth.pay)
    retries = run.PAY_ONCE + run.MAX_RECONSUME * run.PAY_POISON
    assert (pay["retried"], pay["dead_lettered"]) == (retries, run.PAY_POISON), report.retries
    assert (pay["retry_spans"], pay["dlq_spans"]) == (retries, run.PAY_POISON)
    assert report.retries[report.retries["group"] == truth.fast]["retried"].sum() == 0


def test_throughput_counts_every_stored_message(report: Any, mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    per_topic = report.throughput.groupby("topic")["messages"].sum()
    assert per_topic[truth.orders] == run.PLAIN + run.DELAYED
    assert per_topic[truth.pay] == run.PAY_OK + run.PAY_ONCE + run.PAY_POISON
    assert report.messages == run.PLAIN + run.DELAYED + run.PAY_OK + run.PAY_ONCE + \
        run.PAY_POISON


def test_lag_over_time_ends_where_the_committed_offsets_are(report: Any,
                                                            mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    total = run.PLAIN + run.DELAYED
    assert row(report.lag_now, topic=truth.orders, group=truth.slow)["lag"] == \
        total - truth.slow_read
    assert row(report.lag_now, topic=truth.orders, group=truth.fast)["lag"] == 0
    slow = report.lag[(report.lag["topic"] == truth.orders) & (report.lag["group"] == truth.slow)]
    fast = report.lag[(report.lag["topic"] == truth.orders) & (report.lag["group"] == truth.fast)]
    assert slow.sort_values("ts")["lag"].iloc[-1] == total - truth.slow_read
    assert fast.sort_values("ts")["lag"].iloc[-1] == 0
    assert (slow["lag"] >= 0).all() and slow["lag"].max() <= total


def test_the_page_and_tables_are_written(report: Any, mesh_run: Any) -> None:
    _, truth, _ = mesh_run
    page = report.html_path.read_text()
    assert page.count("<img") == 5 and "data:image/png;base64," in page
    assert "src='http" not in page and "<script" not in page   # self-contained
    assert truth.orders in page and truth.retry in page
    out = report.html_path.parent
    for name in ("e2e", "hops", "deliveries", "throughput", "retries", "lag", "lag_now"):
        back = pd.read_parquet(out / f"{name}.parquet")
        assert len(back) == len(report.table(name))
    spans = pd.read_parquet(out.parent / "spans")
    assert len(spans) == report.spans


def test_docs_list_every_table_with_its_columns(report: Any) -> None:
    """docs/spark.md's table of the report's Parquet tables is the code's."""
    from ferry_spark.jobs.report import TABLES
    doc = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    listed = dict(re.findall(r"^\| `(\w+)` \| ([a-z0-9_, ()`'-]+?) \|$", doc, re.M))
    for name in TABLES:
        want = [re.sub(r" \(.*", "", c).strip() for c in listed[name].split(", ")]
        assert want == list(report.table(name).columns), name
