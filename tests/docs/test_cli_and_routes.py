"""The `ferry` commands and the HTTP routes a page names exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, code_spans, lines, page_id, pages_text
from tests.docs.source import cli_parser, options, routes, subcommands

SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&", "#"}


# A command line: `ferry` first, after an optional prompt, environment assignments or a venv path.
CLI_START = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*/)?ferry\s+(?P<rest>.*)$")


def is_placeholder(token: str) -> bool:
    return token.startswith(("<", "{", "[", "...", "…")) or token.isupper() or "=" in token


def check_cli(line: str) -> str | None:
    """Why `ferry ...` (the text after `ferry`) is not a command of the CLI, or None."""
    tokens = line.replace("[", " ").replace("]", " ").split()
    if tokens and tokens[0].endswith(":"):
        return None  # "ferry source: option ..." is a message that names its program
    parsers = [cli_parser()]
    i = 0
    while i < len(tokens):
        token = tokens[i].strip("`'\"(),")
        if token in SHELL_STOP or token.startswith(("#", "|", ">")):
            break
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            known: dict[str, bool] = {}
            for p in parsers:
                known.update(options(p))
            if flag not in known and flag not in ("-", "--"):
                return f"no option {flag} in `ferry {' '.join(tokens[:i])}`"
            if known.get(flag) and "=" not in token:
                i += 1
            i += 1
            continue
        subs = subcommands(parsers[-1])
        if subs:
            if is_placeholder(token):
                return None
            alternatives = token.replace("\\|", "|").split("|")  # a table's `get\|key\|time`
            if len(alternatives) > 1:
                missing = [a for a in alternatives if a not in subs]
                return f"no command(s) {missing} under `ferry {' '.join(tokens[:i])}`" \
                    if missing else None
            if token not in subs:
                where = " ".join(tokens[:i]) or "(top level)"
                return f"no command {token!r} under `ferry {where}`; known: {sorted(subs)}"
            parsers.append(subs[token])
        i += 1
    return None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_cli_commands_exist(page: Path) -> None:
    bad = []
    for number, span in code_spans(page):
        m = CLI_START.match(span)
        if m:
            why = check_cli(m.group("rest"))
            if why:
                bad.append(f"{page_id(page)}:{number}: {why}")
    assert not bad, "commands the ferry CLI does not have:\n" + "\n".join(bad)


# An API route or a console page, as a page writes it (placeholders as {x}, <x> or :x).
ROUTE = re.compile(r"(?<![\w.-])/(?:v1|console)/[A-Za-z0-9_{}<>%.:*-]*(?:/[A-Za-z0-9_{}<>%.:*-]*)*")


def is_param(segment: str) -> bool:
    return segment.startswith(("{", "<", ":")) or segment in ("*", "…", "...")


def route_known(mention: str) -> bool:
    mention = mention.removesuffix("**").rstrip(".,:;")
    open_ended = mention.endswith(("/", "*", "..."))
    segments = [s for s in mention.strip("/").split("/") if s not in ("*", "...", "…")]
    if len(segments) < 2:
        return True  # "/v1/" alone names the API, not a route
    for route in routes():
        if len(route) < len(segments) or (len(route) != len(segments) and not open_ended):
            continue
        if all(d == r or r.startswith("{") or (is_param(d) and r.startswith("{"))
               for d, r in zip(segments, route, strict=False)):
            return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_http_routes_exist(page: Path) -> None:
    bad = []
    for number, line in lines(page):
        for m in ROUTE.finditer(line):
            if not route_known(m.group(0).split("?", 1)[0]):
                bad.append(f"{page_id(page)}:{number}: {m.group(0)}")
    assert not bad, "routes no service serves:\n" + "\n".join(bad)


def test_every_command_is_documented() -> None:
    """The other direction: every command and action of the `ferry` CLI is named on some
    page (`ferry group lag`, or in a listing such as `ferry topic list | describe NAME`)."""
    text = "\n".join(pages_text(page) for page in PAGES)
    missing = []
    for command, parser in subcommands(cli_parser()).items():
        actions = subcommands(parser) or {"": parser}
        for action in actions:
            pattern = rf"ferry (?:\[[^\]\n]*\] )?{re.escape(command)}\b"
            if action:
                pattern += rf"[^\n`]*\b{re.escape(action)}\b"
            if not re.search(pattern, text):
                missing.append(f"ferry {command} {action}".strip())
    assert not missing, "commands no page names:\n" + "\n".join(missing)


def test_every_route_is_documented() -> None:
    """The other direction: every `/v1/...` route and console page a service serves is
    named on some page."""
    mentioned = {tuple(m.group(0).split("?", 1)[0].removesuffix("**").rstrip(".,:;")
                       .strip("/").split("/"))
                 for page in PAGES for _, line in lines(page) for m in ROUTE.finditer(line)}
    missing = ["/" + "/".join(route) for route in sorted(routes())
               if not any(len(m) == len(route) and all(d == r or r.startswith("{")
                                                       for d, r in zip(m, route, strict=True))
                          for m in mentioned)]
    assert not missing, "routes no page names:\n" + "\n".join(missing)
