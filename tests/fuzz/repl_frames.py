"""A seeded generator of hostile openings of a replication link (HELLO and AUTH frames).

Each `opening()` is the bytes one peer sends on a fresh connection to a
master's replication port before it half-closes: garbage (random bytes, a
length of 0 or over the limit, an unknown type, a frame other than HELLO
first, a length promising far more than is sent), HELLOs made hostile (bad
magic or version, negative numbers, bad text lengths, epoch entries that do
not fit, another group, the master's own id, an id that is no peer), and
AUTH frames of every wrong kind after a well-formed HELLO: none, random
bytes, an unknown access key, a wrong secret, a stale or future timestamp,
a signature over another HELLO, a valid signature of an identity without
admin `replicate`, a valid replica signature for an id that is no peer, a
replay of an AUTH sent before, and AUTH before HELLO. None of them may be
welcomed: the master answers at most a REFUSE and closes.

Frames are built with the broker's own encoders (`protocol.encode_hello`,
`encode_auth`) and signed with `ferry.auth.signing.sign_repl`, as a slave does:
before issue 24, HELLO then an AUTH signing the HELLO's payload; after it, an
AUTH addressed to the master (`cluster/name/id`) with the HELLO's SHA-256
first, then the HELLO (`AUTH_FIRST`; `auth_out_of_order` sends the other order).
"""
from __future__ import annotations

import hashlib
import inspect
import random
import struct
from collections import Counter
from dataclasses import replace

from ferry.auth.credentials import Credentials
from ferry.auth.signing import SignedParts, mac, sign_repl, string_to_sign_repl
from ferry_broker.replication import protocol as p

OPENING_KINDS = (
    "random_bytes", "zero_length", "oversized_length", "unknown_type", "not_hello_first",
    "promised_length", "bad_magic", "bad_version", "negative_fields", "bad_text",
    "bad_entries", "other_group", "own_id", "not_a_peer", "no_auth", "auth_garbage",
    "auth_unknown_key", "auth_wrong_secret", "auth_stale", "auth_future",
    "auth_other_hello", "auth_without_right", "auth_replica_not_a_peer", "auth_replayed",
    "auth_out_of_order")
#: How far outside the replay window stale and future AUTH frames are.
SKEW_MS = 120_000
#: Broker ids that are no live member of the group under fuzz (it has ids 0 and 1).
STRANGER_IDS = (2, 7, 99, 2**62)
#: Whether AUTH comes first and signs the master and the HELLO's digest (issue 24); the
#: fuzz runs before and after that change. Drop once it is merged.
AUTH_FIRST = "hello_sha256" in inspect.signature(p.encode_auth).parameters


def _join(parts: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(x) for x in parts)


