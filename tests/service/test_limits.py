"""ferry.service.limits on a real aiohttp server in this process: each limit refuses and counts."""
from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from ferry.service.limits import HttpGuard, HttpLimits, LimitedSite


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpGuard, LimitedSite]]:
    guard = HttpGuard(HttpLimits(max_body_bytes=1024, max_headers=8, max_field_bytes=512,
                                 max_connections=4, max_connections_per_addr=2))

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"got": len(await request.read())})

    app = guard.application()
    app.router.add_post("/echo", echo)
    runner = guard.runner(app, access_log=None)
    await runner.setup()
    site = await guard.start_site(runner, "127.0.0.1", 0)
    yield guard, site
    await runner.cleanup()


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


async def test_body_over_the_limit_is_413_and_counted(
        served: tuple[HttpGuard, LimitedSite]) -> None:
    guard, site = served
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{site.port}/echo", data=b"x" * 100) as resp:
            assert resp.status == 200 and (await resp.json())["got"] == 100
        async with http.post(f"http://127.0.0.1:{site.port}/echo", data=b"x" * 5000) as resp:
            assert resp.status == 413
    assert guard.counts["bodies_too_large"] == 1


async def test_header_limits_are_400_and_counted(served: tuple[HttpGuard, LimitedSite]) -> None:
    guard, site = served
    many = "".join(f"X-{i}: {i}\r\n" for i in range(20))
    answer = await raw(site.port, f"GET /echo HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode())
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
    long = "GET /echo HTTP/1.1\r\nHost: x\r\nX-Long: " + "y" * 2000 + "\r\n\r\n"
    assert b" 400 " in (await raw(site.port, long.encode())).split(b"\r\n")[0]
    assert b" 400 " in (await raw(site.port, b"\x16\x03\x01 garbage\r\n\r\n")).split(b"\r\n")[0]
    assert guard.counts["bad_requests"] == 3


async def test_connections_per_address_are_capped(
        served: tuple[HttpGuard, LimitedSite]) -> None:
    guard, site = served
    held = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(2)]
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed without a word
    writer.close()
    assert guard.counts["connections_over_per_addr"] == 1
    assert guard.as_json()["connections"] == 2
    for _, w in held:
        w.close()
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as http:  # room again
        async with http.post(f"http://127.0.0.1:{site.port}/echo", data=b"ok") as resp:
            assert resp.status == 200


def test_settings_from_the_environment() -> None:
    env = {"FERRY_X_HTTP_MAX_CONNECTIONS": "10", "FERRY_X_HTTP_KEEPALIVE_TIMEOUT_S": "5"}
    limits = HttpLimits.from_env("FERRY_X_", max_body_bytes=4096, env=env)
    assert (limits.max_connections, limits.keepalive_timeout_s, limits.max_body_bytes) \
        == (10, 5.0, 4096)
    env["FERRY_X_HTTP_MAX_BODY_BYTES"] = "100"
    assert HttpLimits.from_env("FERRY_X_", max_body_bytes=4096, env=env).max_body_bytes == 100
    with pytest.raises(ValueError):
        HttpLimits(max_headers=0)


async def test_the_limited_site_serves_tls(tmp_path: Path) -> None:
    """A service's HTTPS (FERRY_TLS_CERT/KEY) goes through the same guarded site."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    guard = HttpGuard(HttpLimits(max_connections_per_addr=2))

    async def hello(_: web.Request) -> web.Response:
        return web.json_response({"hello": "tls"})

    app = guard.application()
    app.router.add_get("/hello", hello)
    runner = guard.runner(app, access_log=None)
    await runner.setup()
    site = await guard.start_site(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{site.port}/hello", ssl=client_ctx) as resp:
                assert resp.status == 200 and (await resp.json()) == {"hello": "tls"}
        assert guard.as_json()["counts"]["connections_over_total"] == 0
    finally:
        await runner.cleanup()
