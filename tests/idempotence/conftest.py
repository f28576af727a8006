"""Fixtures for ferry.idempotence: a RedisClaim on the session Redis under a prefix of its own."""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import pytest
from ferry.client.message import ConsumerRecord
from ferry.idempotence import RedisClaim

from tests.support.procs import Redis


@dataclass(frozen=True)
class FakeRecord:
    """The two fields a claim reads from a consumed message."""

    msg_id: str
    key: str | None = None


def record(key: str | None = None, msg_id: str | None = None) -> ConsumerRecord:
    """A stand-in for a consumed message (key and message id only)."""
    return cast(ConsumerRecord, FakeRecord(msg_id or uuid.uuid4().hex.upper(), key))


def unique_prefix() -> str:
    """A claim key prefix no other test uses, so tests share the session Redis safely."""
    return f"ferry:idem-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def claim(redis_server: Redis) -> AsyncIterator[RedisClaim]:
    async with RedisClaim(redis_server.url, lease_ms=5_000, key_prefix=unique_prefix()) as c:
        yield c