class OpeningFuzzer:
    """Deterministic hostile openings for a master of group `cluster`/`name` (ids 0 and 1)."""

    def __init__(self, seed: int, *, cluster: str, name: str, master_id: int,
                 replica: Credentials, few: Credentials) -> None:
        self.rng = random.Random(seed)
        self.cluster, self.name, self.master_id = cluster, name, master_id
        self.replica, self.few = replica, few
        self.counts: Counter[str] = Counter()
        self._sent_auth: list[bytes] = []   # HELLO + AUTH openings sent before (to replay)

    def hello(self, **change: object) -> p.Hello:
        rng = self.rng
        hello = p.Hello(p.MAGIC, p.VERSION, rng.choice(STRANGER_IDS), rng.randrange(0, 3),
                        rng.randrange(0, 1 << 20), self.cluster, self.name,
                        [(e, e * 1000) for e in range(rng.randrange(0, 4))])
        return replace(hello, **change)  # type: ignore[arg-type]

    def _auth(self, hello_payload: bytes, who: Credentials, *, ts_shift_ms: int = 0) -> bytes:
        """An AUTH frame of `who` for the HELLO whose payload is `hello_payload`."""
        if not AUTH_FIRST:
            signed = sign_repl(who, hello_payload)  # type: ignore[call-arg]
            if ts_shift_ms:  # a valid MAC over a timestamp outside the window
                signed = _resign(who, signed.ts_ms + ts_shift_ms, signed.nonce, hello_payload)
            return _join(p.encode_auth(signed.access_key, signed.ts_ms,  # type: ignore[call-arg]
                                       signed.nonce, signed.signature))
        digest = hashlib.sha256(hello_payload).digest()
        master = p.master_target(self.cluster, self.name, self.master_id)  # type: ignore
        signed = sign_repl(who, master, digest)  # type: ignore[call-arg,arg-type]
        if ts_shift_ms:
            signed = _resign(who, signed.ts_ms + ts_shift_ms, signed.nonce, master, digest)
        return _join(p.encode_auth(signed.access_key, signed.ts_ms, signed.nonce,
                                   signed.signature, digest))  # type: ignore[call-arg]

    def _in_order(self, hello_frame: bytes, auth: bytes) -> bytes:
        """HELLO and AUTH in the order a slave sends them."""
        return auth + hello_frame if AUTH_FIRST else hello_frame + auth

    def opening(self) -> tuple[str, bytes]:
        """(kind, bytes) of one hostile opening."""
        rng = self.rng
        kind = rng.choice(OPENING_KINDS)
        self.counts[kind] += 1
        hello_frame = _join(p.encode_hello(self.hello()))
        payload = hello_frame[p.LENGTH.size + p.TYPE.size:]
        if kind == "random_bytes":
            return kind, rng.randbytes(rng.randrange(1, 3000))
        if kind == "zero_length":
            return kind, p.LENGTH.pack(0) + rng.randbytes(8)
        if kind == "oversized_length":
            return kind, p.LENGTH.pack(rng.randrange(p.MAX_FRAME_BYTES + 1, 2**32)) + b"\x01"
        if kind == "unknown_type":
            return kind, p.LENGTH.pack(5) + bytes([rng.choice([0, 10, 99, 255])]) + b"abcd"
        if kind == "not_hello_first":
            ftype = rng.choice([p.FrameType.ACK, p.FrameType.DATA, p.FrameType.WELCOME,
                                p.FrameType.OFFSETS, p.FrameType.REFUSE])
            return kind, _join(p.frame(ftype, rng.randbytes(rng.randrange(0, 64))))
        if kind == "promised_length":  # says 16 MiB, sends a little, then closes
            return kind, p.LENGTH.pack(p.MAX_FRAME_BYTES) + b"\x01" + payload
        if kind == "bad_magic":
            return kind, _join(p.encode_hello(self.hello(magic=rng.randrange(0, 2**32))))
        if kind == "bad_version":
            return kind, self._signed(self.hello(version=rng.choice([0, 2, 65535])))
        if kind == "negative_fields":
            raw = bytearray(hello_frame)
            struct.pack_into("<q", raw, 5 + rng.choice([6, 14, 22]), -rng.randrange(1, 2**63))
            return kind, bytes(raw)
        if kind == "bad_text":
            raw = bytearray(hello_frame)
            struct.pack_into("<H", raw, 5 + p.HELLO_HEAD.size, rng.choice([1025, 65535, 200]))
            return kind, bytes(raw)
        if kind == "bad_entries":
            return kind, hello_frame + rng.randbytes(rng.randrange(1, 16))  # entries do not fit
        if kind == "other_group":
            return kind, self._signed(self.hello(cluster=rng.choice(["", "Other", "x" * 300]),
                                                 name=rng.choice([self.name, "broker-z"])))
        if kind == "own_id":
            return kind, self._signed(self.hello(broker_id=rng.choice([0, 1])), self.few)
        if kind == "not_a_peer":
            return kind, self._signed(self.hello())
        return kind, self._auth_kind(kind, hello_frame, payload)

    def _auth_kind(self, kind: str, hello_frame: bytes, payload: bytes) -> bytes:
        rng = self.rng
        if kind == "no_auth":
            return hello_frame + rng.choice([b"", _join(p.encode_offset(p.FrameType.ACK, 0))])
        if kind == "auth_garbage":
            return self._in_order(hello_frame, _join(p.frame(
                p.FrameType.AUTH, rng.randbytes(rng.randrange(0, 120)))))
        if kind == "auth_unknown_key":
            return self._in_order(hello_frame, self._auth(payload, Credentials(
                rng.choice(["nobody", "root", "broker-x"]), "some-secret-0123456789")))
        if kind == "auth_wrong_secret":
            return self._in_order(hello_frame, self._auth(payload, Credentials(
                self.replica.access_key, "not-the-secret-0123456789")))
        if kind in ("auth_stale", "auth_future"):
            shift = SKEW_MS + rng.randrange(0, 10**6)
            return self._in_order(hello_frame, self._auth(
                payload, self.replica, ts_shift_ms=-shift if kind == "auth_stale" else shift))
        if kind == "auth_other_hello":
            other = _join(p.encode_hello(self.hello()))[p.LENGTH.size + p.TYPE.size:]
            return self._in_order(hello_frame, self._auth(other, self.replica))
        if kind == "auth_without_right":
            return self._signed_frame(hello_frame, payload, self.few)
        if kind == "auth_replica_not_a_peer":
            return self._signed_frame(hello_frame, payload, self.replica)
        if kind == "auth_replayed" and self._sent_auth:
            return rng.choice(self._sent_auth)
        # auth_out_of_order (or a replay with nothing to replay yet): the other order
        auth = self._auth(payload, self.replica)
        return hello_frame + auth if AUTH_FIRST else auth + hello_frame

    def _signed(self, hello: p.Hello, who: Credentials | None = None) -> bytes:
        frame = _join(p.encode_hello(hello))
        return self._signed_frame(frame, frame[p.LENGTH.size + p.TYPE.size:], who or self.replica)

    def _signed_frame(self, hello_frame: bytes, payload: bytes, who: Credentials) -> bytes:
        data = self._in_order(hello_frame, self._auth(payload, who))
        if len(self._sent_auth) < 64:
            self._sent_auth.append(data)
        else:
            self._sent_auth[self.rng.randrange(64)] = data
        return data


def _resign(who: Credentials, ts_ms: int, nonce: bytes, *signed: object) -> SignedParts:
    """A replica signature at timestamp `ts_ms` (sign_repl always signs now) over what
    `string_to_sign_repl` takes after the nonce."""
    data = string_to_sign_repl(who.access_key, ts_ms, nonce, *signed)  # type: ignore[arg-type]
    return SignedParts(who.access_key, ts_ms, nonce, mac(who.signing_key, data))
