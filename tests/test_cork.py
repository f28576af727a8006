"""ferry.cork on a real event loop: what leaves when, and in how many writes."""
from __future__ import annotations

import asyncio

from ferry.cork import Cork


def _cork() -> tuple[Cork, list[list[bytes]]]:
    writes: list[list[bytes]] = []
    return Cork(lambda out: writes.append(list(out)) if out else None), writes


async def test_add_writes_a_turns_parts_once_at_its_end() -> None:
    cork, writes = _cork()
    cork.add([b"a"])
    cork.add([b"b", b"c"])
    assert writes == [] and cork.nbytes == 3
    await asyncio.sleep(0)
    assert writes == [[b"a", b"b", b"c"]] and cork.nbytes == 0


async def test_add_now_sends_the_turns_first_parts_at_once_and_corks_the_rest() -> None:
    cork, writes = _cork()
    cork.add_now([b"first"])
    assert writes == [[b"first"]]
    cork.add_now([b"second"])
    cork.add([b"third"])
    assert writes == [[b"first"]]
    await asyncio.sleep(0)
    assert writes == [[b"first"], [b"second", b"third"]]
    await asyncio.sleep(0)
    cork.add_now([b"next turn"])  # a new turn: at once again
    assert writes[-1] == [b"next turn"]


async def test_held_cork_writes_everything_once_when_the_block_ends() -> None:
    cork, writes = _cork()
    with cork:
        cork.add_now([b"a"])
        cork.add([b"b"])
        assert writes == []
    assert writes == [[b"a", b"b"]]
    cork.add_now([b"c"])  # nothing scheduled by the held adds: this one goes at once
    assert writes == [[b"a", b"b"], [b"c"]]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert writes == [[b"a", b"b"], [b"c"]]


async def test_clear_drops_what_waits() -> None:
    cork, writes = _cork()
    cork.add([b"gone"])
    cork.clear()
    await asyncio.sleep(0)
    assert writes == [] and cork.nbytes == 0
