"""The epoch log and divergence_point (issue 9): where two replicas' logs stop agreeing."""
from __future__ import annotations

from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store.epochs import EPOCHS, EpochLog, divergence_point
from hypothesis import given, settings
from hypothesis import strategies as st


def test_entries_survive_a_reopen(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path))
    assert log.entries == [] and log.last is None
    log.append(1, 0)
    log.append(3, 100)
    log.append(4, 250)
    assert EpochLog(str(tmp_path)).entries == [(1, 0), (3, 100), (4, 250)]
    assert log.last == (4, 250)


def test_both_must_increase_and_an_empty_epoch_is_replaced(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path))
    log.append(2, 10)
    for epoch, start in ((2, 20), (1, 20), (3, 5), (-1, 0), (5, -1)):
        with pytest.raises(StoreError):
            log.append(epoch, start)
    log.append(3, 10)  # epoch 2 wrote nothing: 3 takes its place
    assert EpochLog(str(tmp_path)).entries == [(3, 10)]


def test_an_epoch_ends_where_the_next_starts_or_at_the_log_end(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path))
    log.append(1, 0)
    log.append(3, 100)
    log.append(4, 250)
    mine, far = log.entries, 10**9   # a leader whose log goes on far past mine
    assert divergence_point(mine, [(1, 0)], far, 400) == 100
    assert divergence_point(mine, [(1, 0), (2, 90)], far, 400) == 90  # its epoch 1 ends first
    assert divergence_point(mine, [(1, 0), (3, 100)], far, 400) == 250
    assert divergence_point(mine, [(1, 0), (3, 100), (4, 250)], far, 400) == 400
    assert divergence_point(mine, [(1, 0), (3, 100), (4, 250), (9, 300)], far, 400) == 300
    assert divergence_point(mine, [(0, 0)], far, 400) == 0   # no common epoch


def test_truncate_from(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path))
    for e, s in ((1, 0), (3, 100), (4, 250)):
        log.append(e, s)
    log.truncate_from(251)
    assert log.entries == [(1, 0), (3, 100), (4, 250)]
    log.truncate_from(100)
    assert EpochLog(str(tmp_path)).entries == [(1, 0)]
    log.append(5, 120)
    assert EpochLog(str(tmp_path)).entries == [(1, 0), (5, 120)]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "junk"])
def test_a_damaged_file_is_refused_clearly(tmp_path: Path, damage: str) -> None:
    log = EpochLog(str(tmp_path))
    log.append(1, 0)
    log.append(2, 64)
    path = tmp_path / EPOCHS.name
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip":
        data[14] ^= 1
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"epoch 1 at 0\n")
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="epoch file"):
        EpochLog(str(tmp_path))


# -- divergence_point against a model of two replicas' logs -----------------------------

Record = tuple[int, int]  # (epoch that wrote it, its index within that epoch)


def _push(entries: list[tuple[int, int]], epoch: int, start: int) -> None:
    """EpochLog.append's rule: an epoch that wrote nothing is replaced."""
    if entries and entries[-1][1] == start:
        entries.pop()
    entries.append((epoch, start))


def _build(shared: list[tuple[int, int]], ext: int, tail: list[tuple[int, int]]
           ) -> tuple[list[Record], list[tuple[int, int]]]:
    """A replica's records and epoch entries: the shared history (epoch, count), `ext`
    more records of the last shared epoch, then its own epochs."""
    records: list[Record] = []
    entries: list[tuple[int, int]] = []
    for epoch, count in shared:
        _push(entries, epoch, len(records))
        records += [(epoch, i) for i in range(count)]
    if shared:
        last = shared[-1]
        records += [(last[0], last[1] + i) for i in range(ext)]
    for epoch, count in tail:
        _push(entries, epoch, len(records))
        records += [(epoch, i) for i in range(count)]
    return records, entries


def _common_prefix(a: list[Record], b: list[Record]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int,
                                         list[tuple[int, int]], list[tuple[int, int]]]:
    counts = draw(st.lists(st.integers(0, 5), max_size=5))
    shared = [(2 * i, c) for i, c in enumerate(counts)]  # even epochs for the shared past
    nxt = 2 * len(counts) + 1
    # each side's own later terms: distinct epochs (one master per term), interleaved
    tail_epochs = draw(st.lists(st.booleans(), max_size=6))
    mine_tail: list[tuple[int, int]] = []
    leader_tail: list[tuple[int, int]] = []
    for i, to_mine in enumerate(tail_epochs):
        (mine_tail if to_mine else leader_tail).append((nxt + i, draw(st.integers(0, 5))))
    return shared, draw(st.integers(0, 4)), draw(st.integers(0, 4)), mine_tail, leader_tail


@given(_histories())
@settings(max_examples=400, deadline=None)
def test_divergence_point_is_the_common_prefix(history: tuple) -> None:
    shared, my_ext, leader_ext, mine_tail, leader_tail = history
    mine, my_entries = _build(shared, my_ext, mine_tail)
    theirs, leader_entries = _build(shared, leader_ext, leader_tail)
    point = divergence_point(my_entries, leader_entries, len(theirs), len(mine))
    assert point == _common_prefix(mine, theirs)
    assert divergence_point(leader_entries, my_entries, len(mine), len(theirs)) == point


def test_divergence_point_examples() -> None:
    # shared epoch 1; the old master (me) wrote on to 120 in epoch 1 and took epoch 2,
    # the leader's follower had 150 of epoch 1... only the same master's records agree
    assert divergence_point([(0, 0), (1, 100), (2, 120)], [(0, 0), (1, 100), (3, 150)],
                            200, 130) == 120
    assert divergence_point([], [(1, 0)], 50, 0) == 0
    assert divergence_point([(1, 0)], [(1, 0)], 50, 80) == 50
    assert divergence_point([(5, 0)], [(6, 0)], 50, 80) == 0


def test_replace_writes_the_whole_list_at_once_and_refuses_a_disorder(tmp_path: Path) -> None:
    log = EpochLog(str(tmp_path))
    log.append(1, 0)
    log.append(3, 100)
    log.replace([(1, 0), (2, 50), (4, 200)])
    assert EpochLog(str(tmp_path)).entries == [(1, 0), (2, 50), (4, 200)]
    for bad in ([(2, 0), (1, 10)], [(1, 10), (2, 10)], [(-1, 0)]):
        with pytest.raises(StoreError):
            log.replace(bad)
    assert EpochLog(str(tmp_path)).entries == [(1, 0), (2, 50), (4, 200)]
    log.replace([])
    assert EpochLog(str(tmp_path)).entries == []
