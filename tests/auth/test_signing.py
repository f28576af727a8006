"""Wire signatures: the documented string to sign, verification and every refusal."""
from __future__ import annotations

import hashlib

import msgpack
import pytest
from blake3 import blake3
from ferry.auth.credentials import Credentials
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import (
    canonical_query,
    check_wire,
    sign_wire,
    string_to_sign_http,
    string_to_sign_wire,
)
from ferry.errors import AuthenticationError

CREDS = Credentials("alice", "alice-secret-0123456789")
KEYS = {CREDS.access_key: CREDS.signing_key}
FIELDS = {"topic": "orders", "queue_id": 3, "msg_id": b"\x01" * 16}
BODY = b"batch bytes"
TARGET = "DefaultCluster/broker-a/0"


def lookup(access_key: str) -> bytes | None:
    return KEYS.get(access_key)


def test_string_to_sign_is_the_documented_bytes() -> None:
    nonce = bytes(range(16))
    data = string_to_sign_wire(TARGET, "alice", 1700000000123, nonce, 10, FIELDS, BODY)
    fields_hash = hashlib.sha256(msgpack.packb(FIELDS, use_bin_type=True)).hexdigest()
    assert data == (b"FERRY2-WIRE\nDefaultCluster/broker-a/0\nalice\n1700000000123\n"
                    b"000102030405060708090a0b0c0d0e0f\n10\n"
                    + fields_hash.encode() + b"\n" + blake3(BODY).hexdigest().encode())


def test_a_signed_request_checks_and_its_nonce_is_the_callers_to_remember() -> None:
    guard = ReplayGuard()
    auth = sign_wire(CREDS, TARGET, 10, FIELDS, BODY)
    assert set(auth) == {"k", "t", "n", "s"}
    parts = check_wire(auth, TARGET, 10, FIELDS, BODY, lookup, guard)
    assert parts.access_key == "alice" and len(guard) == 0   # checking stores nothing
    guard.remember(parts.access_key, parts.ts_ms, parts.nonce)
    check_wire(auth, TARGET, 10, FIELDS, BODY, lookup, guard)   # still authentic ...
    with pytest.raises(AuthenticationError, match="replayed"):  # ... but used
        guard.remember(parts.access_key, parts.ts_ms, parts.nonce)


def test_a_decoded_header_verifies_like_the_sent_one() -> None:
    guard = ReplayGuard()
    auth = sign_wire(CREDS, TARGET, 10, FIELDS, BODY)
    header = msgpack.unpackb(msgpack.packb({"x": FIELDS, "a": auth}))
    assert check_wire(header["a"], TARGET, 10, header["x"], memoryview(BODY), lookup,
                      guard).access_key == "alice"


@pytest.mark.parametrize("change", ["target", "code", "fields", "body", "secret"])
def test_any_change_breaks_the_signature(change: str) -> None:
    guard = ReplayGuard()
    creds = Credentials("alice", "another-secret-9876543") if change == "secret" else CREDS
    auth = sign_wire(creds, TARGET, 10, FIELDS, BODY)
    target = "DefaultCluster/broker-b/0" if change == "target" else TARGET
    code = 11 if change == "code" else 10
    fields = dict(FIELDS, queue_id=4) if change == "fields" else FIELDS
    body = b"other" if change == "body" else BODY
    with pytest.raises(AuthenticationError, match="bad signature"):
        check_wire(auth, target, code, fields, body, lookup, guard)


def test_a_master_and_its_slave_are_different_targets() -> None:
    guard = ReplayGuard()
    auth = sign_wire(CREDS, "c/broker-a/0", 10, FIELDS, BODY)
    with pytest.raises(AuthenticationError, match="bad signature"):
        check_wire(auth, "c/broker-a/1", 10, FIELDS, BODY, lookup, guard)


@pytest.mark.parametrize("auth, message", [
    (None, "authentication required"),
    ([1, 2], "must be a map"),
    ({"k": "alice", "t": 1, "n": b"x" * 16}, "'s' must be"),
    ({"k": "a b", "t": 1, "n": b"x" * 16, "s": b"y" * 32}, "'k' must be"),
    ({"k": "alice", "t": "1", "n": b"x" * 16, "s": b"y" * 32}, "'t' must be"),
    ({"k": "alice", "t": 1, "n": b"x" * 15, "s": b"y" * 32}, "'n' must be"),
    ({"k": "mallory", "t": 1, "n": b"x" * 16, "s": b"y" * 32}, "unknown or disabled"),
])
def test_malformed_or_unknown_is_refused(auth: object, message: str) -> None:
    with pytest.raises(AuthenticationError, match=message):
        check_wire(auth, TARGET, 10, FIELDS, BODY, lookup, ReplayGuard())


def test_stale_is_refused_before_hashing() -> None:
    auth = sign_wire(CREDS, TARGET, 10, FIELDS, BODY, ts_ms=1_000)
    with pytest.raises(AuthenticationError, match="stale"):
        check_wire(auth, TARGET, 10, FIELDS, BODY, lookup, ReplayGuard())


def test_signed_before_the_guard_started_is_refused() -> None:
    """A request made before a restart is not accepted after it (its nonce is forgotten)."""
    auth = sign_wire(CREDS, TARGET, 10, FIELDS, BODY)
    guard = ReplayGuard(clock=lambda: auth["t"] + 1)
    with pytest.raises(AuthenticationError, match="before this server started"):
        check_wire(auth, TARGET, 10, FIELDS, BODY, lookup, guard)


def test_http_string_to_sign() -> None:
    assert canonical_query([("b", "2 3"), ("a", "é"), ("a", "1")]) == b"a=%C3%A9&a=1&b=2%203"
    data = string_to_sign_http("namesrv/h:9876", "alice", 5, "ab" * 16, "post", "/v1/topics",
                               [("x", "1")], b"{}")
    assert data == (b"FERRY2-HTTP\nnamesrv/h:9876\nalice\n5\n" + b"ab" * 16
                    + b"\nPOST\n/v1/topics\nx=1\n" + hashlib.sha256(b"{}").hexdigest().encode())
