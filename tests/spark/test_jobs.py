"""The traces and messages jobs, run as `spark-submit` runs them (their main()), on a real mesh.

Messages sent with `trace=True` by this process, which writes its spans to JSON-lines
files and to `%TRACE%`; the traces job reads both and keeps each span once.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from ferry import Consumer, Producer
from ferry.telemetry import tracing

from tests.client.conftest import Mesh, unique
from tests.spark import pipeline_run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TRACED = 12
SPANS_TIMEOUT_S = 30.0


async def send_and_read(namesrv: str, topic: str) -> list[str]:
    """TRACED traced messages sent one by one, then read by a fresh group (receive spans)."""
    async with Producer(namesrv=namesrv) as producer:
        ids = [(await producer.send_and_wait(topic, f"m{i}".encode(), key=f"k{i}",
                                             trace=True)).msg_id for i in range(TRACED)]
    got = 0
    async with Consumer(topic, group=unique("g"), namesrv=namesrv,
                        auto_offset_reset="earliest") as consumer:
        async with asyncio.timeout(30):
            while got < TRACED:
                got += sum(len(v) for v in (await consumer.getmany(timeout_ms=500)).values())
    return ids


@pytest.fixture(scope="module")
def traced_topic(spark_mesh: Mesh, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[str, list[str], Path]]:
    traces = tmp_path_factory.mktemp("job-traces")
    topic = unique("jobs")
    with pipeline_run.traced_env(traces):
        ids = asyncio.run(send_and_read(spark_mesh.namesrv, topic))
        tracing().force_flush()
        yield topic, ids, traces


def test_traces_job_keeps_each_span_once_partitioned_by_day_and_topic(
        spark: Any, spark_mesh: Mesh, traced_topic: tuple[str, list[str], Path],
        tmp_path: Path) -> None:
    from ferry_spark.jobs import traces
    topic, ids, trace_dir = traced_topic
    want = 2 * TRACED   # a send and a receive span per message
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    while True:   # the %TRACE% exporter sends from its own thread: wait for all of them
        tracing().force_flush()
        from_topic = traces.spans_from_topic(spark, spark_mesh.namesrv)
        n = from_topic.where(from_topic.topic == topic).count() if from_topic else 0
        if n >= want or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert n == want
    out = tmp_path / "spans"
    assert traces.main(["--namesrv", spark_mesh.namesrv, "--trace-dir", str(trace_dir),
                        "--from-topic", "--out", str(out)]) == 0
    back = pd.read_parquet(out)
    mine = back[back["topic"].astype(str) == topic]
    assert len(mine) == want   # in the files and in %TRACE%, kept once
    assert sorted(mine["hop"].value_counts().items()) == [("receive", TRACED), ("send", TRACED)]
    assert set(mine["msg_id"]) == set(ids)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert (out / f"day={day}" / f"topic={topic}").is_dir()
    send = mine[mine["hop"] == "send"].iloc[0]
    assert send["kind"] == "PRODUCER" and send["duration_ms"] >= 0
    assert dict(send["attributes"])["messaging.system"] == "ferry"


def test_messages_job_writes_the_topic_by_store_day(
        spark: Any, spark_mesh: Mesh, traced_topic: tuple[str, list[str], Path],
        tmp_path: Path) -> None:
    from ferry_spark import SCHEMA
    from ferry_spark.jobs import messages
    topic, ids, _ = traced_topic
    out = tmp_path / "messages"
    assert messages.main(["--namesrv", spark_mesh.namesrv, topic, "--out", str(out)]) == 0
    back = pd.read_parquet(out)
    assert len(back) == TRACED and set(back["msg_id"]) == set(ids)
    assert set(SCHEMA.names) <= set(back.columns)
    assert sorted(bytes(b) for b in back["body"]) == sorted(f"m{i}".encode()
                                                            for i in range(TRACED))
    assert sorted(back["key"]) == sorted(f"k{i}" for i in range(TRACED))
    # a second run appends: a replay into the lake
    assert messages.export_topic(spark, spark_mesh.namesrv, topic, str(out), mode="append") \
        == TRACED
    assert len(pd.read_parquet(out)) == 2 * TRACED


def test_bad_job_arguments_are_refused_clearly(spark: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from ferry_spark.jobs import lag, messages, report, traces
    for job in (traces, messages, report):
        with pytest.raises(SystemExit) as exc:
            job.main(["--help"])
        assert exc.value.code == 0 and "--namesrv" in capsys.readouterr().out
    with pytest.raises(ValueError, match="key=value"):
        messages.parse_options(["startingOffsets"])
    with pytest.raises(ValueError, match="mode must be one of"):
        messages.export_topic(spark, "127.0.0.1:1", "t", "/nonexistent", mode="replace")
    assert lag.bucket_for(30) == 1 and lag.bucket_for(3600) == 30
    assert lag.bucket_for(10 ** 9) == lag.BUCKET_CHOICES_S[-1]


def test_a_report_with_nothing_traced_or_sent_is_empty_not_an_error(
        spark: Any, spark_mesh: Mesh, tmp_path: Path) -> None:
    from ferry_spark.jobs.report import run_report

    from tests.spark.conftest import new_topic
    topic = new_topic(spark_mesh, "empty")
    (tmp_path / "traces").mkdir()
    rep = run_report(spark, spark_mesh.namesrv, str(tmp_path / "traces"), tmp_path / "out",
                     topics=[topic], from_trace_topic=False)
    assert (rep.messages, rep.spans) == (0, 0)
    assert rep.e2e.empty and rep.hops.empty and rep.throughput.empty and rep.lag.empty
    page = rep.html_path.read_text()
    assert "<img" not in page and "nothing in this run" in page
