"""The broker's state managers on their own: offsets file, live consumers, long polls."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from ferry.errors import AccessDeniedError, BusyError, StoreError
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.long_poll import LongPollManager


def whole_table(mgr: ConsumerOffsetManager) -> bytes:
    """The table as the first OFFSETS frame of a new link carries it (one batch here)."""
    (payload,) = mgr.encode_changes(mgr.changes_since(-1)[1], 1 << 20)
    return payload


def test_offsets_survive_save_and_load(tmp_path: Path) -> None:
    path = tmp_path / "config" / "consumer_offsets.json"
    mgr = ConsumerOffsetManager(path)
    assert mgr.query("g", "t", 0) == -1
    mgr.commit("g", "t", 0, 5)
    mgr.commit("g", "t", 3, 7)
    mgr.commit("h", "u", 1, 0)
    assert mgr.dirty
    mgr.save()
    assert not mgr.dirty and not path.with_suffix(".json.tmp").exists()
    doc = json.loads(path.read_text())
    assert doc == {"version": 1, "offsets": {"g": {"t": {"0": 5, "3": 7}}, "h": {"u": {"1": 0}}}}
    again = ConsumerOffsetManager(path)
    again.load()
    assert again.query("g", "t", 3) == 7 and again.query("h", "u", 1) == 0


def test_offsets_older_snapshot_never_overwrites_newer(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "o.json")
    mgr.commit("g", "t", 0, 1)
    old = mgr.snapshot()
    mgr.commit("g", "t", 0, 2)
    mgr.write_snapshot(*mgr.snapshot())
    mgr.write_snapshot(*old)
    fresh = ConsumerOffsetManager(tmp_path / "o.json")
    fresh.load()
    assert fresh.query("g", "t", 0) == 2


def test_offsets_keep_the_history_committed_with_them(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    mgr = ConsumerOffsetManager(path)
    mgr.commit("g", "t", 0, 5, "E3")
    mgr.commit("g", "t", 1, 2)
    mgr.save()
    again = ConsumerOffsetManager(path)
    again.load()
    assert again.query("g", "t", 0) == 5 and again.query_hist("g", "t", 0) == "E3"
    assert again.query_hist("g", "t", 1) is None
    again.commit("g", "t", 0, 5)   # committed again without one: forgotten
    assert again.query_hist("g", "t", 0) is None
    slave = ConsumerOffsetManager(tmp_path / "s.json")
    slave.merge_snapshot(whole_table(mgr), lambda t, q: 4)   # clamped: no history
    assert slave.query("g", "t", 0) == 4 and slave.query_hist("g", "t", 0) is None
    slave.merge_snapshot(whole_table(mgr), lambda t, q: 10)
    assert slave.query_hist("g", "t", 0) == "E3"


def test_offsets_an_identitys_entries_are_capped_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    mgr = ConsumerOffsetManager(path, max_per_identity=2)
    mgr.commit("g", "t", 0, 1, identity="ak")
    mgr.commit("g", "t", 1, 1, identity="ak")
    with pytest.raises(AccessDeniedError, match="OFFSETS_MAX_PER_IDENTITY"):
        mgr.commit("g", "t", 2, 1, identity="ak")
    mgr.commit("g", "t", 1, 5, identity="ak")   # its existing entries still move
    mgr.commit("g", "t", 2, 1, identity="other")
    mgr.commit("g", "t", 3, 1)                  # auth off: no identity, no cap
    mgr.save()
    again = ConsumerOffsetManager(path, max_per_identity=2)
    again.load()   # who created what is in the file: a restart does not reset the count
    assert again.created_by("ak") == 2 and again.created_by("other") == 1
    with pytest.raises(AccessDeniedError):
        again.commit("g", "t", 4, 1, identity="ak")
    assert again.query("g", "t", 1) == 5 and again.query("g", "t", 4) == -1


def test_offsets_changes_since_walks_back_only_over_what_changed(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "o.json")
    for q in range(5):
        mgr.commit("g", "t", q, 1)
    seen, _ = mgr.changes_since(-1)
    mgr.commit("g", "t", 1, 2)
    mgr.commit("g", "t", 1, 2)   # no change, no new version
    mgr.commit("g", "t", 3, 4, "E2")
    version, changes = mgr.changes_since(seen)
    assert version == seen + 2
    assert [(key, e.offset, e.hist) for key, e in changes] == [
        (("g", "t", 3), 4, "E2"), (("g", "t", 1), 2, None)]
    assert mgr.changes_since(version) == (version, [])
    assert len(mgr.changes_since(-1)[1]) == 5
    with pytest.raises(StoreError):
        mgr.merge_snapshot(b'{"version": 2, "entries": [["g", "t", "0", 1, null, null]]}',
                           lambda t, q: 10)


def test_offsets_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text("{not json")
    with pytest.raises(StoreError):
        ConsumerOffsetManager(path).load()


def test_consumers_sorted_filtered_and_expired() -> None:
    now = [1000.0]
    mgr = ConsumerManager(expiry_ms=30_000, clock_ms=lambda: now[0])
    mgr.heartbeat("c2", "g", frozenset({"t"}), "clustering")
    mgr.heartbeat("c1", "g", frozenset({"t", "u"}), "clustering")
    mgr.heartbeat("c3", "g", frozenset({"u"}), "clustering")
    assert mgr.members("g", "t") == ["c1", "c2"]
    assert mgr.members("g") == ["c1", "c2", "c3"]
    now[0] += 20_000
    mgr.heartbeat("c2", "g", frozenset({"t"}), "clustering")
    now[0] += 15_000  # c1 and c3 silent for 35 s, c2 for 15 s
    assert mgr.members("g", "t") == ["c2"]
    assert mgr.unregister("c2", "g")
    assert mgr.members("g") == [] and mgr.groups() == {}


def test_a_lock_keeps_a_known_member_alive_and_adds_no_unknown_one() -> None:
    now = [1000.0]
    mgr = ConsumerManager(expiry_ms=30_000, clock_ms=lambda: now[0])
    mgr.heartbeat("c1", "g", frozenset({"t"}), "clustering")
    now[0] += 20_000
    mgr.touch("c1", "g")            # its LOCK arrived; its heartbeats did not
    mgr.touch("stranger", "g")
    now[0] += 20_000                # 40 s after its heartbeat, 20 s after its LOCK
    assert mgr.members("g") == ["c1"]
    now[0] += 11_000
    assert mgr.members("g") == []


async def test_long_poll_wakes_on_notify_and_times_out() -> None:
    lp = LongPollManager(max_per_conn=2, max_total=3)
    task = asyncio.create_task(lp.wait("t", 0, 5.0))
    await asyncio.sleep(0)
    started = time.monotonic()
    assert lp.notify("t", 1) == 0
    assert lp.notify("t", 0) == 1
    assert await task is True
    assert time.monotonic() - started < 0.05
    started = time.monotonic()
    assert await lp.wait("t", 0, 0.05) is False
    assert 0.04 < time.monotonic() - started < 1.0


async def test_long_poll_limits_and_close() -> None:
    lp = LongPollManager(max_per_conn=2, max_total=3)
    async with lp.slot(1), lp.slot(1):
        with pytest.raises(BusyError):
            async with lp.slot(1):
                pass
        async with lp.slot(2):
            assert lp.held == 3
            with pytest.raises(BusyError):
                async with lp.slot(3):
                    pass
    assert lp.held == 0
    task = asyncio.create_task(lp.wait("t", 0, 10.0))
    await asyncio.sleep(0)
    lp.close()
    assert await task is False
    assert await lp.wait("t", 0, 10.0) is False


def test_config_env_and_overrides() -> None:
    env = {"FERRY_BROKER_PORT": "1234", "FERRY_BROKER_FLUSH_MODE": "sync",
           "FERRY_BROKER_AUTO_CREATE_TOPICS": "false", "FERRY_BROKER_ETCD": ""}
    cfg = BrokerConfig.from_env(env, {"port": 4321, "name": None})
    assert cfg.port == 4321 and cfg.flush_mode == "sync" and not cfg.auto_create_topics
    assert cfg.etcd == "" and cfg.name == "broker-a" and cfg.addr == "127.0.0.1:4321"
    with pytest.raises(ValueError):
        BrokerConfig.from_env({"FERRY_BROKER_FLUSH_MODE": "maybe"})
    with pytest.raises(ValueError):
        BrokerConfig.from_env({"FERRY_BROKER_PORT": "x"})


def test_offsets_table_is_bounded_and_snapshots_are_copies(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "o.json", max_entries=2)
    mgr.commit("g", "t", 0, 1)
    mgr.commit("g", "t", 1, 1)
    with pytest.raises(BusyError):
        mgr.commit("g", "t", 2, 1)
    mgr.commit("g", "t", 1, 9)  # an existing entry still moves
    version, table = mgr.snapshot()
    mgr.commit("g", "t", 0, 5)
    assert table[("g", "t", 0)].offset == 1  # the snapshot does not follow later commits
    mgr.write_snapshot(version, table)
    assert b" " not in (tmp_path / "o.json").read_bytes()  # compact


def test_flush_watchdog_marks_a_stalled_store_and_clears_when_it_flushes(
        tmp_path: Path) -> None:
    from ferry.store import MessageIn, MessageStore, StoreConfig
    from ferry_broker.health import StoreHealth
    from ferry_broker.housekeeping import FlushWatchdog

    now = [0.0]
    health = StoreHealth()
    # A flush thread that never comes round in this test: like one that died.
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=8 << 20,
                                     flush_interval_ms=3_600_000,
                                     checkpoint_interval_ms=3_600_000))
    try:
        dog = FlushWatchdog(store, health, stall_ms=30_000, clock=lambda: now[0])
        dog.check()
        store.put(MessageIn(topic="wd", queue_id=0, body=b"x"))
        dog.check()
        now[0] = 29.0
        dog.check()
        assert health.healthy
        now[0] = 31.0
        dog.check()
        assert not health.healthy and health.stalled and health.failure is None
    finally:
        store.close()  # flushes everything
    now[0] = 32.0
    dog.check()
    assert health.healthy


def test_flush_watchdog_reports_a_store_failure_before_any_send(tmp_path: Path) -> None:
    import errno
    import time

    from ferry.store import MessageIn, MessageStore, StoreConfig
    from ferry_broker.health import StoreHealth
    from ferry_broker.housekeeping import FlushWatchdog

    health = StoreHealth()
    withdrawn: list[bool] = []
    health.add_listener(lambda: withdrawn.append(True))
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=8 << 20,
                                     flush_interval_ms=10))
    dog = FlushWatchdog(store, health)
    dog.check()
    assert health.healthy

    def broken_flush(target: int | None = None) -> int:
        raise OSError(errno.EIO, "Input/output error")

    store._cl.flush = broken_flush  # type: ignore[method-assign]
    store.put(MessageIn(topic="wd", queue_id=0, body=b"x"))
    deadline = time.monotonic() + 5
    while store.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    dog.check()
    assert health.failure is not None and "Input/output error" in health.failure
    assert withdrawn == [True]  # readiness left and the etcd key withdrawn, once
    del store._cl.flush  # type: ignore[method-assign]
    store.close()
