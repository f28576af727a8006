"""A stand-in broker and namesrv for the scheduler's unit tests (integration tests use real ones).

`FakeBroker` speaks the Ferry wire protocol over TCP on top of a real
`ferry.store` MessageStore: PULL, QUERY_OFFSET, COMMIT_OFFSET and DELIVER_DUE
(as docs/protocol.md specifies them), which is all the scheduler asks of a
broker. `FakeNamesrv` answers GET /v1/routes/{topic} from the brokers given.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from ferry.codec import (
    DELIVER_AT_MS,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    MessageIn,
    decode_record,
    encode_properties,
    new_msg_id,
)
from ferry.names import SCHEDULE_TOPIC
from ferry.store import MessageStore, StoreConfig
from ferry.wire import (
    Frame,
    FrameDecoder,
    RequestCode,
    decode_messages,
    encode_frame,
    error_response,
    response,
)

SCHEDULE_QUEUES = 4


class FakeBroker:
    """A broker name, a real store and the four wire requests the scheduler uses."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.store = MessageStore(StoreConfig(root_dir=str(root), commitlog_segment_bytes=8 << 20,
                                              warm_ahead_bytes=0))
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.arrivals: list[tuple[float, Any]] = []  # (receive time s, DELIVER_DUE fields)
        self.refuse_deliveries = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self.port = 0
        self.store.close()

    def schedule(self, topic: str, body: bytes, deliver_at_ms: int, *, queue: int = 0,
                 msg_id: bytes | None = None, reconsume_times: int = 0) -> bytes:
        """Store a delayed message in %SCHEDULE% as the broker's delay hook would."""
        msg_id = msg_id or new_msg_id()
        props = {DELIVER_AT_MS: str(deliver_at_ms), REAL_TOPIC: topic, REAL_QUEUE_ID: "-1",
                 "user": "u1"}
        self.store.put(MessageIn(SCHEDULE_TOPIC, queue, body, "tagA", "k1",
                                 encode_properties(props), msg_id, 1, int(time.time() * 1000),
                                 "127.0.0.1:1", reconsume_times))
        return msg_id

    def delivered(self, topic: str) -> list[Any]:
        """Every message DELIVER_DUE stored in `topic` (queue 0)."""
        got = self.store.get_messages(topic, 0, 0, 100_000, 1 << 30)
        return [decode_record(r) for r in got.records]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        self._writers.add(writer)
        try:
            while data := await reader.read(1 << 16):
                for frame in decoder.feed(data):
                    asyncio.create_task(self._answer(frame, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        try:
            out = await self._handle(frame)
        except Exception as exc:  # noqa: BLE001 - answered as an error, like a broker
            out = error_response(frame, exc)
        if not frame.is_oneway and not writer.is_closing():
            writer.write(encode_frame(out))

    async def _handle(self, req: Frame) -> Frame:
        f = req.fields
        if req.code == RequestCode.QUERY_OFFSET:
            key = (f["group"], f["topic"], f["queue_id"])
            return response(req, {"offset": self.offsets.get(key, -1)})
        if req.code == RequestCode.COMMIT_OFFSET:
            self.offsets[(f["group"], f["topic"], f["queue_id"])] = f["offset"]
            return response(req)
        if req.code == RequestCode.PULL:
            return await self._pull(req)
        if req.code == RequestCode.DELIVER_DUE:
            if self.refuse_deliveries:
                from ferry.errors import BusyError
                raise BusyError("refusing for the test")
            self.arrivals.append((time.time(), dict(f)))
            msgs = decode_messages(req.body)
            topic = f["topic"]
            qid = max(0, f["queue_id"])
            results = self.store.put_batch([MessageIn(
                topic, qid, m.body, m.tags, m.keys, m.properties, m.msg_id, m.flags,
                m.born_ts_ms) for m in msgs])
            return response(req, {"queue_id": qid, "queue_offset": results[0].queue_offset,
                                  "count": len(results), "phy_offset": results[0].phy_offset})
        from ferry.errors import UnknownCodeError
        raise UnknownCodeError(f"fake broker: code {req.code}")

    async def _pull(self, req: Frame) -> Frame:
        f = req.fields
        deadline = time.monotonic() + f.get("max_wait_ms", 0) / 1000
        while True:
            got = self.store.get_messages(f["topic"], f["queue_id"], f["offset"],
                                          f.get("max_count", 32), 1 << 20)
            if got.records or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        return response(req, {"status": got.status.value, "next_offset": got.next_queue_offset,
                              "min_offset": got.min_offset, "max_offset": got.max_offset},
                        b"".join(bytes(r) for r in got.records))


class FakeNamesrv:
    """GET /v1/routes/{topic}: every broker serves every topic (4 queues)."""

    def __init__(self, brokers: list[FakeBroker]) -> None:
        self.brokers = brokers
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        async def route(request: web.Request) -> web.Response:
            topic = request.match_info["topic"]
            live = [b for b in self.brokers if b.port]
            return web.json_response({"topic": topic, "type": "normal", "perm": "rw", "brokers": [
                {"name": b.name, "cluster": "c", "master": b.addr, "queues": SCHEDULE_QUEUES,
                 "perm": "rw", "slaves": []} for b in live]})

        app = web.Application()
        app.router.add_get("/v1/routes/{topic}", route)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
