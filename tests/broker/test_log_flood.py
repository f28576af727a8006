"""A client's flood of failing requests writes a bounded number of broker log lines."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ferry.errors import InvalidNameError, error_for_code
from ferry.wire import RequestCode

from tests.broker.conftest import start_broker

pytestmark = pytest.mark.integration


async def test_failed_requests_are_logged_at_most_a_burst_per_kind(tmp_path: Path) -> None:
    b = start_broker(tmp_path, None)
    try:
        c = await b.client()
        fields = {"group": "g", "topic": "bad name!", "queue_id": 0, "offset": 0,
                  "max_count": 1, "max_wait_ms": 0}
        answers = await asyncio.gather(*(c.request(RequestCode.PULL, fields)
                                         for _ in range(3000)))
        assert all(isinstance(error_for_code(a.error, a.message), InvalidNameError)
                   for a in answers)
        await c.close()
        log = b.proc.log()
        assert 1 <= log.count('"request failed: InvalidNameError') <= 10
    finally:
        b.proc.stop()
