"""Two namesrv instances with FERRY_AUTH=on over one etcd prefix, real processes: an HTTP
request signed for one is refused by the other, so a captured write cannot be played
again at a sibling instance (whose replay guard never saw it)."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from uuid import uuid4

import pytest
from ferry.auth.http import HEADER_TARGET, signed_url_headers

from tests.auth.http_support import ADMIN, auth_env, seed
from tests.support.procs import Etcd, Proc, start_namesrv

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_namesrvs(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    prefix = f"/auth-targets-{uuid4().hex[:8]}/"
    seed(etcd.endpoint, prefix)
    procs: list[Proc] = []
    urls = []
    try:
        for name in ("ns-1", "ns-2"):
            proc, port = start_namesrv(etcd.endpoint, prefix, tmp_path_factory.mktemp(name),
                                       auth_env(etcd.endpoint, prefix))
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for proc in procs:
            proc.stop()


def _send(url: str, method: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, str]:
    request = urllib.request.Request(url, data=body or None, method=method,
                                     headers={**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:   # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_each_instance_announces_its_own_target(two_namesrvs: list[str]) -> None:
    targets = set()
    for base in two_namesrvs:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:   # noqa: S310
            targets.add(resp.headers[HEADER_TARGET])
    port = two_namesrvs[0].rsplit(":", 1)[1]
    assert f"namesrv/{socket.gethostname()}:{port}" in targets and len(targets) == 2


def test_a_write_signed_for_one_namesrv_is_refused_by_the_other(
        two_namesrvs: list[str]) -> None:
    ns1, ns2 = two_namesrvs
    topic = f"t-{uuid4().hex[:8]}"
    body = json.dumps({"name": topic, "queues": 2}).encode()
    status, text = _send(ns1 + "/v1/topics", "POST",
                         signed_url_headers(ADMIN, "POST", ns1 + "/v1/topics", body), body)
    assert status == 201, text
    # The operator deletes the topic at ns-1; someone on the network keeps the request.
    url = f"{ns1}/v1/topics/{topic}"
    captured = signed_url_headers(ADMIN, "DELETE", url)
    status, text = _send(url, "DELETE", captured)
    assert status == 200, text
    status, text = _send(ns1 + "/v1/topics", "POST",
                         signed_url_headers(ADMIN, "POST", ns1 + "/v1/topics", body), body)
    assert status == 201, text   # created again
    # Played again at ns-2 (same path, same etcd): refused, and the topic stays.
    status, text = _send(f"{ns2}/v1/topics/{topic}", "DELETE", captured)
    assert status == 401 and "bad signature" in json.loads(text)["error"]["message"], text
    status, text = _send(url, "DELETE", captured)   # and at ns-1 it is a replay
    assert status == 401 and "replayed" in json.loads(text)["error"]["message"], text
    status, text = _send(f"{ns2}/v1/topics/{topic}", "GET",
                         signed_url_headers(ADMIN, "GET", f"{ns2}/v1/topics/{topic}"))
    assert status == 200, text
