"""The console against what it must not trust, without a browser: a POST another site's
page makes (refused, 403), and junk bodies in `%TRACE%` (skipped, the page still loads)."""
from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request

import pytest
from ferry import Producer
from ferry.client.admin.trace_query import spans_of_message
from ferry.wire import RequestCode, encode_messages

from tests.broker.wire_client import WireClient, message
from tests.console.conftest import ConsoleMesh

pytestmark = pytest.mark.integration

TIMEOUT_S = 30


def post(url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, str]:
    """POST a form without following the redirect; (status, body)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None
    req = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_post_from_another_site_is_refused(console_mesh: ConsoleMesh) -> None:
    url = console_mesh.url + "/console/groups/payments/dlq/resend"
    own = console_mesh.url   # http://127.0.0.1:<port>, the Host the request carries
    for headers in ({"Origin": "http://evil.example"},
                    {"Origin": "http://127.0.0.1:1"},        # another port: another origin
                    {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"}):
        status, html = post(url, {"all": "1"}, headers)
        assert status == 403, headers
        assert 'id="error-message"' in html and "Refused" in html
    # From the console's own page (or with no browser header at all) the form works:
    # an empty selection is the form's own 400, an empty DLQ resends nothing (303).
    for headers in ({"Origin": own}, {"Origin": own.upper()}, {"Sec-Fetch-Site": "same-origin"},
                    {"Sec-Fetch-Site": "none"}, {}):
        status, html = post(url, {}, headers)
        assert status == 400 and "choose the messages" in html, (headers, status)
    status, _ = post(url, {"all": "1"}, {"Origin": own})
    assert status == 303


async def _store_junk_spans(console_mesh: ConsoleMesh, msg_id: str) -> None:
    """Junk in %TRACE% keyed by `msg_id`, written as the exporter writes spans."""
    broker = console_mesh.mesh.brokers["broker-a"]
    junk = [b"[1, 2]", b'"a string"', b"{}", b"not json \xff", b'{"trace_id": 7}',
            b'{"trace_id": "junk", "span_id": "s1", "start_ns": "soon", "end_ns": 1}',
            b'{"trace_id": "junk", "span_id": "s2", "start_ns": true, "end_ns": 2}',
            b'{"trace_id": "junk", "span_id": "s3", "start_ns": 1, "end_ns": 2, '
            b'"attributes": [1], "status": {"x": 1}}']
    client = await WireClient.connect("127.0.0.1", broker.port)
    try:
        resp = await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                    "trace_export": True},
                                 encode_messages([message(b, keys=f"{msg_id} t:junk")
                                                  for b in junk]))
        assert resp.fields["count"] == len(junk)
    finally:
        await client.close()


def test_junk_in_the_trace_topic_is_skipped(console_mesh: ConsoleMesh) -> None:
    async def scenario() -> tuple[str, list[dict[str, object]]]:
        async with Producer(namesrv=console_mesh.mesh.namesrv) as producer:
            sent = await producer.send_and_wait("junk-traced", b'{"n": 1}', trace=False)
        await _store_junk_spans(console_mesh, sent.msg_id)
        return sent.msg_id, await spans_of_message(console_mesh.mesh.namesrv, sent.msg_id)

    msg_id, spans = asyncio.run(scenario())
    assert [(s["trace_id"], s["span_id"]) for s in spans] == [("junk", "s3")]
    status, html = get(f"{console_mesh.url}/console/messages/{msg_id}")
    assert status == 200, html
    assert msg_id in html
