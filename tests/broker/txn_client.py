"""The test wire client, also receiving requests the broker pushes (CHECK_TRANSACTION).

WireClient matches every incoming frame to a pending request by id; a frame
the broker sends on its own (no RESPONSE flag) would be taken for the answer
to whichever request shares its id. This one keeps those apart in `pushed`.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from ferry.codec import TXN_GROUP, MessageFlag
from ferry.store import encode_properties
from ferry.wire import Flag, Frame, RequestCode, WireMessage, check_response, encode_messages

from tests.broker.wire_client import WireClient, message

TXN_HALF = int(MessageFlag.TXN_HALF)


class TxnClient(WireClient):
    """A WireClient that collects the one-way requests the broker sends it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pushed: asyncio.Queue[Frame] = asyncio.Queue()
        super().__init__(reader, writer)

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(1 << 16):
                for frame in self.decoder.feed(data):
                    if not frame.flags & Flag.RESPONSE:
                        self.pushed.put_nowait(frame)
                        continue
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

    async def next_push(self, timeout_s: float = 10.0) -> Frame:
        return await asyncio.wait_for(self.pushed.get(), timeout_s)

    async def begin(self, topic: str, queue_id: int, body: bytes, group: str, *,
                    keys: str = "k1", flags: int = 0, **props: str) -> WireMessage:
        """Store a half message; returns it (its msg_id is the transaction id)."""
        msg = half_message(body, group, keys=keys, flags=flags, **props)
        resp = await self.call(RequestCode.SEND, {"topic": topic, "queue_id": queue_id,
                                                  "flags": msg.flags}, encode_messages([msg]))
        assert resp.fields["offsets"] == [-1]
        return msg

    async def end(self, group: str, msg_id: bytes, action: str, **extra: Any) -> dict[str, Any]:
        resp = await self.call(RequestCode.END_TRANSACTION,
                               {"group": group, "msg_id": msg_id, "action": action, **extra})
        return resp.fields

    async def register_producer(self, group: str, client_id: str) -> None:
        await self.call(RequestCode.HEARTBEAT, {"client_id": client_id, "group": group,
                                                "role": "producer"})

    async def check(self, group: str, msg_id: bytes) -> dict[str, Any]:
        resp = await self.call(RequestCode.CHECK_TRANSACTION, {"group": group, "msg_id": msg_id})
        return check_response(resp).fields


def half_message(body: bytes, group: str | None, *, keys: str = "k1", flags: int = 0,
                 **props: str) -> WireMessage:
    msg = message(body, tags="t1", keys=keys, born_ts_ms=int(time.time() * 1000))
    msg.flags = TXN_HALF | flags
    if group is not None:
        props[TXN_GROUP] = group
    msg.properties = encode_properties(props)
    return msg
