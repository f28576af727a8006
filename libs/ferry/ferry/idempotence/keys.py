"""Business keys and the Redis key names of claims.

A message's business key (`biz_key_of`) is what "the same message" means to an
idempotent consumer: the message key when the producer set one (an order id, a
payment id: a resend of the same business event carries it again), else the
message id (a redelivery of the very same stored message). Both checks of
`ferry.idempotence` key on (scene, business key); a scene names one use of a
message (one consumer's business action), so two scenes can each act on it once.
"""
from __future__ import annotations

import hashlib
import re
from typing import Protocol

from ferry.errors import FerryError

# A scene is part of a Redis key and a ledger column: short and plain.
MAX_SCENE_CHARS = 64
_SCENE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
# Longer business keys are hashed so a key name stays bounded (Redis keys up to
# 512 MB are legal, but every claim costs its key's bytes in memory).
MAX_BIZ_KEY_CHARS = 200
HASHED_PREFIX = "sha256:"
DEFAULT_KEY_PREFIX = "ferry:idem"


class _Keyed(Protocol):
    @property
    def key(self) -> str | None: ...

    @property
    def msg_id(self) -> str: ...


def biz_key_of(record: _Keyed) -> str:
    """The business key of a consumed message: its key if it has one, else its message id."""
    return record.key or record.msg_id


def validate_scene(scene: str) -> str:
    """`scene` if it is 1..64 of [A-Za-z0-9_.-] starting with a letter or digit; else FerryError."""
    if (not isinstance(scene, str) or len(scene) > MAX_SCENE_CHARS
            or _SCENE_RE.fullmatch(scene) is None):
        raise FerryError(f"bad idempotence scene {scene!r}: 1..{MAX_SCENE_CHARS} characters "
                         "of letters, digits, '_', '.', '-', starting with a letter or digit")
    return scene


def bounded_biz_key(biz_key: str) -> str:
    """`biz_key` itself, or `sha256:<hex>` of it when too long, hash-like or holding a NUL."""
    if not isinstance(biz_key, str) or not biz_key:
        raise FerryError(f"bad business key {biz_key!r}: a non-empty string")
    if (len(biz_key) <= MAX_BIZ_KEY_CHARS and not biz_key.startswith(HASHED_PREFIX)
            and "\0" not in biz_key):
        return biz_key
    # A key that already looks hashed is hashed too, so no raw key collides with a hash;
    # so is one with a NUL (the claim scripts take a batch's keys NUL-separated).
    return HASHED_PREFIX + hashlib.sha256(biz_key.encode()).hexdigest()


def claim_key(scene: str, biz_key: str, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The Redis key of one claim: `{prefix}:{scene}:{biz_key}` (`ferry:idem:pay:order-17`)."""
    return f"{prefix}:{validate_scene(scene)}:{bounded_biz_key(biz_key)}"
