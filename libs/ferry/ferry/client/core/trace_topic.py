"""The Ferry span exporter: each span is one message of the internal `%TRACE%` topic.

A span's message has the span JSON (`span_json`) as its body and as keys the
message id(s) it concerns (`messaging.message.id`, plus the ids a batch span
links to, at most MAX_MESSAGE_KEYS) and `t:<trace id>`, so the brokers' key
index answers "the spans of message M" and then "every span of its trace"
(`trace_query.spans_of_message`).

It writes with a SEND to `%TRACE%` carrying `trace_export: true`, the one
SEND to an internal topic a broker accepts (docs/protocol.md). The exporter
runs behind a BatchSpanProcessor, in that processor's thread, with blocking
sockets (never on the traced code's event loop), and its messages are never
traced. It never fails the traced code: a batch that
cannot be stored within SEND_TIMEOUT_S is dropped and counted (`dropped`).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ferry.auth.credentials import Credentials
from ferry.auth.http import signed_url_headers
from ferry.auth.signing import sign_wire
from ferry.auth.tls import client_context_from_env
from ferry.client.core.namesrv import parse_namesrv
from ferry.codec.msg_id import new_msg_id
from ferry.names import TRACE_TOPIC
from ferry.telemetry.jsonl import span_json, yield_gil
from ferry.wire import (
    Frame,
    FrameDecoder,
    RequestCode,
    WireMessage,
    check_response,
    encode_frame,
    encode_messages,
    request,
)

log = logging.getLogger(__name__)

#: At most this many message-id keys on one span's message (a batch span's links).
MAX_MESSAGE_KEYS = 16
#: The key prefix of a span's trace id.
TRACE_KEY_PREFIX = "t:"
#: How long one export may take before its spans are dropped.
SEND_TIMEOUT_S = 5.0
#: How long the list of brokers is trusted before namesrv is asked again.
BROKERS_TTL_S = 30.0
#: Spans per SEND frame (a BatchSpanProcessor hands over up to 512 at once).
MAX_SPANS_PER_SEND = 256
_MESSAGE_ID = "messaging.message.id"


def span_keys(doc: dict[str, Any], linked_ids: Sequence[str] = ()) -> list[str]:
    """The index keys of a span's message: its message id(s) then `t:<trace id>`."""
    keys: list[str] = []
    own = doc["attributes"].get(_MESSAGE_ID)
    for msg_id in ([own] if own else []) + list(linked_ids):
        if msg_id and msg_id not in keys and " " not in msg_id and len(keys) < MAX_MESSAGE_KEYS:
            keys.append(msg_id)
    keys.append(TRACE_KEY_PREFIX + doc["trace_id"])
    return keys


def span_message(doc: dict[str, Any]) -> WireMessage:
    """A span's `%TRACE%` message (the linked message ids come from the links' attributes)."""
    linked = [link["attributes"].get(_MESSAGE_ID) for link in doc["links"]]
    return WireMessage(body=json.dumps(doc, default=str).encode(), msg_id=new_msg_id(),
                       born_ts_ms=int(time.time() * 1000),
                       keys=" ".join(span_keys(doc, [i for i in linked if i])))


def _is_master(broker: dict[str, Any]) -> bool:
    """A /v1/brokers entry that takes writes: role "master", or no role and broker id 0."""
    role = broker.get("role") or ""
    return role == "master" or (not role and broker.get("id", 0) == 0)


def _get_brokers(urls: list[str], credentials: Credentials | None) -> dict[str, Any]:
    """GET /v1/brokers from the first namesrv that answers (signed when given credentials)."""
    last: Exception | None = None
    for url in urls:
        target = url + "/v1/brokers"
        req = urllib.request.Request(target, headers=signed_url_headers(credentials, "GET", target))
        try:
            with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_S,  # noqa: S310
                                        context=client_context_from_env()) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except OSError as exc:
            last = exc
    raise ConnectionError(f"no namesrv answered: {last}")


