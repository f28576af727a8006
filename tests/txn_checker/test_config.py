"""FERRY_TXN_CHECKER_* variables and their checks."""
from __future__ import annotations

import pytest
from ferry_txn_checker.config import CheckerConfig


def test_defaults_run_on_one_machine() -> None:
    cfg = CheckerConfig.from_env({})
    assert (cfg.http_port, cfg.data_dir, cfg.namesrv, cfg.etcd) == (
        10923, "./var/txn-checker", "127.0.0.1:9876", "127.0.0.1:2379")
    assert (cfg.check_immunity_ms, cfg.check_interval_ms, cfg.max_checks) == (6000, 60_000, 15)
    assert cfg.max_open == 1_000_000


def test_variables_and_overrides() -> None:
    cfg = CheckerConfig.from_env({"FERRY_TXN_CHECKER_MAX_CHECKS": "4",
                                  "FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS": "0",
                                  "FERRY_TXN_CHECKER_LOG_LEVEL": "debug"},
                                 overrides={"http_port": 0, "max_checks": None})
    assert (cfg.max_checks, cfg.check_immunity_ms, cfg.http_port, cfg.log_level) == (
        4, 0, 0, "DEBUG")


@pytest.mark.parametrize(("var", "value", "message"), [
    ("MAX_CHECKS", "zero", "must be a number"),
    ("CHECK_INTERVAL_MS", "0", "must be positive"),
    ("PULL_MAX_COUNT", "5000", "cannot exceed"),
    ("LOG_LEVEL", "LOUD", "log_level"),
])
def test_bad_values_are_refused(var: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckerConfig.from_env({"FERRY_TXN_CHECKER_" + var: value})
