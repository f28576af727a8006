"""A consumer in a child process (so a test can SIGKILL it): prints what it receives.

Usage: python consumer_child.py NAMESRV TOPIC GROUP OUT_FILE
Writes one line per record to OUT_FILE ("broker queue_id offset body"), and
"assigned <n>" lines whenever its assignment changes; flushed at once.
"""
from __future__ import annotations

import asyncio
import sys

from ferry import Consumer


async def main(namesrv: str, topic: str, group: str, out_path: str) -> None:
    with open(out_path, "a", buffering=1) as out:
        async with Consumer(topic, group=group, namesrv=namesrv, auto_offset_reset="earliest",
                            heartbeat_interval_ms=300, rebalance_interval_ms=300,
                            pull_max_wait_ms=1000, request_timeout_ms=5000,
                            auto_commit_interval_ms=300) as consumer:
            last: frozenset[object] = frozenset()
            while True:
                batch = await consumer.getmany(timeout_ms=100)
                if consumer.assignment() != last:
                    last = consumer.assignment()
                    out.write(f"assigned {len(last)}\n")
                for records in batch.values():
                    for r in records:
                        out.write(f"{r.broker} {r.queue_id} {r.queue_offset} {r.body.decode()}\n")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
