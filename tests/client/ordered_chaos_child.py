"""An ordered consumer in a child process (so a test can SIGKILL it).

Usage: python ordered_chaos_child.py NAMESRV TOPIC GROUP OUT_FILE
Runs `consumer.run(handler, ordered=True)`; the handler appends one line per
delivery ("<member> <body>") to OUT_FILE, which every member of the test
shares: each line is one os.write() to a file opened with O_APPEND, so the
file's line order is the order in which the deliveries happened. Locks are
renewed every 500 ms (the test's brokers expire them after a few seconds).
SIGTERM stops the consumer cleanly (it leaves the group).
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys

from ferry import Consumer
from ferry.client.core.message import ConsumerRecord


async def main(namesrv: str, topic: str, group: str, out_path: str) -> None:
    fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    me = f"{os.getpid()}"

    async def handler(record: ConsumerRecord) -> None:
        os.write(fd, f"{me} {record.body.decode()}\n".encode())
        await asyncio.sleep(0.001)   # a little work, so that deliveries overlap rebalances

    async with Consumer(topic, group=group, namesrv=namesrv, auto_offset_reset="earliest",
                        ordered=True, heartbeat_interval_ms=300, rebalance_interval_ms=300,
                        lock_renew_interval_ms=500, pull_max_wait_ms=1000,
                        request_timeout_ms=5000, auto_commit_interval_ms=300) as consumer:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runner = asyncio.ensure_future(consumer.run(handler, ordered=True, concurrency=8))
        await stop.wait()
    await asyncio.gather(runner, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
