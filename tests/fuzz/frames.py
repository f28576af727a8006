"""A seeded generator of hostile Ferry wire frames, for the fuzz tests.

Two families:

- `pipelined(n)`: frames the broker must answer and keep the connection for:
  unknown codes, every request code with random fields, templates of real
  requests with one or two fields made hostile (wrong types, negative or
  huge numbers, invalid or reserved names, garbage bodies), unknown header
  keys, one-way requests and stray response frames (no answer for those two).
- `closing()`: a byte string that ends the connection: a frame over the size
  limit, a header longer than its frame or over 64 KiB, a header that is not
  msgpack or not a map, a wrong protocol version, missing or mistyped header
  keys, a request id beyond u32, random bytes, or a truncated frame.

Generation is deterministic for a seed, so a failure is reproduced by its seed.
"""
from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack
from ferry.store import encode_properties
from ferry.wire import RequestCode, WireMessage, encode_messages
from ferry.wire.codes import MAX_FRAME_BYTES, MAX_HEADER_BYTES, PROTOCOL_VERSION

from tests.fuzz.auth_frames import AuthMix

PREFIX = struct.Struct("<II")
RESPONSE, ONEWAY = 1, 2
CODES = [int(c) for c in RequestCode]
#: Codes no request has (checked against CODES: a new code leaves the list by itself).
UNKNOWN_CODES = [c for c in (0, 1, 2, 9, 23, 29, 34, 99, 255, 2**31) if c not in CODES]
#: Every kind `pipelined` and `closing` tally in `FrameFuzzer.counts`.
PIPELINED_KINDS = ("unknown_code", "random_fields", "hostile_fields", "oneway", "stray_response")
CLOSING_KINDS = ("oversized", "header_over_frame", "header_over_limit", "not_msgpack",
                 "not_a_map", "wrong_version", "missing_keys", "bad_request_id", "bad_x",
                 "bad_e_m", "random_bytes", "truncated", "short_frame")
#: A few names so that valid-shaped requests reuse state instead of growing it.
TOPICS = ["fuzz-a", "fuzz-b", "%RETRY%fuzz", "%DLQ%fuzz", "%SCHEDULE%", "%HALF%", "bad name",
          "", "x" * 200, "%TRACE%"]
GROUPS = ["fg-a", "fg-b", "%SYS%", "bad group", ""]
CLIENTS = ["c-1", "c-2", ""]


def _hostile_int(rng: random.Random) -> Any:
    return rng.choice([-1, 0, 1, 2**31, 2**32, 2**63 - 1, -(2**63), 1023, 1024, 10**9,
                       rng.randrange(-1000, 100_000)])


