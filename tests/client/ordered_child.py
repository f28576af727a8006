"""An ordered consumer in a child process (so a test can SIGKILL it): logs every handler call.

Usage: python ordered_child.py NAMESRV TOPIC GROUP OUT_FILE
Runs `consumer.run(handler, ordered=True, concurrency=8)` and writes one line
per handler call, flushed at once, for a checker to merge with other members':
"<time_ns> <client_id> <broker> <queue_id> <queue_offset> <reconsume_times> <body>"
(the body is one word, e.g. "key:seq"). Messages tagged "warm-up" are skipped.
"""
from __future__ import annotations

import asyncio
import sys
import time

from ferry import Consumer, ConsumerRecord


async def main(namesrv: str, topic: str, group: str, out_path: str) -> None:
    with open(out_path, "a", buffering=1) as out:
        async with Consumer(topic, group=group, namesrv=namesrv, auto_offset_reset="earliest",
                            ordered=True, heartbeat_interval_ms=300, rebalance_interval_ms=300,
                            pull_max_wait_ms=1000, request_timeout_ms=5000,
                            auto_commit_interval_ms=300) as consumer:
            async def handler(rec: ConsumerRecord) -> None:
                if rec.tags == "warm-up":
                    return
                out.write(f"{time.time_ns()} {consumer.client_id} {rec.broker} {rec.queue_id} "
                          f"{rec.queue_offset} {rec.reconsume_times} {rec.body.decode()}\n")
                await asyncio.sleep(0.003)

            await consumer.run(handler, concurrency=8)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
