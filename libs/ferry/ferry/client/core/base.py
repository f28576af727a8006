"""What every Ferry client shares: `start()` / `stop()`, and `async with` around them."""
from __future__ import annotations

from typing import Self


class AsyncClient:
    """A client started by `start()` and stopped by `stop()`, or used as `async with C(...) as c:`
    (aiokafka's shape): `Producer`, `TransactionProducer`, `Consumer`, `Admin`."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
