"""SQL92 selectors: `Sql` (what a user writes), `compile_sql` (parse once) and `SqlFilter`.

`compile_sql` is the one door from text to a filter. Whatever the text, it
returns a `SqlFilter` or raises `InvalidFilterError`: lark's errors carry the
line, column and the expected tokens in words; anything else that goes wrong
(too long, too deep, an exhausted stack) is mapped too, because the broker
compiles whatever a client sends. Compiled filters are cached by text.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lark import Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ferry.errors import InvalidFilterError
from ferry.filter.compiler import MAX_NESTING_DEPTH, compile_tree
from ferry.filter.evaluators import Evaluator, Fetch
from ferry.filter.grammar import parser, words_for

#: Longest selector accepted, in characters.
MAX_SQL_CHARS = 4096
#: Compiled selectors kept by `compile_sql` (a broker sees few distinct ones).
MAX_CACHED_FILTERS = 1024
#: The names that stand for the message's tag string and keys string, not for properties.
TAGS_NAME = "TAGS"
KEYS_NAME = "KEYS"

__all__ = ["MAX_CACHED_FILTERS", "MAX_NESTING_DEPTH", "MAX_SQL_CHARS", "Sql", "SqlFilter",
           "compile_sql"]


@dataclass(frozen=True, slots=True)
class Sql:
    """A SQL92 subscription as a user writes it: `Sql("amount > 100")`.

    Not validated here; the consumer compiles it at start() (`compile_sql`).
    """

    expression: str


@dataclass(frozen=True, slots=True, eq=False)
class SqlFilter:
    """A compiled selector: `evaluate` is True only when the expression is TRUE.

    `names` are the identifiers it reads (properties, `TAGS`, `KEYS`). `tree`
    is the parse tree, kept so that `record_matcher` can compile the same
    selector with fetchers that read a stored record. Equal and hashed by
    expression.
    """

    expression: str
    names: tuple[str, ...]
    tree: Tree = field(repr=False)
    _fn: Evaluator = field(repr=False)

    def evaluate(self, props: Mapping[str, str], tags: str = "", keys: str = "") -> bool:
        """Does a message with these user properties, tag string and keys match?

        A missing property, an empty tag string and empty keys are NULL. Never raises.
        """
        try:
            return self._fn((props, tags, keys)) is True
        except Exception:  # noqa: BLE001 - only a foreign Mapping could raise; that is no match
            return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SqlFilter) and other.expression == self.expression

    def __hash__(self) -> int:
        return hash(self.expression)


def compile_sql(text: str) -> SqlFilter:
    """Parse and compile a selector (cached); raises InvalidFilterError and nothing else."""
    if not isinstance(text, str):
        raise InvalidFilterError(f"a SQL expression must be text, not {type(text).__name__}")
    if len(text) > MAX_SQL_CHARS:
        raise InvalidFilterError(f"the SQL expression is {len(text)} characters long; "
                                 f"the limit is {MAX_SQL_CHARS}")
    refused = _REFUSED.get(text)
    if refused is not None:  # a client repeating a bad selector costs a dict lookup, not a parse
        raise InvalidFilterError(refused[0], line=refused[1], column=refused[2],
                                 expected=refused[3])
    try:
        return _compile_cached(text)
    except InvalidFilterError as err:
        if len(_REFUSED) >= MAX_CACHED_FILTERS:
            _REFUSED.clear()
        _REFUSED[text] = (str(err), err.line, err.column, err.expected)
        raise


#: Selectors refused lately, by text: (message, line, column, expected) to raise again.
_REFUSED: dict[str, tuple[str, int, int, tuple[str, ...]]] = {}


@lru_cache(maxsize=MAX_CACHED_FILTERS)
def _compile_cached(text: str) -> SqlFilter:
    try:
        tree = parser().parse(text)
        compiled = compile_tree(tree, _mapping_fetch)
    except InvalidFilterError:
        raise
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    except RecursionError:
        raise InvalidFilterError("the SQL expression nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - the broker compiles any client's text: never crash
        raise InvalidFilterError(f"the SQL expression cannot be compiled: {exc}") from None
    return SqlFilter(text, compiled.names, tree, compiled.evaluate)


def _mapping_fetch(name: str) -> Fetch:
    """A fetch over `SqlFilter.evaluate`'s context (props, tags, keys); "" tags/keys are NULL."""
    if name == TAGS_NAME:
        return _tags_of
    if name == KEYS_NAME:
        return _keys_of
    return lambda ctx: ctx[0].get(name)


def _tags_of(ctx: Any) -> str | None:
    return ctx[1] or None


def _keys_of(ctx: Any) -> str | None:
    return ctx[2] or None


def _syntax_error(text: str, exc: UnexpectedInput) -> InvalidFilterError:
    """InvalidFilterError for a lark syntax error: where, what was found, what was expected."""
    line, column = int(getattr(exc, "line", 0) or 0), int(getattr(exc, "column", 0) or 0)
    if isinstance(exc, UnexpectedToken):
        expected = words_for(exc.accepts or exc.expected)
        if exc.token.type == "$END":
            found = "the end of the expression"
            line, column = _end_position(text)
        else:
            found = repr(str(exc.token))
    elif isinstance(exc, UnexpectedCharacters):
        pos = int(exc.pos_in_stream or 0)
        found = repr(text[pos]) if 0 <= pos < len(text) else "?"
        expected = _expected_before(text[:pos])
    else:
        found, expected = "something unexpected", ()
    if line <= 0:
        line, column = _end_position(text)
    wanted = f"; expected {_either(expected)}" if expected else ""
    return InvalidFilterError(
        f"invalid SQL expression at line {line}, column {column}: found {found}{wanted}",
        line=line, column=column, expected=expected)


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just after the last character (where an early end is reported)."""
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _expected_before(prefix: str) -> tuple[str, ...]:
    """What the parser could take after `prefix` (for a character no token starts with)."""
    try:
        interactive = parser().parse_interactive(prefix)
        interactive.exhaust_lexer()
        return words_for(interactive.accepts())
    except Exception:  # noqa: BLE001 - only a better message is lost
        return ()


def _either(words: tuple[str, ...]) -> str:
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]