class _BrokerLink:
    """One blocking connection to a broker, used from the exporter's (processor's) thread."""

    def __init__(self, addr: str, credentials: Credentials | None = None) -> None:
        self.credentials = credentials  # signs each request (a broker with auth on needs it)
        host, _, port = addr.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=SEND_TIMEOUT_S)
        tls = client_context_from_env()   # FERRY_TLS_CA: the broker speaks TLS
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.decoder = FrameDecoder()
        self.next_id = 1
        #: The broker's identity that signatures name (IDENTIFY, asked once, unsigned).
        self.target = ""
        if credentials is not None:
            self.target = str(self._exchange(request(RequestCode.IDENTIFY, 0, {}))
                              .fields.get("target", ""))

    def call(self, code: int, fields: dict[str, Any], body: bytes) -> Frame:
        req = request(code, self.next_id, fields, body)
        if self.credentials is not None:
            req.auth = sign_wire(self.credentials, self.target, code, fields, body)
        self.next_id += 1
        return self._exchange(req)

    def _exchange(self, req: Frame) -> Frame:
        self.sock.sendall(encode_frame(req))
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            for frame in self.decoder.feed(chunk):
                if frame.request_id == req.request_id:
                    return check_response(frame)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class TraceTopicExporter(SpanExporter):
    """Writes spans to `%TRACE%` on a master broker of the cluster behind `namesrv`.

    It works in the BatchSpanProcessor's thread with blocking sockets: no event
    loop or thread of its own, so the traced code's thread competes with one
    thread only for the GIL.
    """

    def __init__(self, namesrv: str, service: str,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign the namesrv calls (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY)."""
        self.namesrv = namesrv
        self.service = service
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self.exported = 0
        self.dropped = 0
        self._links: dict[str, _BrokerLink] = {}
        self._brokers: list[str] = []
        self._brokers_at = 0.0
        self._turn = itertools.count()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        messages = []
        for span in spans:
            messages.append(span_message(span_json(span)))
            yield_gil()
        try:
            for i in range(0, len(messages), MAX_SPANS_PER_SEND):
                self._send(encode_messages(messages[i:i + MAX_SPANS_PER_SEND]))
        except Exception as exc:  # never fail the traced code: count and go on
            self.dropped += len(messages)
            log.warning("trace topic: %d spans dropped (%s)", len(messages), exc or type(exc))
            return SpanExportResult.FAILURE
        self.exported += len(messages)
        return SpanExportResult.SUCCESS

    def _send(self, body: bytes) -> None:
        """SEND one frame of spans to a master broker, trying the others on failure."""
        brokers = self._masters()
        if not brokers:
            raise ConnectionError("no master broker is registered")
        start = next(self._turn)
        last: Exception | None = None
        for k in range(len(brokers)):
            addr = brokers[(start + k) % len(brokers)]
            try:
                link = self._links.get(addr)
                if link is None:
                    link = self._links[addr] = _BrokerLink(addr, self.credentials)
                link.call(RequestCode.SEND, {"topic": TRACE_TOPIC, "queue_id": 0, "flags": 0,
                                             "trace_export": True}, body)
                return
            except Exception as exc:  # a dead connection or broker: try the next one
                last = exc
                dead = self._links.pop(addr, None)
                if dead is not None:
                    dead.close()
        self._brokers_at = 0.0   # ask namesrv again next time
        assert last is not None
        raise last

    def _masters(self) -> list[str]:
        if time.monotonic() - self._brokers_at > BROKERS_TTL_S or not self._brokers:
            data = _get_brokers(parse_namesrv(self.namesrv), self.credentials)
            self._brokers = sorted({b["addr"] for b in data.get("brokers", []) if _is_master(b)})
            self._brokers_at = time.monotonic()
        return self._brokers

    def shutdown(self) -> None:
        self._closed = True
        links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
