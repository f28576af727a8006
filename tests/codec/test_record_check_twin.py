"""The record check's twins (mypyc's, and the native one for a plain read's check) accept,
return and refuse what the pure check does: the same headers and StoredMessages for good
records, the same error, word for word, for bad ones (a flipped byte, a cut, a wrong magic,
size or part length, text not UTF-8)."""
from __future__ import annotations

import importlib
from typing import Any

import pytest
from crc32c import crc32c
from ferry import extensions
from ferry.codec.record import (
    AT_CRC,
    CRC_START,
    H_PROPS_LEN,
    H_TOPIC_LEN,
    HEADER,
    HEADER_SIZE,
    SIZE_MAGIC_CRC,
    U32,
    MessageIn,
    encode_record,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twins import compiled_twin, native_twin

PURE = "ferry.codec.record_check"
texts = st.text(st.characters(codec="utf-8"), max_size=8)
messages = st.lists(st.builds(
    MessageIn, topic=st.sampled_from(["orders", "t", "é-topic"]), queue_id=st.integers(0, 7),
    body=st.binary(max_size=200), tags=texts, keys=texts, properties=st.binary(max_size=30),
    msg_id=st.binary(min_size=16, max_size=16), flags=st.integers(0, 2**32 - 1),
    born_ts_ms=st.integers(-(2**63), 2**63 - 1), born_host=st.sampled_from(["", "h:1"]),
    reconsume_times=st.integers(0, 16), prepared_offset=st.integers(0, 2**40),
), min_size=1, max_size=8)
# What is done to the records before they are checked: the kind, and where (a fraction).
damages = st.tuples(st.sampled_from(["none", "none", "flip", "cut", "magic", "size", "lengths",
                                     "not_utf8", "zero_tail"]), st.floats(0, 1))


def _records(msgs: list[MessageIn], damage: tuple[str, float]) -> bytearray:
    buf = bytearray()
    for n, m in enumerate(msgs):
        buf += encode_record(m, queue_offset=n, phy_offset=len(buf), store_ts_ms=1_700_000_000_000,
                             store_host="s:2")
    kind, where = damage
    at = min(int(where * len(buf)), len(buf) - 1)
    if kind == "flip":
        buf[at] ^= 0x5A
    elif kind == "cut":
        del buf[at:]
    elif kind == "magic":
        buf[4] ^= 1
    elif kind == "size":
        U32.pack_into(buf, 0, int(where * 3 * HEADER_SIZE))
    elif kind in ("lengths", "not_utf8"):  # the first record, its CRC made right again
        if kind == "lengths":
            U32.pack_into(buf, HEADER.size - 8,  # props_len, the second-last field
                          HEADER.unpack_from(buf)[H_PROPS_LEN] + 1)
        elif HEADER.unpack_from(buf)[H_TOPIC_LEN]:
            buf[HEADER_SIZE] = 0xFF
        size = U32.unpack_from(buf)[0]
        U32.pack_into(buf, AT_CRC, crc32c(bytes(buf[CRC_START:size])))
    elif kind == "zero_tail":
        buf += bytes(int(where * 150))
    return buf


def _run(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # the same refusal, word for word
        return (type(exc), str(exc))


def _outcomes(module: Any, buf: bytearray, offsets: list[int]) -> list[Any]:
    view = memoryview(buf)
    got = [_run(module("check_records"), view, 0, len(buf)),
           _run(module("check_records"), view, 0, len(buf), SIZE_MAGIC_CRC)]
    # a plain read's span check (the native twin's own path): from each offset to the end,
    # to a cut end, and past the view's end
    for off in offsets:
        for end in (len(buf), len(buf) - 7, len(buf) + 50):
            got.append(_run(module("check_records"), view, off, end, SIZE_MAGIC_CRC))
    for off in offsets:
        got.append(_run(module("check_record"), bytes(buf), off))
        got.append(_run(module("check_record"), buf, off, len(buf) - 3))
        got.append(_run(module("decode_record"), bytes(buf), off))
        got.append(_run(module("decode_record"), view, off))
    return got


TWINS = {"mypyc": compiled_twin, "native": native_twin}


@pytest.mark.parametrize("kind", sorted(TWINS))
@settings(max_examples=300, deadline=None)
@given(messages, damages, st.lists(st.integers(-2, 2000), max_size=3))
def test_the_twin_checks_and_decodes_what_the_pure_check_does(
        kind: str, msgs: list[MessageIn], damage: tuple[str, float], extra: list[int]) -> None:
    twin = TWINS[kind](PURE)
    buf = _records(msgs, damage)
    # every record's start (as the intact records lie), and some other offsets
    starts, off = [], 0
    for m in msgs:
        starts.append(off)
        off += len(encode_record(m, queue_offset=0, phy_offset=0, store_ts_ms=0,
                                 store_host="s:2"))
    offsets = starts + extra
    assert (_outcomes(lambda name: getattr(twin, name), buf, offsets)
            == _outcomes(lambda name: extensions.pure(PURE, name), buf, offsets))


def test_the_running_check_is_the_selected_module() -> None:
    from ferry.client.core import records
    from ferry.codec import record

    running = extensions.active()[PURE]
    module = importlib.import_module(running)
    # the native twin has its own check_records and passes the mypyc twin's (or the
    # pure) decode_record and check_record on: the names are the running module's
    assert record.decode_record is module.decode_record
    assert record.check_record is module.check_record
    assert record.check_records is module.check_records
    assert records.check_records is module.check_records
    assert record.check_records.__module__ == running
    assert extensions.pure(PURE, "decode_record").__module__ == PURE


@settings(max_examples=150, deadline=None)
@given(messages, damages)
def test_decode_record_refuses_what_check_records_refuses(
        msgs: list[MessageIn], damage: tuple[str, float]) -> None:
    """decode_record does check_records' checks inline (for speed): the same refusal, in
    the pure module and in the twin."""
    buf = bytes(_records(msgs, damage))
    for module in (extensions.pure, lambda m, name: getattr(compiled_twin(m), name)):
        check, decode = module(PURE, "check_records"), module(PURE, "decode_record")
        size = U32.unpack_from(buf)[0] if len(buf) >= 4 else 0
        checked = _run(check, memoryview(buf), 0, min(max(size, HEADER_SIZE), len(buf)))
        decoded = _run(decode, buf)
        if checked == []:  # nothing to check: an empty buffer
            assert decoded[1] == "truncated record header at 0"
        elif isinstance(checked, list):  # passed: decoded, or refused only for its text
            assert type(decoded) is not tuple or "not UTF-8" in decoded[1]
        else:
            assert decoded == checked
