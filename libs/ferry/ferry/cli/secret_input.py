"""Where `ferry user add` takes a new identity's secret from, never its command line.

A secret given as an argument shows in `ps` for as long as the command runs
and stays in the shell's history, so there is no `--secret S`: the secret is
generated (the default, printed once), or read from a file (`--secret-file
PATH`), or from standard input (`--secret-file -`): typed at a prompt without
echo, twice, when standard input is a terminal; its first line otherwise (a
pipe, a here-document, a secret manager's output).
"""
from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ferry.auth.credentials import MAX_SECRET_LENGTH, validate_secret
from ferry.errors import MalformedRequestError

#: `--secret-file` value meaning standard input (a prompt on a terminal).
STDIN = "-"
#: Why `--secret` is refused: the ways that keep a secret out of ps and the history.
SECRET_OPTION_REMOVED = (
    "--secret was removed: a secret on the command line shows in `ps` and stays in the shell "
    "history. Use --generate (the default: a random secret, printed once), --secret-file PATH, "
    "or --secret-file - (standard input; a prompt without echo on a terminal)")


class RefuseSecretOption(argparse.Action):
    """`--secret`: a usage error (exit 2) that points at the other ways, never echoing the value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        parser.error(SECRET_OPTION_REMOVED)


def read_secret(source: str, stdin: TextIO | None = None,
                prompt: Callable[[str], str] = getpass.getpass) -> str:
    """The secret in the file `source`, or from standard input when `source` is `-`.

    A file holds the secret on its one line (a trailing newline is dropped). Error
    messages never contain what was read.
    """
    stdin = sys.stdin if stdin is None else stdin
    if source == STDIN:
        if stdin.isatty():
            return _prompted(prompt)
        return _one_line(stdin.read(MAX_SECRET_LENGTH + 3), "standard input")
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read(MAX_SECRET_LENGTH + 3)
    except OSError as exc:
        raise MalformedRequestError(f"cannot read the secret file {source}: "
                                    f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise MalformedRequestError(f"the secret file {source} is not UTF-8 text") from None
    return _one_line(text, f"the secret file {source}")


def _prompted(prompt: Callable[[str], str]) -> str:
    secret = validate_secret(prompt("secret: "))
    if prompt("secret (again): ") != secret:
        raise MalformedRequestError("the two secrets typed differ")
    return secret


def _one_line(text: str, where: str) -> str:
    """`text` without one trailing newline; a secret on more than one line is refused (a
    file holding something else by mistake must not become a secret)."""
    line = text.removesuffix("\n").removesuffix("\r")
    if not line:
        raise MalformedRequestError(f"{where} is empty: it must hold the secret on one line")
    if "\n" in line or "\r" in line:
        raise MalformedRequestError(f"{where} must hold the secret on one line")
    try:
        return validate_secret(line)
    except MalformedRequestError as exc:
        raise MalformedRequestError(f"{where}: {exc}") from None
