"""The Ferry span exporter: each span is one message of the internal `%TRACE%` topic.

A span's message has the span JSON (`span_json`) as its body and as keys the
message id(s) it concerns (`messaging.message.id`, plus the ids a batch span
links to, at most MAX_MESSAGE_KEYS) and `t:<trace id>`, so the brokers' key
index answers "the spans of message M" and then "every span of its trace"
(`trace_query.spans_of_message`).

It writes with a SEND to `%TRACE%` carrying `trace_export: true`, the one
SEND to an internal topic a broker accepts (docs/protocol.md). The exporter
runs behind a BatchSpanProcessor, in that processor's thread; it sends from
its own event loop in a daemon thread, never from the traced code's loop, and
its messages are never traced. It never fails the traced code: a batch that
cannot be stored within SEND_TIMEOUT_S is dropped and counted (`dropped`).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ferry.client.connection import ConnectionPool
from ferry.client.namesrv import NamesrvClient
from ferry.codec.msg_id import new_msg_id
from ferry.names import TRACE_TOPIC
from ferry.telemetry.jsonl import span_json
from ferry.wire import RequestCode, WireMessage, check_response, encode_messages

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


class TraceTopicExporter(SpanExporter):
    """Writes spans to `%TRACE%` on a master broker of the cluster behind `namesrv`."""

    def __init__(self, namesrv: str, service: str) -> None:
        self.namesrv = namesrv
        self.service = service
        self.exported = 0
        self.dropped = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._names: NamesrvClient | None = None
        self._pool: ConnectionPool | None = None
        self._brokers: list[str] = []
        self._brokers_at = 0.0
        self._turn = itertools.count()
        self._closed = False

    # -- the exporter's own loop, started on first export ---------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="ferry-trace-topic",
                                            daemon=True)
            self._thread.start()
            self._loop = loop
        return self._loop

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        messages = [span_message(span_json(s)) for s in spans]
        fut = asyncio.run_coroutine_threadsafe(self._send_all(messages), self._ensure_loop())
        try:
            fut.result(SEND_TIMEOUT_S)
        except Exception as exc:  # never fail the traced code: count and go on
            fut.cancel()
            self.dropped += len(messages)
            log.warning("trace topic: %d spans dropped (%s)", len(messages), exc or type(exc))
            return SpanExportResult.FAILURE
        self.exported += len(messages)
        return SpanExportResult.SUCCESS

    async def _send_all(self, messages: list[WireMessage]) -> None:
        for i in range(0, len(messages), MAX_SPANS_PER_SEND):
            await self._send(encode_messages(messages[i:i + MAX_SPANS_PER_SEND]))

    async def _send(self, body: bytes) -> None:
        """SEND one frame of spans to a master broker, trying the others on failure."""
        brokers = await self._masters()
        if not brokers:
            raise ConnectionError("no master broker is registered")
        start = next(self._turn)
        last: Exception | None = None
        for k in range(len(brokers)):
            addr = brokers[(start + k) % len(brokers)]
            assert self._pool is not None
            try:
                resp = await self._pool.request(addr, RequestCode.SEND, {
                    "topic": TRACE_TOPIC, "queue_id": 0, "flags": 0, "trace_export": True},
                    body)
                check_response(resp)
                return
            except Exception as exc:  # try the next broker
                last = exc
        self._brokers_at = 0.0   # ask namesrv again next time
        assert last is not None
        raise last

    async def _masters(self) -> list[str]:
        if self._names is None:
            self._names = NamesrvClient(self.namesrv)
            await self._names.start()
            self._pool = ConnectionPool()
        if time.monotonic() - self._brokers_at > BROKERS_TTL_S or not self._brokers:
            data = await self._names.call("GET", "/v1/brokers")
            self._brokers = sorted({b["addr"] for b in data.get("brokers", [])
                                    if _is_master(b)})
            self._brokers_at = time.monotonic()
        return self._brokers

    def shutdown(self) -> None:
        self._closed = True
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            if self._pool is not None:
                await self._pool.close()
            if self._names is not None:
                await self._names.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(SEND_TIMEOUT_S)
        except Exception:  # noqa: S110 - closing connections of a process that is ending
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(SEND_TIMEOUT_S)
        if not loop.is_running():
            loop.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
