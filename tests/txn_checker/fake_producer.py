"""A transactional producer played on a raw wire connection, for counting checks.

`FakeProducer` registers its group with HEARTBEAT role=producer (again every
second), receives the one-way CHECK_TRANSACTION frames the broker pushes, and
answers each with what `answer(msg_id_hex, n)` says for the n-th check of that
transaction: "commit" / "rollback" send END_TRANSACTION(from_check, by
"check"), None (UNKNOWN) sends nothing. `checks` counts the checks received.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Callable

from ferry.codec import msg_id_hex
from ferry.wire import RequestCode

from tests.broker.txn_client import TxnClient

HEARTBEAT_INTERVAL_S = 1.0
Answer = Callable[[str, int], "str | None"]


class FakeProducer:
    def __init__(self, addr: str, group: str, answer: Answer) -> None:
        self.addr = addr
        self.group = group
        self.answer = answer
        self.client_id = f"fake-{uuid.uuid4().hex[:8]}"
        self.checks: Counter[str] = Counter()
        self.ended: dict[str, str] = {}
        self.client: TxnClient | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> FakeProducer:
        host, port = self.addr.rsplit(":", 1)
        self.client = await TxnClient.connect(host, int(port))  # type: ignore[assignment]
        await self.client.register_producer(self.group, self.client_id)
        self._tasks = [asyncio.create_task(self._heartbeat()),
                       asyncio.create_task(self._answer())]
        return self

    async def begin(self, topic: str, body: bytes, **props: str) -> str:
        """Store a half message (queue 0 of `topic`); its transaction id (32 hex)."""
        assert self.client is not None
        msg = await self.client.begin(topic, 0, body, self.group, **props)
        return msg_id_hex(msg.msg_id)

    async def end(self, msg_id: str, action: str) -> dict[str, object]:
        assert self.client is not None
        return await self.client.end(self.group, bytes.fromhex(msg_id), action)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            with contextlib.suppress(Exception):
                assert self.client is not None
                await self.client.register_producer(self.group, self.client_id)

    async def _answer(self) -> None:
        assert self.client is not None
        while True:
            frame = await self.client.pushed.get()
            if frame.code != RequestCode.CHECK_TRANSACTION:
                continue
            msg_id = msg_id_hex(bytes(frame.fields["msg_id"]))
            self.checks[msg_id] += 1
            action = self.answer(msg_id, self.checks[msg_id])
            if action is not None:
                with contextlib.suppress(Exception):
                    fields = await self.client.end(self.group, bytes.fromhex(msg_id), action,
                                                   from_check=True, by="check")
                    self.ended[msg_id] = str(fields.get("state"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
