"""Optional TLS on the HTTP APIs: namesrv with FERRY_TLS_CERT/KEY serves HTTPS only; clients
with FERRY_TLS_CA reach it (signed, as with plain HTTP), clients without it do not."""
from __future__ import annotations

import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from ferry.auth.tls import client_context
from ferry.client.core.namesrv import NamesrvClient, parse_namesrv
from ferry.errors import ConnectionLostError

from tests.auth.http_support import ADMIN, auth_env, seed
from tests.broker.test_tls import self_signed
from tests.support.procs import Etcd, Proc, free_port, spawn

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_namesrv(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[int, Path]]:
    """namesrv with auth and TLS on: (port, CA file = its self-signed certificate)."""
    work = tmp_path_factory.mktemp("ns-tls")
    cert, key = self_signed(work, "namesrv")
    prefix = f"/tls-{uuid4().hex[:8]}/"
    seed(etcd.endpoint, prefix)
    port = free_port()
    proc: Proc = spawn("namesrv", [sys.executable, "-m", "ferry_namesrv", "--port", str(port),
                                   "--etcd", etcd.endpoint, "--etcd-prefix", prefix], work,
                       {**auth_env(etcd.endpoint, prefix), "FERRY_TLS_CERT": str(cert),
                        "FERRY_TLS_KEY": str(key)})
    trusted = client_context(str(cert))
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=1,
                                        context=trusted):
                break
        except (OSError, ValueError):
            assert time.monotonic() < deadline and proc.alive(), proc.log()[-2000:]
            time.sleep(0.1)
    try:
        yield port, cert
    finally:
        proc.stop()


async def test_https_with_the_ca_and_signed(tls_namesrv: tuple[int, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    port, cert = tls_namesrv
    monkeypatch.setenv("FERRY_TLS_CA", str(cert))
    assert parse_namesrv(f"127.0.0.1:{port}") == [f"https://127.0.0.1:{port}"]
    client = NamesrvClient(f"127.0.0.1:{port}", credentials=ADMIN)
    try:
        who = await client.call("GET", "/v1/whoami")
        assert who == {"access_key": ADMIN.access_key, "auth": True}
    finally:
        await client.close()


def test_plain_http_and_untrusting_clients_are_refused(tls_namesrv: tuple[int, Path]) -> None:
    port, _ = tls_namesrv
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)  # noqa: S310
    with pytest.raises(urllib.error.URLError) as caught:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=5,  # noqa: S310
                               context=ssl.create_default_context())
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


async def test_a_client_without_the_ca_gets_a_clear_error(tls_namesrv: tuple[int, Path]) -> None:
    port, _ = tls_namesrv
    client = NamesrvClient(f"https://127.0.0.1:{port}", credentials=ADMIN)
    try:
        with pytest.raises(ConnectionLostError, match="unreachable"):
            await client.call("GET", "/v1/whoami")
    finally:
        await client.close()
