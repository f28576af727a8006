"""LogLimiter: at most a burst per key and a total per window, then one summary."""
from __future__ import annotations

import logging

import pytest
from ferry.log_limit import OTHER, LogLimiter


def _limiter(now: list[float], **kw: int | float) -> LogLimiter:
    return LogLimiter(logging.getLogger("test.log_limit"), clock=lambda: now[0],
                      **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.log_limit")


def test_burst_then_suppressed_then_summary(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lim = _limiter(now, burst=3, interval_s=60.0)
    written = [lim.info("auth", "refused %d", i) for i in range(1000)]
    assert written[:3] == [True] * 3 and not any(written[3:])
    assert len(caplog.records) == 3 and lim.suppressed == 997
    now[0] = 59.9
    assert not lim.warning("auth", "still refused")
    now[0] = 60.0
    assert lim.info("auth", "refused again")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[3] == "suppressed 998 similar lines in the last 60 s"
    assert caplog.records[3].suppressed_by_key == {"auth": 998}  # type: ignore[attr-defined]
    assert caplog.records[3].levelno == logging.WARNING  # the highest suppressed level
    assert msgs[4] == "refused again" and len(msgs) == 5
    assert caplog.records[0].filename == "test_log_limit.py"  # the caller, not the helper


def test_no_summary_when_nothing_was_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lim = _limiter(now, burst=3)
    lim.info("k", "one")
    now[0] = 100.0
    lim.info("k", "two")
    assert [r.getMessage() for r in caplog.records] == ["one", "two"]


def test_keys_are_limited_apart(caplog: pytest.LogCaptureFixture) -> None:
    lim = _limiter([0.0], burst=1)
    for _ in range(10):
        lim.info("a", "a")
        lim.info("b", "b")
    assert [r.getMessage() for r in caplog.records] == ["a", "b"]


def test_the_total_bounds_a_flood_over_many_keys(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lim = _limiter(now, burst=5, total=20)
    for i in range(10_000):
        lim.info(f"path-{i}", "x")
    assert len(caplog.records) == 20
    now[0] = 61.0
    lim.info("later", "y")
    summary = caplog.records[20]
    assert summary.suppressed == 9980  # type: ignore[attr-defined]
    assert len(summary.suppressed_by_key) == 10  # type: ignore[attr-defined]


def test_keys_beyond_max_keys_share_one(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lim = _limiter(now, burst=5, total=100, max_keys=8)
    for i in range(1000):
        lim.info(f"path-{i}", "x")
    assert len(caplog.records) == 8 + 5  # one for each of 8 keys, a burst for the rest
    now[0] = 61.0
    lim.info("later", "y")
    assert caplog.records[13].suppressed_by_key == {OTHER: 987}  # type: ignore[attr-defined]


def test_disabled_level_costs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="test.log_limit")
    lim = _limiter([0.0], burst=1)
    assert not lim.info("k", "x") and lim.suppressed == 0
    assert lim.warning("k", "y")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LogLimiter(logging.getLogger("x"), burst=0)
    with pytest.raises(ValueError):
        LogLimiter(logging.getLogger("x"), interval_s=0)
