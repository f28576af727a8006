"""Child process of the crash tests: appends until killed, printing what was acknowledged.

Usage: python crash_child.py <root_dir> <sync|async> <seed>

Each body is derived from its msg id, so the parent can tell a real record from
garbage. A line `ack <msg_id hex> <topic> <queue_id> <queue_offset>` is printed
only once the append is acknowledged: in sync mode after wait_durable resolved,
in async mode after put_batch returned (the record is in the page cache).
"""
from __future__ import annotations

import random
import sys

from ferry.store import FlushMode, MessageIn, MessageStore, StoreConfig, new_msg_id

CONFIG = dict(commitlog_segment_bytes=512 * 1024, max_message_bytes=16 * 1024,
              cq_entries_per_segment=64, index_max_slots=256, index_max_entries=2048,
              flush_interval_ms=20, checkpoint_interval_ms=50)


def body_for(msg_id: bytes, size: int) -> bytes:
    return (msg_id * (size // 16 + 1))[:size]


def main() -> None:
    root, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    flush_mode = FlushMode.SYNC if mode == "sync" else FlushMode.ASYNC
    store = MessageStore(StoreConfig(root_dir=root, flush_mode=flush_mode, **CONFIG))  # type: ignore[arg-type]
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    while True:
        batch = []
        for _ in range(rng.randint(1, 16)):
            msg_id = new_msg_id()
            batch.append(MessageIn(rng.choice(["c1", "c2", "%RETRY%g"]), rng.randint(0, 3),
                                   body_for(msg_id, rng.randint(0, 3000)), keys=msg_id.hex(),
                                   msg_id=msg_id))
        results = store.put_batch(batch)
        if flush_mode is FlushMode.SYNC:
            store.wait_durable(results[-1].end_offset).result()
        out.write("".join(f"ack {r.msg_id.hex()} {m.topic} {m.queue_id} {r.queue_offset}\n"
                          for m, r in zip(batch, results, strict=True)))
        out.flush()


if __name__ == "__main__":
    main()
