"""The scheduler's settings: environment, overrides, refusals with the variable's name."""
from __future__ import annotations

import pytest
from ferry_delay_scheduler.__main__ import parse_args
from ferry_delay_scheduler.config import SchedulerConfig


def test_defaults_run_on_one_machine() -> None:
    cfg = SchedulerConfig.from_env({})
    assert (cfg.http_port, cfg.namesrv, cfg.etcd, cfg.etcd_prefix) == (
        10922, "127.0.0.1:9876", "127.0.0.1:2379", "/ferry/")
    assert cfg.data_dir == "./var/delay-scheduler"


def test_environment_then_overrides() -> None:
    env = {"FERRY_DELAY_SCHEDULER_HTTP_PORT": "1234", "FERRY_DELAY_SCHEDULER_ETCD": "",
           "FERRY_DELAY_SCHEDULER_LOG_LEVEL": "debug"}
    cfg = SchedulerConfig.from_env(env, overrides={"http_port": 99, "host": None})
    assert (cfg.http_port, cfg.etcd, cfg.log_level, cfg.host) == (99, "", "DEBUG", "127.0.0.1")


@pytest.mark.parametrize(("var", "value", "match"), [
    ("FERRY_DELAY_SCHEDULER_HTTP_PORT", "x", "must be a number"),
    ("FERRY_DELAY_SCHEDULER_RETENTION_HOURS", "24", "30-day maximum delay"),
    ("FERRY_DELAY_SCHEDULER_PULL_MAX_COUNT", "5000", "1024"),
    ("FERRY_DELAY_SCHEDULER_DELIVER_BATCH_MESSAGES", "20000", "10000"),
    ("FERRY_DELAY_SCHEDULER_WINDOW_MS", "0", "positive"),
    ("FERRY_DELAY_SCHEDULER_LOG_LEVEL", "LOUD", "log_level"),
])
def test_bad_values_are_refused(var: str, value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SchedulerConfig.from_env({var: value})


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_DELAY_SCHEDULER_HTTP_PORT", raising=False)
    cfg = parse_args(["--http-port", "0", "--etcd", "", "--data-dir", "/tmp/x"])
    assert (cfg.http_port, cfg.etcd, cfg.data_dir) == (0, "", "/tmp/x")
    with pytest.raises(SystemExit):
        parse_args(["--http-port", "70000"])
