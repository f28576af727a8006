"""A tiny test-side Ferry wire client: asyncio streams + ferry.wire, nothing else.

It is deliberately not ferry.client: broker tests must not depend on the
production client. One reader task matches responses to requests by id.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

from ferry.store import StoredMessage, encode_properties, iter_records, new_msg_id
from ferry.wire import (
    Frame,
    FrameDecoder,
    RequestCode,
    WireMessage,
    check_response,
    encode_frame_parts,
    encode_messages,
    request,
)


def message(body: bytes, tags: str = "", keys: str = "", born_ts_ms: int | None = None,
            msg_id: bytes | None = None, properties: dict[str, str] | None = None
            ) -> WireMessage:
    return WireMessage(body=body, msg_id=msg_id or new_msg_id(),
                       born_ts_ms=int(time.time() * 1000) if born_ts_ms is None else born_ts_ms,
                       tags=tags, keys=keys, properties=encode_properties(properties or {}))


class WireClient:
    """One connection to a broker."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.ids = itertools.count(1)
        self.closed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, host: str, port: int) -> WireClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(1 << 16):
                for frame in self.decoder.feed(data):
                    fut = self.pending.pop(frame.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionResetError("connection closed"))

    def write_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def request(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
                      timeout_s: float = 10.0) -> Frame:
        """Send a request; return the response frame as is (errors included)."""
        rid = next(self.ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.writer.writelines(encode_frame_parts(request(code, rid, fields or {}, body)))
        return await asyncio.wait_for(fut, timeout_s)

    async def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
                   timeout_s: float = 10.0) -> Frame:
        """Like request(), but raise the FerryError of an error response."""
        return check_response(await self.request(code, fields, body, timeout_s))

    def oneway(self, code: int, fields: dict[str, Any], body: bytes = b"") -> None:
        self.writer.writelines(encode_frame_parts(request(code, next(self.ids), fields, body,
                                                          oneway=True)))

    async def send(self, topic: str, queue_id: int, msgs: list[WireMessage]) -> dict[str, Any]:
        resp = await self.call(RequestCode.SEND, {"topic": topic, "queue_id": queue_id},
                               encode_messages(msgs))
        return resp.fields

    async def pull(self, topic: str, queue_id: int, offset: int, *, group: str = "g",
                   max_count: int = 32, max_wait_ms: int = 0, tags: Any = None,
                   sql: Any = None, timeout_s: float = 20.0, hist: str | None = None
                   ) -> tuple[dict[str, Any], list[StoredMessage]]:
        fields = {"group": group, "topic": topic, "queue_id": queue_id, "offset": offset,
                  "max_count": max_count, "max_wait_ms": max_wait_ms, "tags": tags, "sql": sql}
        if hist is not None:
            fields["hist"] = hist
        resp = await self.call(RequestCode.PULL, fields, timeout_s=timeout_s)
        return resp.fields, list(iter_records(resp.body))

    async def pull_all(self, topic: str, queue_id: int, offset: int = 0,
                       **kw: Any) -> list[StoredMessage]:
        """Every record from `offset` to the queue's end, in as many PULLs as it takes (an
        answer stops where a history ends: after a failover or an unclean restart)."""
        out: list[StoredMessage] = []
        while True:
            fields, msgs = await self.pull(topic, queue_id, offset, **kw)
            out += msgs
            if fields["next_offset"] <= offset or fields["next_offset"] >= fields["max_offset"]:
                return out
            offset = fields["next_offset"]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
