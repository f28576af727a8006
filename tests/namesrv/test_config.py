"""NamesrvConfig: defaults, FERRY_NAMESRV_* variables, flags over variables, bad values."""
from __future__ import annotations

import subprocess
import sys

import pytest
from ferry_namesrv.config import ConfigError, NamesrvConfig


def test_defaults_match_the_contract() -> None:
    cfg = NamesrvConfig.from_env({})
    assert (cfg.host, cfg.port, cfg.etcd, cfg.etcd_prefix) == (
        "127.0.0.1", 9876, "127.0.0.1:2379", "/ferry/")
    assert cfg.auto_create_topics and cfg.default_queues == 8 and cfg.log_level == "INFO"


def test_env_then_overrides() -> None:
    cfg = NamesrvConfig.from_env({
        "FERRY_NAMESRV_PORT": "7000", "FERRY_NAMESRV_AUTO_CREATE_TOPICS": "false",
        "FERRY_NAMESRV_DEFAULT_QUEUES": "16", "FERRY_NAMESRV_LOG_LEVEL": "debug",
        "FERRY_NAMESRV_ETCD": "a:1,b:2", "UNRELATED": "x"})
    assert (cfg.port, cfg.auto_create_topics, cfg.default_queues, cfg.log_level) == (
        7000, False, 16, "DEBUG")
    over = cfg.with_overrides(port=7001, etcd=None)
    assert over.port == 7001 and over.etcd == "a:1,b:2"


@pytest.mark.parametrize(("key", "value"), [
    ("PORT", "x"), ("PORT", "70000"), ("AUTO_CREATE_TOPICS", "maybe"),
    ("DEFAULT_QUEUES", "0"), ("DEFAULT_QUEUES", "2000"), ("ETCD", "nohost"),
    ("ETCD_PREFIX", "ferry"), ("LOG_LEVEL", "LOUD"),
])
def test_bad_values_name_the_setting(key: str, value: str) -> None:
    with pytest.raises(ConfigError):
        NamesrvConfig.from_env({f"FERRY_NAMESRV_{key}": value})


def test_cli_help_and_bad_config_exit_cleanly() -> None:
    out = subprocess.run([sys.executable, "-m", "ferry_namesrv", "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "etcd is the truth" in out.stdout
    assert "--auto-create-topics" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "ferry_namesrv", "--default-queues", "0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "default_queues" in bad.stderr
    assert "Traceback" not in bad.stderr
