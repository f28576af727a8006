"""QueueLockTable on a fake clock: exclusive per group, renewal, expiry, release, bounds."""
from __future__ import annotations

import pytest
from ferry.errors import BusyError
from ferry_broker.consumers import ConsumerManager
from ferry_broker.queue_locks import QueueLockTable


def test_locks_are_exclusive_per_group_renewed_and_expire() -> None:
    now = [0.0]
    table = QueueLockTable(expiry_ms=60_000, clock_ms=lambda: now[0])
    assert table.lock("g", "a", "t", [0, 1, 1, 2]) == [0, 1, 2]
    assert table.lock("g", "b", "t", [1, 2, 3]) == [3]
    assert table.lock("other", "b", "t", [1]) == [1]  # another group is independent
    assert table.lock("g", "b", "u", [1]) == [1]  # and so is another topic
    now[0] = 50_000
    assert table.lock("g", "a", "t", [0, 1]) == [0, 1]  # renewed until 110 s
    now[0] = 60_001  # queue 2 was not renewed: expired, b takes it
    assert table.lock("g", "b", "t", [0, 1, 2]) == [2]
    assert table.lock("g", "a", "t", [2]) == []
    now[0] = 110_001  # only b's t/2 (granted at 60_001) still lives
    assert len(table) == 1
    assert table.purge_expired() == 5
    assert table.lock("g", "a", "t", [0, 1, 2, 3]) == [0, 1, 3]


def test_unlock_and_drop_client_release_only_own_locks() -> None:
    table = QueueLockTable(expiry_ms=60_000, clock_ms=lambda: 0.0)
    table.lock("g", "a", "t", [0, 1])
    table.lock("g", "b", "t", [2])
    assert table.unlock("g", "b", "t", [0, 1, 2]) == 1  # b holds only 2
    assert table.lock("g", "b", "t", [0, 1, 2]) == [2]
    assert table.drop_client("g", "a") == 2
    assert table.lock("g", "b", "t", [0, 1]) == [0, 1]
    assert table.drop_client("g", "nobody") == 0


def test_the_table_is_bounded() -> None:
    now = [0.0]
    table = QueueLockTable(expiry_ms=1000, clock_ms=lambda: now[0], max_locks=4)
    assert table.lock("g", "a", "t", range(4)) == [0, 1, 2, 3]
    with pytest.raises(BusyError):
        table.lock("g", "b", "t", [4])
    assert table.lock("g", "a", "t", [3]) == [3]  # renewing needs no room
    now[0] = 2000  # all expired: purged to make room
    assert table.lock("g", "b", "t", [4]) == [4] and len(table) == 1


def test_no_lock_is_granted_during_the_grace_after_a_restart() -> None:
    now = [1000.0]
    table = QueueLockTable(expiry_ms=60_000, clock_ms=lambda: now[0])
    table.start_grace(30_000)
    assert table.lock("g", "a", "t", [0]) == []
    now[0] += 29_999
    assert table.lock("g", "a", "t", [0]) == []
    now[0] += 1
    assert table.lock("g", "a", "t", [0]) == [0]


def test_a_member_leaving_its_group_drops_its_locks() -> None:
    now = [0.0]
    consumers = ConsumerManager(expiry_ms=30_000, clock_ms=lambda: now[0])
    table = QueueLockTable(expiry_ms=60_000, clock_ms=lambda: now[0])
    consumers.on_leave.append(table.drop_client)
    consumers.heartbeat("a", "g", frozenset({"t"}), "clustering")
    consumers.heartbeat("b", "g", frozenset({"t"}), "clustering")
    table.lock("g", "a", "t", [0])
    table.lock("g", "b", "t", [1])
    consumers.unregister("a", "g")
    assert table.lock("g", "c", "t", [0, 1]) == [0]  # a's went, b's stays
    table.unlock("g", "c", "t", [0])
    now[0] = 31_000  # b's heartbeat expired, its lock has not
    assert consumers.members("g") == []
    assert table.lock("g", "c", "t", [1]) == [1]
