"""The `python -m ferry_<service>` entry every service shares: flags, config, logging, run.

A service's `__main__` declares one `Entry`: its program name, description,
flags as (flag, config field, type, help), its config's `from_env` and its app
class. `Entry.parse` turns the flags into overrides of the config's
environment variables (a bad value exits with argparse's usage message and
status 2, never a traceback; a `bool` flag is `--x/--no-x`); `Entry.main` sets
up logging, imports and runs the app until it is signalled, and turns a crash
into exit status 1 with the traceback logged.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ferry.env import parse_bool
from ferry.telemetry.logs import setup_logging

C = TypeVar("C")
# flag -> (config field, type, help)
Flag = tuple[str, str, Callable[[str], Any], str]


@dataclass(frozen=True)
class Entry:
    """How one service starts from the command line (`python -m ferry_<service>`)."""

    prog: str                       # "ferry-txn-checker"
    description: str                # the --help text
    flags: Sequence[Flag]
    from_env: Callable[..., Any]    # the config's from_env(overrides=...)
    app: str                        # "ferry_txn_checker.app:CheckerApp": App(config).run()
    what: str                       # "txn-checker" in "txn-checker failed"
    uvloop: bool = False            # on uvloop's loop when installed (the broker)
    #: Run once logging is set up, before the app is imported (the broker's fd limit).
    prepare: Callable[[], None] | None = None

    def parse(self, argv: list[str] | None) -> Any:
        """The config from the environment, `argv`'s flags winning."""
        return parse_config(argv, self.prog, self.description, self.flags, self.from_env)

    def main(self, argv: list[str] | None = None) -> int:
        """Parse, set up logging, run the app until signalled: the process's exit status."""
        config = self.parse(argv)
        module, _, name = self.app.partition(":")

        async def run() -> None:
            # Imported here, after logging is set up: module-level loggers see it.
            app = getattr(importlib.import_module(module), name)(config)
            await app.run()

        return run_app(config.log_level, run, module.partition(".")[0], self.what,
                       self.uvloop, self.prepare)


def parse_config(argv: list[str] | None, prog: str, description: str, flags: Sequence[Flag],
                 from_env: Callable[..., C]) -> C:
    """The config built by `from_env(overrides=...)` from the environment and `argv`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for flag, dest, typ, help_text in flags:
        if typ is bool:
            parser.add_argument(flag, dest=dest, default=None, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, dest=dest, type=typ, default=None, help=help_text)
    args = parser.parse_args(argv)
    overrides: Mapping[str, Any] = vars(args)
    try:
        return from_env(overrides=overrides)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def bool_value(raw: str) -> bool:
    """The type of a flag that takes true/false as its value (`--auto-create-topics false`)."""
    try:
        return parse_bool(raw, "the value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_app(log_level: str, run: Callable[[], Coroutine[Any, Any, None]], logger: str,
            what: str, uvloop: bool = False, prepare: Callable[[], None] | None = None) -> int:
    """Set up logging, then run `run()`; 0 on a clean stop, 1 with the traceback logged as
    "`what` failed" on a crash."""
    setup_logging(log_level)
    if prepare is not None:
        prepare()
    try:
        _run(run(), uvloop)
    except Exception:
        logging.getLogger(logger).exception("%s failed", what)
        return 1
    return 0


def _run(coro: Coroutine[Any, Any, None], uvloop: bool) -> None:
    if uvloop:
        try:
            import uvloop as loop
        except ImportError:  # optional: the standard loop works, only slower
            pass
        else:
            loop.run(coro)
            return
    asyncio.run(coro)
