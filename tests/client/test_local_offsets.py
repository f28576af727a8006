"""A broadcasting consumer's own positions (LocalOffsetStore) keep the history of the
record before each offset (issue 16), in memory and across a restart."""
from __future__ import annotations

import json
from pathlib import Path

from ferry.client.core.message import TopicQueue
from ferry.client.core.offsets import Committed, LocalOffsetStore

A = TopicQueue("t", "broker-a", 0)
B = TopicQueue("t", "broker-a", 1)


async def test_offsets_keep_their_history_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = LocalOffsetStore(path)
    await store.commit({A: 3000, B: 7}, {A: "L9f3c0a12b4d5e6f7"})
    assert await store.load_with_hist(A) == Committed(3000, "L9f3c0a12b4d5e6f7")
    await store.close()
    again = LocalOffsetStore(path)
    assert await again.load_with_hist(A) == Committed(3000, "L9f3c0a12b4d5e6f7")
    assert await again.load_with_hist(B) == Committed(7, None)
    assert await again.load_with_hist(TopicQueue("t", "broker-a", 2)) == Committed(None, None)
    # An offset committed without a history no longer names the old one.
    await again.commit({A: 3100})
    assert await again.load_with_hist(A) == Committed(3100, None)


async def test_a_file_from_before_histories_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({"offsets": [
        {"topic": "t", "broker": "broker-a", "queue_id": 0, "offset": 12}]}))
    assert await LocalOffsetStore(path).load_with_hist(A) == Committed(12, None)
