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
from ferry.filter.evaluators import Evaluator
from ferry.filter.values import Value

#: How deep operators may nest (NOT NOT ..., AND inside OR inside AND in parentheses):
#: bounds the compiler's recursion and the evaluator's call depth well below Python's limit.
MAX_NESTING_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled selector: its evaluator and the property names it reads, by index."""

    evaluate: Evaluator
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Operand:
    """One side of a predicate: a property (`index` into v) or a literal (`value`; None = NULL)."""

    index: int
    value: Value
    token: Token

    @property
    def is_property(self) -> bool:
        return self.index >= 0


def compile_tree(tree: Tree | Token) -> Compiled:
    """Compile a parse tree; raises InvalidFilterError for what the grammar lets through."""
    compiler = _Compiler()
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
    """One compilation: the property names met so far (name -> index into v)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}

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
            fn = ev.and_([self.compare(">=", left, low), self.compare("<=", left, high)])
            return ev.not_(fn) if rule == "not_between" else fn
        if rule in ("in_", "not_in"):
            fn = self.in_list(left, [self.operand(k) for k in kids[1:]])
            return ev.not_(fn) if rule == "not_in" else fn
        if rule in ("is_null", "is_not_null"):
            null = rule == "is_null"
            if left.is_property:
                return ev.property_is_null(left.index, null)
            return ev.const((left.value is None) is null)
        if rule in _TEXT_TESTS:
            test, negated = _TEXT_TESTS[rule]
            fn = self.text_test(left, test, _literal(kids[1]))
            return ev.not_(fn) if negated else fn
        raise InvalidFilterError(f"unsupported expression {rule!r}")

    def operand(self, token: Token) -> _Operand:
        if token.type == "NAME":
            name = str(token)
            index = self.names.setdefault(name, len(self.names))
            return _Operand(index, None, token)
        return _Operand(-1, _literal(token), token)

    def truth(self, token: Token) -> Evaluator:
        """An operand used as a condition: TRUE/FALSE/NULL or a property holding 'true'/'false'."""
        operand = self.operand(token)
        if operand.is_property:
            return ev.property_truth(operand.index)
        if operand.value is None or isinstance(operand.value, bool):
            return ev.const(operand.value)
        raise _error_at(token, f"{token!s} is not a condition (compare it with something)")

    def compare(self, op: str, left: _Operand, right: _Operand) -> Evaluator:
        if left.is_property and right.is_property:
            return ev.properties_compare(op, left.index, right.index)
        if left.is_property:
            return ev.property_vs_literal(op, left.index, right.value)
        if right.is_property:
            return ev.property_vs_literal(ev.FLIPPED[op], right.index, left.value)
        return ev.const(ev.compare_literals(op, left.value, right.value))

    def in_list(self, left: _Operand, items: list[_Operand]) -> Evaluator:
        values = [item.value for item in items]
        texts = [v for v in values if isinstance(v, str)]
        has_null = any(v is None for v in values)
        if left.is_property and len(texts) + has_null == len(values):
            return ev.property_in_strings(left.index, frozenset(texts), has_null)
        return ev.or_([self.compare("=", left, item) for item in items]) if len(items) > 1 \
            else self.compare("=", left, items[0])

    def text_test(self, left: _Operand, test: Callable[[str, str], bool],
                  literal: Value) -> Evaluator:
        assert isinstance(literal, str)  # the grammar only takes a string here
        if left.is_property:
            return ev.property_text_test(left.index, lambda s: test(s, literal))
        if isinstance(left.value, str):
            return ev.const(test(left.value, literal))
        return ev.const(None)  # NULL, a number or a boolean is not text


def _first_token(tree: Tree | Token) -> Token:
    """The leftmost token of a subtree (where an error about it points)."""
    node: Tree | Token = tree
    while isinstance(node, Tree) and node.children:
        node = node.children[0]
    return node if isinstance(node, Token) else Token("NAME", "", line=0, column=0)
