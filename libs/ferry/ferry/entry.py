"""The `python -m ferry_<service>` entry every small service shares: flags, config, run.

A service lists its flags as (flag, config field, type, help); `parse_config`
turns them into overrides of the config's environment variables (a bad value
exits with argparse's usage message, never a traceback), and `run_app` sets
up logging, runs the app until it is signalled, and turns a crash into exit
status 1 with the traceback logged.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from ferry.telemetry.logs import setup_logging

C = TypeVar("C")
# flag -> (config field, type, help)
Flag = tuple[str, str, type, str]


def parse_config(argv: list[str] | None, prog: str, description: str, flags: Sequence[Flag],
                 from_env: Callable[..., C]) -> C:
    """The config built by `from_env(overrides=...)` from the environment and `argv`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for flag, dest, typ, help_text in flags:
        parser.add_argument(flag, dest=dest, type=typ, default=None, help=help_text)
    args = parser.parse_args(argv)
    overrides: Mapping[str, Any] = vars(args)
    try:
        return from_env(overrides=overrides)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def run_app(log_level: str, run: Callable[[], Coroutine[Any, Any, None]], logger: str,
            what: str) -> int:
    """Set up logging, then run `run()` (importing the app inside it, after logging is set
    up); 0 on a clean stop, 1 with the traceback logged as "`what` failed" on a crash."""
    setup_logging(log_level)
    try:
        asyncio.run(run())
    except Exception:
        logging.getLogger(logger).exception("%s failed", what)
        return 1
    return 0
