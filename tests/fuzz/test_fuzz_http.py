"""Fuzzing every HTTP API with auth on: generated hostile requests, no crash, bounded memory.

namesrv, the broker's API, the delay-scheduler, the txn-checker, dedup and the
console run as real processes with FERRY_AUTH=on (http_mesh.py). Each gets
requests made from its own OpenAPI document (`OpenApiFuzzer`: plausible and
hostile parameters and bodies, bodies over the limit, wrong methods) through
a pooled aiohttp client, each signed one way or another (http_auth.py: by an
identity with every right, so the requests reach the handlers, by one with
few, not at all, with a wrong secret, out of the window, forged, replayed;
the console's with a session cookie, a forged one or none), and raw garbage
on fresh connections (broken request lines, lines and header counts over
the limits, absurd lengths). No request of a refused kind may be served on a
guarded route, nor a replay of a served one. Meanwhile a valid client reads
each service's /readyz and, signed (the console: logged in), its /v1/stats,
and must be answered 200 all along. At the end every service lives,
answered no 500 and logged no traceback, its anonymous memory (sampled all
along) peaked less than RSS_GROWTH_MAX_BYTES over its start, and its
/v1/stats counted the refusals. FERRY_FUZZ_HTTP_REQUESTS and FERRY_FUZZ_SEED
change the run. `make test` runs DEFAULT_REQUESTS, which still reaches every
operation of every document, every auth kind and every family of garbage
(asserted); `make fuzz` runs FULL_REQUESTS (docs/security.md, Fuzzing).
"""
from __future__ import annotations

import asyncio
import os
import random
import time

import aiohttp
import pytest
from yarl import URL

from tests.auth.http_support import ADMIN, NOBODY, PUBLISHER
from tests.fuzz import http_mesh
from tests.fuzz.http_auth import COOKIE_KINDS, HTTP_AUTH_KINDS, HttpAuthMix
from tests.fuzz.http_gen import GARBAGE_KINDS, OpenApiFuzzer
from tests.fuzz.http_mesh import Target, console_login
from tests.fuzz.support import RssSampler

pytestmark = [pytest.mark.slow, pytest.mark.integration]

targets = http_mesh.targets  # the fixture

# The suite's size: about 1,700 per service, each operation of its document tens of times.
DEFAULT_REQUESTS = 10_000
FULL_REQUESTS = 100_000  # `make fuzz`: the issue 13 run, for memory growth over time
REQUESTS = int(os.environ.get("FERRY_FUZZ_HTTP_REQUESTS", str(DEFAULT_REQUESTS)))
SEED = int(os.environ.get("FERRY_FUZZ_SEED", "13"))
GARBAGE_SHARE = 0.1       # of each service's requests: raw garbage on a fresh connection
WORKERS = 6               # concurrent generated requests per service
GARBAGE_WORKERS = 2
RSS_GROWTH_MAX_BYTES = 64 << 20
REQUEST_TIMEOUT_S = 30.0
GARBAGE_WAIT_S = 5.0


def crash_lines(log: str) -> list[str]:
    """ERROR lines of a service log other than aiohttp refusing an unparsable request."""
    return [line for line in log.splitlines()
            if '"level": "ERROR"' in line or '"level": "CRITICAL"' in line
            if "aiohttp.http_exceptions." not in line]


async def generated(target: Target, fuzzer: OpenApiFuzzer, mix: HttpAuthMix, n: int,
                    session: aiohttp.ClientSession) -> None:
    for _ in range(n):
        method, path, headers, body = fuzzer.request()
        kind, req = mix.prepare(method, target.url + path, headers, body)
        try:
            # encoded=True: the path goes out exactly as it was signed.
            async with session.request(req.method, URL(req.url, encoded=True),
                                       headers=req.headers, data=req.body,
                                       allow_redirects=False) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError):
            # The server may close a connection it refused a request on (413, 400).
            status = 0
        target.statuses[status] += 1
        wrong = mix.check(kind, req, status)
        if wrong and len(target.wrong) < 20:
            target.wrong.append(wrong)


async def garbage(target: Target, fuzzer: OpenApiFuzzer, n: int) -> None:
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
        try:
            writer.write(fuzzer.garbage())
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GARBAGE_WAIT_S)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass  # closed without an answer: what a server may do with garbage
        except TimeoutError:
            target.unanswered += 1  # still waiting for more bytes: allowed, counted
        finally:
            writer.close()
        target.garbage += 1


