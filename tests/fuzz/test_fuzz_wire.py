"""Fuzzing the broker's wire port: generated hostile frames, no crash, bounded memory.

Most frames are pipelined on a few long connections (the broker must answer
each and keep the connection); about one in a hundred connections ends with a
frame that must close it (oversized, malformed header, wrong version, ...) or is
cut short. Meanwhile a well-behaved client sends and pulls, and must be served
all along. At the end: the broker process lives, its log holds no crashed
request, its anonymous memory (sampled all along) peaked less than
RSS_GROWTH_MAX_BYTES over its start, and /v1/stats counted the closed
connections. The counts are printed (`pytest -s` shows them).

The main run is against a broker with FERRY_AUTH=on (tests/fuzz/conftest.py):
every answered frame is signed one way or another (auth_frames.py: valid
signatures of a few-rights and an all-rights identity, none, forged, wrong
secret, stale, future, replayed), and each answer is checked: a bad signature
is refused with AuthenticationError, a replay of a served request is refused,
the few-rights identity is served nothing its rules do not allow. The valid
client signs. A smaller run goes against a broker with auth off. The
replication port has its own fuzz (test_fuzz_repl.py).

FERRY_FUZZ_FRAMES and FERRY_FUZZ_SEED change the run; a failure names its
seed. `make test` runs DEFAULT_FRAMES, which still generates every frame kind,
every auth kind and every request code, validly signed too (asserted); `make
fuzz` runs the full FULL_FRAMES (docs/security.md, Fuzzing).
"""
from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ferry.auth.credentials import Credentials
from ferry.client.core.connection import BrokerConnection
from ferry.store import iter_records
from ferry.wire import FrameDecoder, RequestCode, encode_messages

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import message
from tests.fuzz.auth_frames import AUTH_KINDS, AuthMix, check_answer
from tests.fuzz.conftest import (
    FEW,
    FEW_RULES,
    STATS,
    VALID,
    VALID_GROUP,
    VALID_TOPIC,
    WIDE,
    signed_stats,
)
from tests.fuzz.frames import CLOSING_KINDS, CODES, PIPELINED_KINDS, FrameFuzzer
from tests.fuzz.support import RssSampler

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# The suite's size: each of the 5 pipelined kinds, 13 closing kinds (1,000 closing
# connections), 8 auth kinds and every request code thousands of times, in seconds.
DEFAULT_FRAMES = 100_000
FULL_FRAMES = 1_000_000  # `make fuzz`: the issue 13 and 24 run, for memory growth over time
FRAMES = int(os.environ.get("FERRY_FUZZ_FRAMES", str(DEFAULT_FRAMES)))
AUTH_OFF_FRAMES = FRAMES // 5  # the same generator against a broker with auth off
SEED = int(os.environ.get("FERRY_FUZZ_SEED", "13"))
PIPELINES = 4           # long connections carrying most frames
BATCH = 2000            # frames written at once on a pipeline
WINDOW = 2 * BATCH      # answers a pipeline may wait for before writing more
CLOSING_EVERY = 100     # one closing connection per this many pipelined frames
FRAMES_BEFORE_CLOSE = 5  # valid-shaped frames a closing connection sends first
CLOSING_PARALLEL = 8
RSS_GROWTH_MAX_BYTES = 96 << 20
ANSWER_TIMEOUT_S = 60.0
AuthFactory = Callable[[random.Random], AuthMix]


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    # WARNING: each refused request is an INFO line, a million of them would be the run.
    b = start_broker(tmp_path_factory.mktemp("fuzz-broker"), None,
                     FERRY_BROKER_LOG_LEVEL="WARNING", FERRY_BROKER_MAX_PULL_WAIT_MS="500")
    yield b
    b.proc.stop()
    print(b.proc.log()[-3000:])


class Tally:
    """What the run sent and got back, and any answer that broke a rule of auth."""

    def __init__(self) -> None:
        self.frames = 0
        self.answers = 0
        self.closing = 0
        self.valid_ops = 0
        self.wrong: list[str] = []


async def pipeline(port: int, fuzzer: FrameFuzzer, frames: int, tally: Tally) -> None:
    """Write `frames` hostile frames in batches; every request must be answered."""
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
                if fuzzer.auth is not None:
                    wrong = check_answer(fuzzer.auth, frame.request_id, frame.error)
                    if wrong and len(tally.wrong) < 20:
                        tally.wrong.append(wrong)
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
        if fuzzer.auth is not None:
            fuzzer.auth.sent.clear()  # their answers are not read
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


async def valid_client(broker: Broker, stop: asyncio.Event, tally: Tally,
                       credentials: Credentials | None) -> None:
    """Send and read back one message at a time while the fuzz runs; each must succeed."""
    conn = await BrokerConnection.open(f"127.0.0.1:{broker.port}", credentials=credentials)
    try:
        offset = 0
        while not stop.is_set():
            body = encode_messages([message(b"served %d" % offset)])
            ack = await conn.request(RequestCode.SEND, {"topic": VALID_TOPIC, "queue_id": 0},
                                     body)
            assert ack.fields["count"] == 1
            got = await conn.request(RequestCode.PULL, {
                "group": VALID_GROUP, "topic": VALID_TOPIC, "queue_id": 0, "offset": offset,
                "max_count": 1, "max_wait_ms": 0})
            records = list(iter_records(got.body))
            assert records and records[0].body == b"served %d" % offset, got.fields
            offset += 1
            tally.valid_ops += 1
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


