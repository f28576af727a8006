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


def test_the_broker_raises_its_open_files_limit_to_the_hard_limit() -> None:
    import resource
    import subprocess
    import sys

    code = ("import resource; from ferry_broker.__main__ import raise_fd_limit; "
            "raise_fd_limit(); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    out = subprocess.run([sys.executable, "-c", code], preexec_fn=lower,
                         capture_output=True, text=True, check=True).stdout
    expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert int(out) == expected