async def valid_client(targets: list[Target], stop: asyncio.Event) -> None:
    """Every service's /readyz, and its /v1/stats signed (the console: logged in): all 200."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            for target in targets:
                async with session.get(target.url + "/readyz") as resp:
                    assert resp.status == 200, (target.name, resp.status, await resp.text())
                url = target.url + "/v1/stats"
                async with session.get(url, headers=target.valid_headers("GET", url)) as resp:
                    assert resp.status == 200, (target.name, resp.status, await resp.text())
                target.served += 1
            await asyncio.sleep(0.05)


def http_counts(target: Target) -> dict[str, int]:
    """The refusal counters of the service's HTTP limits (the broker's: `http_limits`)."""
    stats = target.get_json("/v1/stats")
    return dict(stats["http_limits" if target.name == "broker" else "limits"]["counts"])


def auth_mixes(target: Target, seed: int, n: int) -> list[HttpAuthMix]:
    """How each worker signs: as http_auth.py says; the console by cookies of ADMIN's login."""
    cookie = None
    if target.cookie is not None:
        cookie = console_login(target.url, ADMIN.access_key, ADMIN.secret_key)
    return [HttpAuthMix(random.Random(seed + i), wide=ADMIN, few=[PUBLISHER, NOBODY],
                        cookie=cookie, anyone=target.anyone) for i in range(n)]


async def fuzz_one(target: Target, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(target.url + "/openapi.json") as resp:
            doc = await resp.json()
    n_garbage = int(n * GARBAGE_SHARE)
    per_worker = -(-(n - n_garbage) // WORKERS)
    base = SEED * 100 + sum(map(ord, target.name))
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=WORKERS)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    makers = [OpenApiFuzzer(doc, base + i) for i in range(WORKERS)]
    mixes = await asyncio.to_thread(auth_mixes, target, base + 30, WORKERS)
    breakers = [OpenApiFuzzer(doc, base + 50 + i) for i in range(GARBAGE_WORKERS)]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(
            *(generated(target, f, m, per_worker, session) for f, m in zip(makers, mixes,
                                                                            strict=True)),
            *(garbage(target, f, n_garbage // GARBAGE_WORKERS) for f in breakers))
    target.elapsed_s = time.monotonic() - started
    target.ops_missed = {(m, p) for m, p, _, _ in makers[0].ops}
    for f in makers:
        target.ops_missed -= f.op_counts.keys()
    for f in breakers:
        target.garbage_kinds |= f.garbage_counts.keys()
    for m in mixes:
        target.auth_kinds.update(m.counts)


async def test_hostile_requests(targets: list[Target]) -> None:
    per_service = -(-REQUESTS // len(targets))
    stop = asyncio.Event()
    started = time.monotonic()
    async with RssSampler({t.name: t.proc.popen.pid for t in targets}) as rss:
        valid = asyncio.create_task(valid_client(targets, stop))
        await asyncio.gather(*(fuzz_one(t, per_service) for t in targets))
        stop.set()
        await valid
    elapsed = time.monotonic() - started
    total = sum(sum(t.statuses.values()) + t.garbage for t in targets)
    print(f"\nHTTP fuzz (seed {SEED}, auth on): {total} requests in {elapsed:.1f}s")
    failures = []
    for t in targets:
        counts = await asyncio.to_thread(http_counts, t)
        print(f"  {t.name} ({t.elapsed_s:.1f}s): {sum(t.statuses.values())} generated "
              f"{dict(sorted(t.statuses.items()))}, auth {dict(sorted(t.auth_kinds.items()))}, "
              f"{t.garbage} garbage ({t.unanswered} unanswered), {t.served} valid "
              f"/readyz + /v1/stats served; {rss.report(t.name)}; limits {counts}")
        crashes = crash_lines(t.proc.log())
        if not t.proc.alive() or t.statuses[500] or crashes:
            failures.append(f"{t.name}: alive={t.proc.alive()} 500s={t.statuses[500]}\n"
                            + "\n".join(crashes[:5]))
        if rss.growth(t.name) >= RSS_GROWTH_MAX_BYTES:
            failures.append(f"{t.name}: RssAnon grew {rss.growth(t.name) >> 20} MiB")
        if not counts["bad_requests"]:
            failures.append(f"{t.name}: refusals not counted: {counts}")
        failures.extend(f"{t.name}: {w}" for w in t.wrong)
        # However small the run, it reached every operation, auth kind and family of garbage.
        kinds = COOKIE_KINDS if t.cookie is not None else HTTP_AUTH_KINDS
        if t.ops_missed or len(t.garbage_kinds) < GARBAGE_KINDS or \
                set(kinds) - t.auth_kinds.keys():
            failures.append(f"{t.name}: never generated {sorted(t.ops_missed)}, garbage "
                            f"kinds {sorted(set(range(GARBAGE_KINDS)) - t.garbage_kinds)}, "
                            f"auth kinds {set(kinds) - t.auth_kinds.keys()}")
    assert not failures, "\n".join(failures)
    too_large = [(await asyncio.to_thread(http_counts, t))["bodies_too_large"] for t in targets]
    assert sum(too_large)
    assert total >= REQUESTS
    assert all(t.served for t in targets)
