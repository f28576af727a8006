"""The fence: a leader acts only within 2/3 of the TTL after its last lease refresh was sent."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ferry_delay_scheduler import leader
from ferry_delay_scheduler.app import SchedulerApp
from ferry_delay_scheduler.leader import LeaderElection

from tests.delay_scheduler.fake_mesh import FakeBroker, FakeNamesrv
from tests.delay_scheduler.test_app import _config, _until, broker, namesrv  # noqa: F401


def test_leads_only_until_two_thirds_of_the_ttl_after_the_refresh_was_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    e = LeaderElection("127.0.0.1:1", "/fence/", "a", "127.0.0.1:2", ttl_s=3)
    e.is_leader, e._last_refresh, e._lease_id = True, 100.0, 7
    monkeypatch.setattr(leader.time, "monotonic", lambda: 101.99)
    assert e.leads()
    monkeypatch.setattr(leader.time, "monotonic", lambda: 102.01)
    assert not e.leads()
    # It stepped down and let its lease go: the key expires for the next term.
    assert not e.is_leader and e._lease_id is None


async def test_a_fenced_leader_takes_and_delivers_nothing(
        tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:  # noqa: F811
    app = SchedulerApp(_config(tmp_path, namesrv))
    fenced = [True]
    app.leads = lambda: not fenced[0]  # type: ignore[method-assign]
    await app.start()
    try:
        broker.schedule("fenced", b"m", int(time.time() * 1000) + 100)
        await asyncio.sleep(1.0)
        assert broker.delivered("fenced") == [] and app.stats.taken == 0
        fenced[0] = False
        await _until(lambda: len(broker.delivered("fenced")) == 1)
    finally:
        await app.stop()
