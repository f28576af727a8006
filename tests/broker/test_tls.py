"""Optional TLS on the wire: a broker with FERRY_TLS_CERT/KEY speaks only TLS; clients that
trust its certificate (FERRY_TLS_CA) are served, plain or untrusting ones are not."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.auth.tls import client_context
from ferry.client.core.connection import BrokerConnection, ConnectionPool
from ferry.errors import ConnectionLostError, RequestTimeoutError
from ferry.wire import RequestCode

from tests.broker.auth_support import ADMIN_RULES, creds, seed
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 made with the openssl CLI: (cert, key)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("certs")
    cert, key = self_signed(d, "broker")
    other, _ = self_signed(d, "stranger")
    return {"cert": cert, "key": key, "other": other}


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd,
               certs: dict[str, Path]) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, {"root": ADMIN_RULES})
    b = start_broker(tmp_path_factory.mktemp("tls-broker"), etcd, prefix=prefix,
                     FERRY_AUTH="on", FERRY_TLS_CERT=str(certs["cert"]),
                     FERRY_TLS_KEY=str(certs["key"]))
    yield b
    b.proc.stop()
    print(b.proc.log()[-3000:])


async def test_a_trusting_client_is_served_over_tls(tls_broker: Broker,
                                                    certs: dict[str, Path]) -> None:
    tls = client_context(str(certs["cert"]))
    conn = await BrokerConnection.open(f"127.0.0.1:{tls_broker.port}", credentials=creds("root"),
                                       tls=tls)
    try:
        resp = await conn.request(RequestCode.GET_MIN_MAX, {"topic": "tls-t", "queue_id": 0})
        assert "max_offset" in resp.fields
    finally:
        await conn.close()


async def test_plain_and_untrusting_clients_are_not(tls_broker: Broker,
                                                    certs: dict[str, Path]) -> None:
    addr = f"127.0.0.1:{tls_broker.port}"
    with pytest.raises(ConnectionLostError, match="cannot connect"):
        await BrokerConnection.open(addr, credentials=creds("root"),
                                    tls=client_context(str(certs["other"])))
    # A plain client's connection fails at its first request: the IDENTIFY that learns
    # what to sign for, right after connecting.
    with pytest.raises((ConnectionLostError, RequestTimeoutError)):
        await BrokerConnection.open(addr, credentials=creds("root"), connect_timeout_ms=2000)
    plain = await BrokerConnection.open(addr, request_timeout_ms=2000)   # unsigned: no IDENTIFY
    try:
        with pytest.raises((ConnectionLostError, RequestTimeoutError)):
            await plain.request(RequestCode.GET_MIN_MAX, {"topic": "tls-t", "queue_id": 0})
    finally:
        await plain.close()


def test_pools_take_the_ca_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                certs: dict[str, Path]) -> None:
    monkeypatch.delenv("FERRY_TLS_CA", raising=False)
    assert ConnectionPool().tls is None
    monkeypatch.setenv("FERRY_TLS_CA", str(certs["cert"]))
    assert ConnectionPool().tls is not None
    assert ConnectionPool(tls=None).tls is None