def _any_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(11 if depth < 2 else 8)
    if kind == 0:
        return _hostile_int(rng)
    if kind == 1:
        return rng.choice(TOPICS + GROUPS)
    if kind == 2:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == 3:
        return None
    if kind == 4:
        return rng.choice([True, False])
    if kind == 5:
        return rng.choice([0.5, -1e300, float("inf"), float("nan")])
    if kind == 6:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(0, 12)))
    if kind == 7:
        return rng.randrange(0, 64)
    if kind == 8:
        return [_any_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if kind == 9:
        return {str(_any_value(rng, depth + 1))[:8]: _any_value(rng, depth + 1)
                for _ in range(rng.randrange(0, 4))}
    return [rng.randrange(0, 1024) for _ in range(rng.randrange(0, 40))]


def _templates(rng: random.Random) -> dict[int, Callable[[], dict[str, Any]]]:
    """Plausible fields per request code (names of docs/protocol.md), from small pools."""
    def topic() -> str:
        return rng.choice(TOPICS[:2]) if rng.random() < 0.7 else rng.choice(TOPICS)

    def group() -> str:
        return rng.choice(GROUPS[:2]) if rng.random() < 0.7 else rng.choice(GROUPS)

    def q() -> int:
        return rng.randrange(0, 8)

    identify = getattr(RequestCode, "IDENTIFY", None)   # issue 24: asks the broker's target
    return {
        **({identify: dict} if identify is not None else {}),   # no fields: any are ignored
        RequestCode.SEND: lambda: {"topic": topic(), "queue_id": q()},
        RequestCode.PULL: lambda: {"group": group(), "topic": topic(), "queue_id": q(),
                                   "offset": rng.randrange(0, 50), "max_count": 8,
                                   "max_bytes": 4096, "max_wait_ms": rng.choice([0, 0, 0, 50]),
                                   "tags": rng.choice([None, ["a", "b"], "*"]),
                                   "sql": rng.choice([None, None, "a > 1", "((((", "a IN (1,"])},
        RequestCode.COMMIT_OFFSET: lambda: {"group": group(), "topic": topic(), "queue_id": q(),
                                            "offset": rng.randrange(0, 50)},
        RequestCode.QUERY_OFFSET: lambda: {"group": group(), "topic": topic(), "queue_id": q()},
        RequestCode.GET_MIN_MAX: lambda: {"topic": topic(), "queue_id": q()},
        RequestCode.OFFSET_FOR_TIME: lambda: {"topic": topic(), "queue_id": q(),
                                              "ts_ms": _hostile_int(rng)},
        RequestCode.QUERY_BY_ID: lambda: {"msg_id": rng.randbytes(16)},
        RequestCode.QUERY_BY_KEY: lambda: {"topic": topic(), "key": "k", "max_count": 4},
        RequestCode.HEARTBEAT: lambda: {"client_id": rng.choice(CLIENTS), "group": group(),
                                        "topics": [topic()], "mode": "clustering"},
        RequestCode.UNREGISTER: lambda: {"client_id": rng.choice(CLIENTS), "group": group()},
        RequestCode.GET_CONSUMERS: lambda: {"group": group()},
        RequestCode.SEND_BACK: lambda: {"group": group(), "topic": topic(),
                                        "reconsume_times": 1, "delay_ms": 0,
                                        "max_reconsume_times": 3},
        RequestCode.DELIVER_DUE: lambda: {},
        RequestCode.END_TRANSACTION: lambda: {"group": group(), "msg_id": rng.randbytes(16),
                                              "action": rng.choice(["commit", "rollback", "x"]),
                                              "from_check": False},
        RequestCode.CHECK_TRANSACTION: lambda: {"group": group(), "msg_id": rng.randbytes(16)},
        RequestCode.LOCK: lambda: {"group": group(), "client_id": rng.choice(CLIENTS),
                                   "topic": topic(), "queue_ids": [q()]},
        RequestCode.UNLOCK: lambda: {"group": group(), "client_id": rng.choice(CLIENTS),
                                     "topic": topic(), "queue_ids": [q()]},
    }


class FrameFuzzer:
    """Deterministic hostile frames; `counts` tallies what was generated, by kind."""

    def __init__(self, seed: int, *, auth: Callable[[random.Random], AuthMix] | None = None
                 ) -> None:
        self.rng = random.Random(seed)
        # Against a broker with auth on: how each frame is signed (or not), and what was sent.
        self.auth = auth(self.rng) if auth is not None else None
        self.templates = _templates(self.rng)
        self.counts: dict[str, int] = {}
        self.code_counts: dict[int, int] = {}  # request codes given fields (all but unknown)
        self._id = 0
        self._send_bodies = [self._send_body(i) for i in range(32)]

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _send_body(self, i: int) -> bytes:
        rng = self.rng
        props = {"k" * rng.randrange(1, 50): "v" * rng.randrange(0, 300)} if i % 3 else {}
        msg = WireMessage(body=rng.randbytes(rng.randrange(0, 64)), msg_id=rng.randbytes(16),
                          born_ts_ms=_hostile_int(rng) & (2**63 - 1), tags="t" * (i % 5),
                          keys="k", properties=encode_properties(props))
        return encode_messages([msg] * (1 + i % 4))

    def _frame(self, header: dict[str, Any], body: bytes = b"") -> bytes:
        raw = msgpack.packb(header)
        return PREFIX.pack(4 + len(raw) + len(body), len(raw)) + raw + body

    def _header(self, code: int, flags: int, fields: dict[str, Any] | None) -> dict[str, Any]:
        self._id = (self._id + 1) & 0xFFFFFFFF
        header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": self._id, "c": code, "f": flags}
        if fields:
            header["x"] = fields
        return header

    def pipelined(self, n: int) -> tuple[bytes, int]:
        """`n` frames the broker keeps the connection for; and how many it must answer."""
        rng = self.rng
        parts: list[bytes] = []
        answered = 0
        for _ in range(n):
            roll = rng.random()
            flags = 0
            if roll < 0.02:
                flags, kind = ONEWAY, "oneway"
            elif roll < 0.025:
                flags, kind = RESPONSE | rng.randrange(0, 4), "stray_response"
            else:
                answered += 1
                kind = ""
                if self.auth is not None and (replay := self.auth.replay()) is not None:
                    parts.append(self._replay(*replay))
                    continue
            code, fields, body = self._request(kind)
            header = self._header(code, flags, fields)
            if rng.random() < 0.05:  # header keys a request never carries
                header[rng.choice(["e", "m", "zz"] if self.auth else ["e", "m", "zz", "a"])] = \
                    _any_value(rng)
                if rng.random() < 0.3:
                    header.pop("x", None)
                if type(header.get("e", 0)) is not int or type(header.get("m", "")) is not str:
                    header["e"], header["m"] = 0, ""  # those two would close: see closing()
            if self.auth is not None:
                auth = self.auth.sign(self._id, code, header.get("x") or {}, body, not flags)
                if auth is not None:
                    header["a"] = auth
            parts.append(self._frame(header, body))
        return b"".join(parts), answered

    def _replay(self, code: int, fields: dict[str, Any], body: bytes, auth: dict[str, Any],
                original: int) -> bytes:
        """A signed frame sent before, again: the same request and `a`, a new request id."""
        header = self._header(code, 0, fields)
        header["a"] = auth
        assert self.auth is not None
        self.auth.replayed(self._id, code, fields, original)
        return self._frame(header, body)

    def _request(self, kind: str) -> tuple[int, dict[str, Any], bytes]:
        rng = self.rng
        roll = rng.random()
        body = b""
        if roll < 0.15:
            self._count(kind or "unknown_code")
            code = rng.choice(UNKNOWN_CODES + [rng.randrange(100, 2**32)])
            return code, {}, b""
        code = rng.choice(CODES)
        self.code_counts[code] = self.code_counts.get(code, 0) + 1
        if roll < 0.35:
            self._count(kind or "random_fields")
            fields = {rng.choice(["topic", "group", "queue_id", "offset", "x", "msg_id", "key",
                                  "client_id", "queue_ids", "action", "max_wait_ms"]):
                      _any_value(rng) for _ in range(rng.randrange(0, 6))}
        else:
            self._count(kind or "hostile_fields")
            fields = self.templates[code]()
            for _ in range(rng.randrange(0, 3)):
                if fields:
                    fields[rng.choice(list(fields))] = _any_value(rng)
        if code in (RequestCode.SEND, RequestCode.SEND_BACK, RequestCode.DELIVER_DUE):
            choice = rng.random()
            if choice < 0.5:
                body = rng.choice(self._send_bodies)
            elif choice < 0.8:
                body = rng.randbytes(rng.randrange(0, 200))
            else:  # a valid batch with a byte changed
                good = bytearray(rng.choice(self._send_bodies))
                if good:
                    good[rng.randrange(len(good))] ^= 1 << rng.randrange(8)
                body = bytes(good)
        elif rng.random() < 0.05:
            body = rng.randbytes(rng.randrange(0, 100))
        return code, fields, body

    def closing(self) -> tuple[str, bytes]:
        """One byte string that makes the broker close the connection (or ends it truncated)."""
        rng = self.rng
        kind = rng.choice(CLOSING_KINDS)
        self._count("closing_" + kind)
        code = rng.choice(CODES)
        if kind == "oversized":
            data = PREFIX.pack(rng.randrange(MAX_FRAME_BYTES + 1, 2**32), 16) + bytes(16)
        elif kind == "header_over_frame":
            data = PREFIX.pack(20, rng.randrange(17, 2**32)) + bytes(16)
        elif kind == "header_over_limit":
            data = PREFIX.pack(MAX_HEADER_BYTES + 100, MAX_HEADER_BYTES + 1) + bytes(64)
        elif kind == "not_msgpack":
            raw = b"\xc1" + rng.randbytes(rng.randrange(0, 30))
            data = PREFIX.pack(4 + len(raw), len(raw)) + raw
        elif kind == "not_a_map":
            data = self._raw_header(rng.choice([[1, 2, 3], 7, "v", None, b"x"]))
        elif kind == "wrong_version":
            data = self._frame({"v": rng.choice([0, 2, 255, -1, "1", 1.0]), "id": 1, "c": code,
                                "f": 0})
        elif kind == "missing_keys":
            header = {"v": 1, "id": 1, "c": code, "f": 0}
            del header[rng.choice(list(header))]
            data = self._frame(header)
        elif kind == "bad_request_id":
            data = self._frame({"v": 1, "id": rng.choice([-1, 2**32, 2**40]), "c": code, "f": 0})
        elif kind == "bad_x":
            data = self._raw_header({"v": 1, "id": 1, "c": code, "f": 0,
                                     "x": rng.choice([[1], 5, "x", {1: 2}, {b"k": 1}])})
        elif kind == "bad_e_m":
            data = self._frame({"v": 1, "id": 1, "c": code, "f": 0,
                                rng.choice(["e", "m"]): rng.choice([[1], 1.5, b"x", {}])})
        elif kind == "random_bytes":
            data = struct.pack("<I", rng.randrange(0, 1 << 12)) + rng.randbytes(4096)
        elif kind == "short_frame":
            data = PREFIX.pack(rng.randrange(0, 4), 0)
        else:  # truncated: a valid frame cut short; the client then closes
            frame = self._frame(self._header(code, 0, self.templates[code]()))
            data = frame[:rng.randrange(1, len(frame))]
        return kind, data

    def _raw_header(self, header: Any) -> bytes:
        raw = msgpack.packb(header, strict_types=False)
        return PREFIX.pack(4 + len(raw), len(raw)) + raw
