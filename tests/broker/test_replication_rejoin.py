"""Replication (issue 9): how a slave's epoch log and tail follow the master's terms.

A new term that starts while a slave is linked reaches it (EPOCHS frame); a
store that ran without replication and joins as a slave starts over from 0; a
master whose link goes silent is left, and the follower links again.
"""
from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import pytest
from ferry_broker.replication import follower as follower_mod
from ferry_broker.replication import protocol as p

from tests.broker.repl_support import (
    fill,
    open_master,
    open_slave,
    queue_ends,
    until,
    whole_log,
)


async def test_a_new_term_during_a_link_reaches_the_slave(tmp_path: Path) -> None:
    m, s = open_master(tmp_path / "m"), open_slave(tmp_path / "s")
    await m.start()
    rng = random.Random(21)
    try:
        m.put(10, rng)
        await s.follower.follow(m.addr, 1, 0)
        await until(lambda: s.store.commit_log_max_offset == m.store.commit_log_max_offset)
        m.epoch = 2  # the same broker won the next term without the link dropping
        m.epochs.append(2, m.store.commit_log_max_offset)
        m.put(10, rng)
        await until(lambda: s.store.commit_log_max_offset == m.store.commit_log_max_offset)
        await until(lambda: s.epochs.entries == m.epochs.entries)
        assert [e for e, _ in s.epochs.entries] == [1, 2]
        assert whole_log(s.store) == whole_log(m.store)
    finally:
        await s.follower.stop()
        assert m.server is not None
        await m.server.stop()
        m.store.close()
        s.store.close()


async def test_a_store_without_epochs_joins_from_zero(tmp_path: Path) -> None:
    """Its own records share no epoch with the master: it drops them and copies the master."""
    m, s = open_master(tmp_path / "m"), open_slave(tmp_path / "s")
    await m.start()
    rng = random.Random(22)
    try:
        fill(s.store, 30, rng)  # written while it ran alone
        m.put(12, rng)
        await s.follower.follow(m.addr, 1, 0)
        await until(lambda: s.follower.status()["connected"]
                    and s.store.commit_log_max_offset == m.store.commit_log_max_offset)
        assert whole_log(s.store) == whole_log(m.store)
        assert {k: v for k, v in queue_ends(s.store).items() if v} == \
            {k: v for k, v in queue_ends(m.store).items() if v}
        assert s.epochs.entries == m.epochs.entries
    finally:
        await s.follower.stop()
        assert m.server is not None
        await m.server.stop()
        m.store.close()
        s.store.close()


async def test_the_follower_leaves_a_silent_master_and_links_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A master that welcomes and then says nothing (hung) is dropped after the idle timeout."""
    monkeypatch.setattr(follower_mod, "MASTER_IDLE_TIMEOUT_MS", 300)
    s = open_slave(tmp_path / "s")
    hellos = 0

    async def hung_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hellos
        ftype, _ = await p.read_frame(reader)
        hellos += ftype is p.FrameType.HELLO
        writer.writelines(p.encode_welcome(p.Welcome(1, 0, 0, [(1, 0)])))
        with contextlib.suppress(asyncio.CancelledError):  # at teardown
            await reader.read()  # and never another frame
        writer.close()

    server = await asyncio.start_server(hung_master, "127.0.0.1", 0)
    try:
        await s.follower.follow(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", 1, 0)
        await until(lambda: hellos >= 2)  # it gave up on the first link and came back
    finally:
        await s.follower.stop()
        server.close()
        await server.wait_closed()
        s.store.close()
