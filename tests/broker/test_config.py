"""Command-line flags win over FERRY_BROKER_* variables."""
from __future__ import annotations

import pytest
from ferry_broker.__main__ import parse_args


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_BROKER_PORT", "1111")
    monkeypatch.setenv("FERRY_BROKER_NAME", "from-env")
    monkeypatch.setenv("FERRY_BROKER_AUTO_CREATE_TOPICS", "true")
    cfg = parse_args(["--port", "2222", "--no-auto-create-topics", "--flush-mode", "sync"])
    assert (cfg.port, cfg.name, cfg.auto_create_topics, cfg.flush_mode) == (
        2222, "from-env", False, "sync")
    assert parse_args([]).port == 1111


def test_bad_values_exit_with_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_BROKER_DEFAULT_QUEUES", "0")
    with pytest.raises(SystemExit) as exc:
        parse_args([])
    assert exc.value.code == 2
