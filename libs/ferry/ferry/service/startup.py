"""The `python -m ferry_<service>` entry every service shares: flags, config, logging, run.

A service's `__main__` declares one `Entry`: its program name (which names
its variables: ferry-txn-checker reads FERRY_TXN_CHECKER_*), description,
flags, its config's `from_env` and its app class. `Entry.parse` turns the flags into overrides of the config's
environment variables (a bad value exits with argparse's usage message and
status 2, never a traceback; a `bool` flag is `--x/--no-x`); `Entry.main` sets
up logging, imports and runs the app until it is signalled, and turns a crash
into exit status 1 with the traceback logged.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferry.env import parse_bool
from ferry.telemetry.logs import setup_logging

#: The flags several services share: config field -> (type, help).
COMMON_FLAGS: Mapping[str, tuple[Callable[[str], Any], str]] = {
    "host": (str, "listen address"),
    "http_port": (int, "HTTP port, 0 = any free one"),
    "data_dir": (str, "data directory"),
    "namesrv": (str, "namesrv address(es)"),
    "etcd": (str, "etcd endpoints host:port[,host:port]"),
    "etcd_prefix": (str, "etcd key prefix"),
    "instance_id": (str, "this instance's id (empty: host name and a random suffix)"),
    "log_level": (str, "DEBUG, INFO, WARNING, ERROR"),
}
#: One flag: a field of COMMON_FLAGS by name, or (config field, type, help). The flag is
#: `--<field with dashes>`; its help names the variable and the default.
Flag = str | tuple[str, Callable[[str], Any], str]


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

    @property
    def env_prefix(self) -> str:
        """FERRY_TXN_CHECKER_ for ferry-txn-checker."""
        return self.prog.upper().replace("-", "_") + "_"

    def parse(self, argv: list[str] | None) -> Any:
        """The config from the environment, `argv`'s flags winning."""
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description)
        config_cls = getattr(self.from_env, "__self__", None)
        defaults = ({f.name: f.default for f in dataclasses.fields(config_cls)}
                    if dataclasses.is_dataclass(config_cls) else {})
        for flag in self.flags:
            field, typ, text = (flag, *COMMON_FLAGS[flag]) if isinstance(flag, str) else flag
            default = defaults.get(field, dataclasses.MISSING)
            if isinstance(default, bool):
                default = "true" if default else "false"
            shown = "" if default in (dataclasses.MISSING, "") else f", {default}"
            help_text = f"{text} ({self.env_prefix}{field.upper()}{shown})"
            name = "--" + field.replace("_", "-")
            if typ is bool:
                parser.add_argument(name, dest=field, default=None, help=help_text,
                                    action=argparse.BooleanOptionalAction)
            else:
                parser.add_argument(name, dest=field, type=typ, default=None, help=help_text)
        args = parser.parse_args(argv)
        try:
            return self.from_env(overrides=vars(args))
        except ValueError as exc:
            parser.error(str(exc))
            raise  # unreachable: parser.error exits

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
