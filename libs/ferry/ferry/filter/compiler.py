"""Turn a parsed selector into one Python closure: compiled once, called per message.

The tree lark builds is walked once here; the result is a closure over the
closures of `ferry.filter.evaluators`, with every literal folded in. What the
grammar accepts but has no meaning (a number or a string used as a
condition) is refused here with its position.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lark import Token, Tree

from ferry.errors import InvalidFilterError
from ferry.filter import evaluators as ev
from ferry.filter.evaluators import Evaluator, Fetch
from ferry.filter.values import Value

#: How deep operators may nest (NOT NOT ..., AND inside OR inside AND in parentheses):
#: bounds the compiler's recursion and the evaluator's call depth well below Python's limit.
MAX_NESTING_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled selector: its evaluator and the names it reads (properties, TAGS, KEYS)."""

    evaluate: Evaluator
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Operand:
    """One side of a predicate: a property (read by `fetch`) or a literal (`value`; None = NULL)."""

    fetch: Fetch | None
    value: Value


def compile_tree(tree: Tree | Token, fetcher: Callable[[str], Fetch]) -> Compiled:
    """Compile a parse tree, reading each property with `fetcher(name)`'s closure.

    Raises InvalidFilterError for what the grammar lets through but means nothing.
    """
    compiler = _Compiler(fetcher)
    fn = compiler.node(tree, 1)
    return Compiled(fn, tuple(compiler.names))


def _error_at(token: Token, message: str) -> InvalidFilterError:
    line, column = token.line or 0, token.column or 0
    return InvalidFilterError(f"{message} at line {line}, column {column}", line=line,
                              column=column)


def _literal(token: Token) -> Value:
    kind = token.type
    if kind == "STRING":
        return str(token)[1:-1].replace("''", "'")
    if kind == "NUMBER":
        return float(token) if "." in token else int(token)
    if kind == "TRUE":
        return True
    if kind == "FALSE":
        return False
    return None  # NULL


_TEXT_TESTS: dict[str, tuple[Callable[[str, str], bool], bool]] = {
    # rule -> (test(property text, literal), negated)
    "contains": (lambda s, c: c in s, False),
    "not_contains": (lambda s, c: c in s, True),
    "startswith": (str.startswith, False),
    "not_startswith": (str.startswith, True),
    "endswith": (str.endswith, False),
    "not_endswith": (str.endswith, True),
}


class _Compiler:
    """One compilation: how properties are read, and the names met so far (one fetch each)."""

    def __init__(self, fetcher: Callable[[str], Fetch]) -> None:
        self.fetcher = fetcher
        self.names: dict[str, Fetch] = {}

    def node(self, tree: Tree | Token, depth: int) -> Evaluator:
        if depth > MAX_NESTING_DEPTH:
            token = _first_token(tree)
            raise _error_at(token, f"the expression nests deeper than {MAX_NESTING_DEPTH} levels")
        if isinstance(tree, Token):  # cannot happen with this grammar; kept total
            return self.truth(tree)
        rule = str(tree.data)
        kids = tree.children
        if rule == "or_expr":
            return ev.or_([self.node(k, depth + 1) for k in kids])
        if rule == "and_expr":
            return ev.and_([self.node(k, depth + 1) for k in kids])
        if rule == "not_":
            return ev.not_(self.node(kids[0], depth + 1))
        return self.predicate(rule, kids)

    def predicate(self, rule: str, kids: list) -> Evaluator:
        if rule == "truth":
            return self.truth(kids[0])
        left = self.operand(kids[0])
        if rule == "compare":
            return self.compare(str(kids[1]), left, self.operand(kids[2]))
        if rule in ("between", "not_between"):
            low, high = self.operand(kids[1]), self.operand(kids[2])
            if left.fetch is not None and _is_number(low.value) and _is_number(high.value):
                fn = ev.property_between(left.fetch, low.value, high.value)  # type: ignore[arg-type]
            else:
                fn = ev.and_([self.compare(">=", left, low), self.compare("<=", left, high)])
            return ev.not_(fn) if rule == "not_between" else fn
        if rule in ("in_", "not_in"):
            fn = self.in_list(left, [self.operand(k) for k in kids[1:]])
            return ev.not_(fn) if rule == "not_in" else fn
        if rule in ("is_null", "is_not_null"):
            null = rule == "is_null"
            if left.fetch is not None:
                return ev.property_is_null(left.fetch, null)
            return ev.const((left.value is None) is null)
        if rule in _TEXT_TESTS:
            test, negated = _TEXT_TESTS[rule]
            fn = self.text_test(left, test, _literal(kids[1]))
            return ev.not_(fn) if negated else fn
        raise InvalidFilterError(f"unsupported expression {rule!r}")

    def operand(self, token: Token) -> _Operand:
        if token.type == "NAME":
            name = str(token)
            fetch = self.names.get(name)
            if fetch is None:
                fetch = self.names[name] = self.fetcher(name)
            return _Operand(fetch, None)
        return _Operand(None, _literal(token))

    def truth(self, token: Token) -> Evaluator:
        """An operand used as a condition: TRUE/FALSE/NULL or a property holding 'true'/'false'."""
        operand = self.operand(token)
        if operand.fetch is not None:
            return ev.property_truth(operand.fetch)
        if operand.value is None or isinstance(operand.value, bool):
            return ev.const(operand.value)
        raise _error_at(token, f"{token!s} is not a condition (compare it with something)")

    def compare(self, op: str, left: _Operand, right: _Operand) -> Evaluator:
        if left.fetch is not None and right.fetch is not None:
            return ev.properties_compare(op, left.fetch, right.fetch)
        if left.fetch is not None:
            return ev.property_vs_literal(op, left.fetch, right.value)
        if right.fetch is not None:
            return ev.property_vs_literal(ev.FLIPPED[op], right.fetch, left.value)
        return ev.const(ev.compare_literals(op, left.value, right.value))

    def in_list(self, left: _Operand, items: list[_Operand]) -> Evaluator:
        values = [item.value for item in items]
        texts = [v for v in values if isinstance(v, str)]
        has_null = any(v is None for v in values)
        if left.fetch is not None and len(texts) + has_null == len(values):
            return ev.property_in_strings(left.fetch, frozenset(texts), has_null)
        return ev.or_([self.compare("=", left, item) for item in items]) if len(items) > 1 \
            else self.compare("=", left, items[0])

    def text_test(self, left: _Operand, test: Callable[[str, str], bool],
                  literal: Value) -> Evaluator:
        assert isinstance(literal, str)  # the grammar only takes a string here
        if left.fetch is not None:
            return ev.property_text_test(left.fetch, lambda s: test(s, literal))
        if isinstance(left.value, str):
            return ev.const(test(left.value, literal))
        return ev.const(None)  # NULL, a number or a boolean is not text


def _is_number(value: Value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _first_token(tree: Tree | Token) -> Token:
    """The leftmost token of a subtree (where an error about it points)."""
    node: Tree | Token = tree
    while isinstance(node, Tree) and node.children:
        node = node.children[0]
    return node if isinstance(node, Token) else Token("NAME", "", line=0, column=0)
