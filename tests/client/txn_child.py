"""A transactional producer in a child process (so a test can SIGKILL it after `begin`).

Usage: python txn_child.py NAMESRV TOPIC GROUP OUT_FILE
Begins one transaction with body b"from-child", writes "<msg_id> <broker addr>"
to OUT_FILE, then waits forever without ending it. Its checker answers UNKNOWN.
"""
from __future__ import annotations

import asyncio
import sys

from ferry import TransactionProducer, TxnState


async def main(namesrv: str, topic: str, group: str, out_path: str) -> None:
    async with TransactionProducer(group=group, namesrv=namesrv, heartbeat_interval_ms=300,
                                   checker=lambda rec: TxnState.UNKNOWN) as tp:
        txn = await tp.begin(topic, b"from-child", key="child")
        with open(out_path, "w") as out:
            out.write(f"{txn.msg_id} {txn.addr}\n")
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
