"""Fuzzing the broker's wire port: a million generated frames, no crash, bounded memory.

Most frames are pipelined on a few long connections (the broker must answer
each and keep the connection); about one in a hundred connections ends with a
frame that must close it (oversized, malformed header, wrong version, ...) or is
cut short. Meanwhile a well-behaved client sends and pulls, and must be served
all along. At the end: the broker process lives, its log holds no crashed
request, its anonymous memory grew by less than RSS_GROWTH_MAX_BYTES, and
/v1/stats counted the closed connections. The counts are printed
(`pytest -s` shows them). FERRY_FUZZ_FRAMES and FERRY_FUZZ_SEED change the
run; a failure names its seed.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from ferry.wire import FrameDecoder

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import message
from tests.fuzz.frames import FrameFuzzer
from tests.fuzz.support import rss_anon_bytes

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FRAMES = int(os.environ.get("FERRY_FUZZ_FRAMES", "1000000"))
SEED = int(os.environ.get("FERRY_FUZZ_SEED", "13"))
PIPELINES = 4           # long connections carrying most frames
BATCH = 2000            # frames written at once on a pipeline
WINDOW = 2 * BATCH      # answers a pipeline may wait for before writing more
CLOSING_EVERY = 100     # one closing connection per this many pipelined frames
FRAMES_BEFORE_CLOSE = 5  # valid-shaped frames a closing connection sends first
CLOSING_PARALLEL = 8
RSS_GROWTH_MAX_BYTES = 96 << 20
ANSWER_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    # WARNING: each refused request is an INFO line, a million of them would be the run.
    b = start_broker(tmp_path_factory.mktemp("fuzz-broker"), None,
                     FERRY_BROKER_LOG_LEVEL="WARNING", FERRY_BROKER_MAX_PULL_WAIT_MS="500")
    yield b
    b.proc.stop()
    print(b.proc.log()[-3000:])


class Tally:
    """What the run sent and got back."""

    def __init__(self) -> None:
        self.frames = 0
        self.answers = 0
        self.closing = 0
        self.valid_ops = 0


async def pipeline(port: int, fuzzer: FrameFuzzer, frames: int, tally: Tally) -> None:
    """Write `frames` hostile frames in batches; every request must be answered in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    expected, got = 0, 0
    progress = asyncio.Event()

    async def read() -> None:
        nonlocal got
        decoder = FrameDecoder()
        while data := await reader.read(1 << 18):
            for frame in decoder.feed(data):
                assert frame.flags & 1, "the broker sent a request, not a response"
                got += 1
            progress.set()

    reading = asyncio.create_task(read())
    sent = 0
    try:
        while sent < frames:
            n = min(BATCH, frames - sent)
            data, answered = fuzzer.pipelined(n)
            writer.write(data)
            await writer.drain()
            sent += n
            expected += answered
            tally.frames += n
            while expected - got > WINDOW:
                await _next(progress, reading, f"answers stopped at {got} of {expected}")
        while got < expected:
            await _next(progress, reading, f"answers stopped at {got} of {expected}")
        tally.answers += got
    finally:
        writer.close()
        reading.cancel()


async def _next(progress: asyncio.Event, reading: asyncio.Task[None], what: str) -> None:
    progress.clear()
    done, _ = await asyncio.wait([asyncio.ensure_future(progress.wait()), reading],
                                 timeout=ANSWER_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if reading in done:
        reading.result()
        raise AssertionError(f"the broker closed a pipelined connection: {what}")
    if not done:
        raise AssertionError(f"no answer for {ANSWER_TIMEOUT_S}s: {what}")


async def closing(port: int, fuzzer: FrameFuzzer, count: int, tally: Tally) -> None:
    """`count` connections, each a few frames then one that ends it; the broker must close."""
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        first, _ = fuzzer.pipelined(FRAMES_BEFORE_CLOSE)
        kind, bad = fuzzer.closing()
        writer.write(first + bad)
        if kind == "truncated":
            writer.write_eof()
        try:
            while await asyncio.wait_for(reader.read(1 << 16), 10):
                pass
        except ConnectionResetError:
            pass
        writer.close()
        tally.frames += FRAMES_BEFORE_CLOSE + 1
        tally.closing += 1


async def valid_client(broker: Broker, stop: asyncio.Event, tally: Tally) -> None:
    """Send and read back one message at a time while the fuzz runs; each must succeed."""
    client = await broker.client()
    try:
        offset = 0
        while not stop.is_set():
            ack = await client.send("fuzz-valid", 0, [message(b"served %d" % offset)])
            assert ack["count"] == 1
            fields, msgs = await client.pull("fuzz-valid", 0, offset, group="fuzz-valid-g")
            assert fields["status"] == "FOUND" and msgs[0].body == b"served %d" % offset, fields
            offset += 1
            tally.valid_ops += 1
            await asyncio.sleep(0.02)
    finally:
        await client.close()


async def test_a_million_hostile_frames(fuzz_broker: Broker) -> None:
    broker = fuzz_broker
    pid = broker.proc.popen.pid
    tally, stop = Tally(), asyncio.Event()
    per_pipe = FRAMES // PIPELINES
    fuzzers = [FrameFuzzer(SEED * 1000 + i) for i in range(PIPELINES + CLOSING_PARALLEL)]
    closers = FRAMES // CLOSING_EVERY // CLOSING_PARALLEL
    # Warm up first: the broker's baseline includes its caches and first store segment.
    await pipeline(broker.port, FrameFuzzer(SEED - 1), 20_000, tally)
    rss_before = rss_anon_bytes(pid)
    started = time.monotonic()
    valid = asyncio.create_task(valid_client(broker, stop, tally))
    await asyncio.gather(
        *(pipeline(broker.port, fuzzers[i], per_pipe, tally) for i in range(PIPELINES)),
        *(closing(broker.port, fuzzers[PIPELINES + i], closers, tally)
          for i in range(CLOSING_PARALLEL)))
    stop.set()
    await valid
    elapsed = time.monotonic() - started
    rss_after = rss_anon_bytes(pid)
    kinds: dict[str, int] = {}
    for f in fuzzers:
        for kind, n in f.counts.items():
            kinds[kind] = kinds.get(kind, 0) + n
    limits = broker.get_json("/v1/stats")["limits"]
    print(f"\nwire fuzz (seed {SEED}): {tally.frames} frames in {elapsed:.1f}s, "
          f"{tally.answers} answers, {tally.closing} connections closed by bad frames, "
          f"{tally.valid_ops} valid send+pull served; broker RssAnon "
          f"{rss_before >> 20} -> {rss_after >> 20} MiB")
    print(f"kinds: {dict(sorted(kinds.items()))}")
    print(f"broker limits counts: {limits['counts']}")
    assert tally.frames >= FRAMES
    assert broker.proc.alive()
    log = broker.proc.log()
    assert "request crashed" not in log and "Traceback" not in log, log[-5000:]
    assert rss_after - rss_before < RSS_GROWTH_MAX_BYTES
    truncated = kinds.get("closing_truncated", 0)
    assert limits["counts"]["frames_malformed"] >= tally.closing - truncated
    assert tally.valid_ops > 0