def _merge(fuzzers: list[FrameFuzzer]) -> tuple[dict[str, int], set[int], Counter[str], set[int]]:
    """(frame kinds, codes, auth kinds, validly signed codes) over every fuzzer."""
    kinds: Counter[str] = Counter()
    codes: set[int] = set()
    auth: Counter[str] = Counter()
    signed: set[int] = set()
    for f in fuzzers:
        kinds.update(f.counts)
        codes |= f.code_counts.keys()
        if f.auth is not None:
            auth.update(f.auth.counts)
            signed |= f.auth.signed_codes
    return dict(kinds), codes, auth, signed


async def fuzz(broker: Broker, frames: int, *, credentials: Credentials | None = None,
               auth: AuthFactory | None = None, stats_as: Credentials | None = None
               ) -> tuple[Tally, dict[str, int], Counter[str], dict[str, Any]]:
    """Run the fuzz against `broker`; (what was sent and answered, kinds, auth kinds, stats)."""
    tally, stop = Tally(), asyncio.Event()
    fuzzers = [FrameFuzzer(SEED * 1000 + i, auth=auth)
               for i in range(PIPELINES + CLOSING_PARALLEL)]
    closers = frames // CLOSING_EVERY // CLOSING_PARALLEL
    # Warm up first: the broker's baseline includes its caches and first store segment.
    await pipeline(broker.port, FrameFuzzer(SEED - 1, auth=auth), 20_000, Tally())
    started = time.monotonic()
    async with RssSampler({"broker": broker.proc.popen.pid}) as rss:
        valid = asyncio.create_task(valid_client(broker, stop, tally, credentials))
        await asyncio.gather(
            *(pipeline(broker.port, fuzzers[i], frames // PIPELINES, tally)
              for i in range(PIPELINES)),
            *(closing(broker.port, fuzzers[PIPELINES + i], closers, tally)
              for i in range(CLOSING_PARALLEL)))
        stop.set()
        await valid
    elapsed = time.monotonic() - started
    kinds, codes, auth_kinds, signed_codes = _merge(fuzzers)
    stats = await asyncio.to_thread(signed_stats, broker, stats_as)
    print(f"\nwire fuzz (seed {SEED}, auth {'on' if auth else 'off'}): {tally.frames} frames "
          f"in {elapsed:.1f}s, {tally.answers} answers, {tally.closing} connections closed by "
          f"bad frames, {tally.valid_ops} valid send+pull served")
    for name in rss.pids:
        print(f"  {name}: {rss.report(name)}")
    print(f"kinds: {dict(sorted(kinds.items()))}")
    if auth:
        print(f"auth kinds: {dict(sorted(auth_kinds.items()))}")
    print(f"broker limits counts: {stats['limits']['counts']}; auth: {stats.get('auth')}")
    assert tally.frames >= frames
    assert broker.proc.alive()
    log = broker.proc.log()
    assert "request crashed" not in log and "Traceback" not in log, log[-5000:]
    for name in rss.pids:
        assert rss.growth(name) < RSS_GROWTH_MAX_BYTES, (name, rss.report(name))
    truncated = kinds.get("closing_truncated", 0)
    assert stats["limits"]["counts"]["frames_malformed"] >= tally.closing - truncated
    assert tally.valid_ops > 0
    assert not tally.wrong, "\n".join(tally.wrong)
    # However small the run, it threw every kind of frame and every request code.
    wanted = {*PIPELINED_KINDS, *("closing_" + k for k in CLOSING_KINDS)}
    assert wanted <= kinds.keys(), f"kinds never generated: {wanted - kinds.keys()}"
    assert set(CODES) <= codes, f"request codes never generated: {set(CODES) - codes}"
    if auth:
        assert set(AUTH_KINDS) <= auth_kinds.keys(), f"auth kinds: {auth_kinds}"
        assert auth_kinds["replays_checked"], "no replay of a served request was checked"
        assert set(CODES) <= signed_codes, f"never validly signed: {set(CODES) - signed_codes}"
    return tally, kinds, auth_kinds, stats


async def test_hostile_frames(fuzz_broker: Broker) -> None:
    await fuzz(fuzz_broker, AUTH_OFF_FRAMES)


async def test_hostile_frames_with_auth_on(auth_broker: Broker) -> None:
    """Signed, unsigned, forged and replayed frames, each answered as it should be; the signing
    client goes on."""
    conn = await BrokerConnection.open(f"127.0.0.1:{auth_broker.port}", credentials=VALID)
    target = str(getattr(conn, "target", ""))   # what a client signs for (issue 24)
    await conn.close()
    mix = functools.partial(AuthMix, few=FEW, few_rules=FEW_RULES, wide=WIDE, target=target)
    _, _, auth_kinds, stats = await fuzz(auth_broker, FRAMES, credentials=VALID, auth=mix,
                                         stats_as=STATS)
    assert stats["auth"]["refused_unauthenticated"] >= auth_kinds["refusals_due"]
    assert stats["auth"]["refused_denied"] > 0
