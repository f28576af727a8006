"""Message ids: 16 bytes, unique per process, never the all-zero "none"."""
from __future__ import annotations

import os

from ferry.codec.limits import MSG_ID_BYTES
from ferry.codec.msg_id import NO_MSG_ID, msg_id_hex, new_msg_id


def test_unique_16_bytes_and_never_none() -> None:
    ids = {new_msg_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(len(i) == MSG_ID_BYTES == 16 for i in ids)
    assert NO_MSG_ID not in ids and NO_MSG_ID == bytes(16)


def test_ids_count_up_within_a_process() -> None:
    a, b = new_msg_id(), new_msg_id()
    assert a[:8] == b[:8] and int.from_bytes(b[8:], "big") == int.from_bytes(a[8:], "big") + 1


def test_hex_form() -> None:
    assert msg_id_hex(bytes(range(16))) == "000102030405060708090A0B0C0D0E0F"


def test_a_forked_child_gets_its_own_prefix() -> None:
    parent = new_msg_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        os.write(write, new_msg_id())
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child[:8] != parent[:8]
