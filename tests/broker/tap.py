"""A network observer for replay tests: a TCP relay that records what clients send."""
from __future__ import annotations

import asyncio
import contextlib

from ferry.wire import Frame, FrameDecoder


class Tap:
    """Relays 127.0.0.1:`port` to `upstream` and keeps every byte clients sent, as someone
    on the network would capture them (`await Tap(upstream).start()`, `close()`)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.sent = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Tap:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def requests(self, code: int) -> list[Frame]:
        """The captured request frames of `code`, in the order they were sent."""
        return [f for f in FrameDecoder().feed(bytes(self.sent)) if f.code == code]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       record: bool) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(1 << 16):
                    if record:
                        self.sent += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
